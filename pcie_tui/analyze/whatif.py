"""What would a faster (or narrower) link buy? Amdahl's law on the link's share of time.

For each phase of a recording and each GPU, ``f`` is the share of the phase's
time the link needed at full rate to move the bytes it moved (time-weighted
mean of link use as a fraction of the link's achievable ceiling). A link
``r`` times faster (``r = C_new / C_old``) turns that time into ``f / r``::

    T_new / T_old = (1 - f) + f / r          speed-up = 1 / that

This treats link time as never hidden behind compute, so it is an upper bound
on the speed-up (r > 1) and on the slow-down (r < 1): overlapped transfers
change less. Latency-bound traffic (batch-1 decode all-reduces) barely shows
in ``f`` and barely changes with bandwidth, which the formula reproduces.
docs/whatif.md has the derivation and the checks against published figures.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from pcie_tui.analyze.attribution import gpu_ceilings
from pcie_tui.analyze.series import series_array, series_means, series_weights
from pcie_tui.analyze.session import SessionAnalyzer
from pcie_tui.analyze.verdict import MISS_PCIE
from pcie_tui.core.ceiling import DEFAULT_PINNED_FRACTION
from pcie_tui.core.model import SessionHeader, pcie_capacity_Bps
from pcie_tui.core.units import pct
from pcie_tui.core.units import rate as fmt_rate
from pcie_tui.core.vocab import BOUND_WORDS

# Per direction, theoretical: NVLink 3 bridge 4 links x 14.0625 GB/s = 56.25 GB/s;
# NVLink 4 on H100 SXM 18 links x 25 GB/s = 450 GB/s (docs/whatif.md).
NVLINK_BRIDGES_Bps = {
    "NVLink 3 bridge (2x RTX 3090 / A6000 class)": 56.25e9,
    "NVLink 4 (H100 SXM)": 450e9,
}


def time_ratio(f: float, r: float) -> float:
    """T_new / T_old when a share ``f`` of the time scales by 1/r (Amdahl)."""
    if r <= 0:
        raise ValueError("bandwidth ratio must be positive")
    f = min(max(f, 0.0), 1.0)
    return (1.0 - f) + f / r


def speedup(f: float, r: float) -> float:
    """Upper bound on the speed-up (r > 1) or slow-down (r < 1, result < 1) of the phase."""
    return 1.0 / time_ratio(f, r)


NVLINK_NOTE = "upper bound assuming all link traffic was GPU<->GPU peer traffic; host<->GPU traffic stays on PCIe"


def scenarios(gen: int | None, width: int | None, n_gpus: int = 1) -> list[tuple[str, float]]:
    """(name, target capacity bytes/s) of the links people choose between, faster and slower than
    a Gen ``gen`` x ``width`` link (the one the recording has is left out).

    NVLink only carries GPU<->GPU (peer) traffic, so its scenario is offered only when the
    recording has two or more GPUs; host<->device copies never move to it.
    """
    out: list[tuple[str, float]] = []
    cur = pcie_capacity_Bps(gen, width)
    if cur is None or gen is None or width is None:
        return out
    named = [
        ("Gen6 x16", 6, 16),
        ("Gen5 x16", 5, 16),
        ("Gen4 x16", 4, 16),
        (f"x8/x8: Gen{min(gen, 6)} x8 per GPU (two cards sharing the CPU's x16)", min(gen, 6), 8),
        ("Gen4 x8", 4, 8),
        ("x16 + chipset x4: Gen4 x4 behind the chipset (shared uplink)", 4, 4),
    ]
    seen = set()
    for name, g, w in named:
        if (g, w) == (gen, width) or (g, w) in seen:
            continue
        seen.add((g, w))
        out.append((name, float(pcie_capacity_Bps(g, w) or 0)))
    for name, bps in NVLINK_BRIDGES_Bps.items():
        if n_gpus >= 2 and bps > cur:
            out.append((f"PCIe -> {name} (peer traffic only)", bps))
    return out


def link_shares(header: SessionHeader, analyzer: SessionAnalyzer, index: int) -> dict[str, Any]:
    """Per phase: duration, share with a link verdict, and the link's busy share ``f``."""
    ser = analyzer.series.get(index)
    if ser is None or not ser.t:
        return {}
    # The series' link share is already over the one ceiling (calibrated, default or observed).
    ceiling = gpu_ceilings(analyzer, index).pinned
    verdict_share = {p: v["verdict_share"]["link"] for p, v in analyzer.phase_summary(index).items()}
    # Each tick stands for the interval before it, with its phase and reading; holes in the
    # recording count one interval, as in the attribution (series.tick_weights; a long session's summarised
    # rows, the seconds of their ticks: analyze/retire.py).
    dt = series_weights(ser)
    link = series_means(ser, "link")  # NaN: no reading
    # A tick with one PCIe direction unreported has no link busy share: the other may have been full.
    pcie_missing = (np.nan_to_num(series_array(ser, "missing")).astype(np.int64) & MISS_PCIE) > 0
    phases = ser.phase.mapped(lambda p: p or "unlabelled", object)
    ok = dt > 0
    known = ok & ~np.isnan(link) & ~pcie_missing
    busy = np.where(known, dt * np.minimum(1.0, np.nan_to_num(link)), 0.0)
    acc: dict[str, list[float]] = {}  # phase -> [seconds, seconds with a reading, busy seconds]
    for phase in dict.fromkeys(phases[ok].tolist()):
        m = phases == phase
        acc[phase] = [float(dt[m & ok].sum()), float(dt[m & known].sum()), float(busy[m].sum())]
    out: dict[str, Any] = {}
    for phase, (secs, known_s, busy_s) in acc.items():
        out[phase] = {
            "duration_s": secs,
            "link_bound_share": verdict_share.get(phase),
            "link_busy_share": (busy_s / known_s) if known_s > 0 else None,
            "basis": f"{ceiling.detail} ceiling",
        }
    return out


# A phase this much transfer-bound on staged copies gets a note on the "infinitely fast link" row.
STAGED_NOTE_SHARE = 0.3
# What the PCIe counter of another link would read saturated: the same share of its theoretical rate
# as the default ceiling (pcie_tui.core.ceiling): the rate a staged stream would have to fit under.
COUNTER_AT_SATURATION = DEFAULT_PINNED_FRACTION


def _staged_transfers(phases: dict[str, Any], findings: dict[str, Any]) -> dict[str, tuple[float, float, float]]:
    """Per phase with transfer-bound time on staged (pageable) copies: (its share of the phase, its
    rate, the link busy share of the rest). A faster link does not speed staged copies up; a link
    slower than their rate slows them down."""
    out: dict[str, tuple[float, float, float]] = {}
    for ph, p in phases.items():
        f = findings.get(ph)
        busy = p.get("link_busy_share")
        if (
            not f
            or busy is None
            or not f.get("transfer_staged")
            or not f.get("transfer_Bps")
            or not f.get("transfer_s")
        ):
            continue
        dur = f["duration_s"] or 0.0
        if dur <= 0:
            continue
        t_f = min(1.0, f["transfer_s"] / dur)
        pinned = f["ceilings"]["pinned_Bps"] or 0.0
        own = t_f * f["transfer_Bps"] / pinned if pinned else 0.0  # what those ticks added to the busy share
        out[ph] = (t_f, f["transfer_Bps"], max(0.0, busy - own))
    return out


def _row(
    name: str, kind: str, target: float | None, r: float | None, phases: dict[str, Any], ratio: Any, basis: str
) -> dict[str, Any]:
    """One scenario: ``ratio(phase, entry)`` gives the phase's T_new/T_old, or None when unknown."""
    per_phase: dict[str, dict[str, float | None] | None] = {}
    total = new_total = unpriced = 0.0
    for ph, p in phases.items():
        tr = ratio(ph, p)
        if tr is None:  # no link readings in this phase: left out of the total, and said so
            per_phase[ph] = None
            unpriced += p["duration_s"]
            continue
        total += p["duration_s"]
        per_phase[ph] = {
            "time_ratio": tr,
            "speedup": 1.0 / tr if tr > 0 else None,
            "time_s": p["duration_s"],
            "new_time_s": p["duration_s"] * tr,
            "time_change_s": p["duration_s"] * (tr - 1.0),
        }
        new_total += p["duration_s"] * tr
    overall = (new_total / total) if total > 0 else None
    return {
        "scenario": name,
        "kind": kind,
        "target_Bps": target,  # None: unbounded
        "bandwidth_ratio": r,
        "phases": per_phase,
        "time_ratio": overall,
        "speedup": (1.0 / overall) if overall else None,
        # Time (+ = slower) and tokens/s (- = slower), both bounds.
        "time_change_pct": (overall - 1.0) * 100 if overall else None,
        "throughput_change_pct": ((1.0 / overall) - 1.0) * 100 if overall else None,
        # PCIe counters do not split host from peer bytes per tick.
        "note": NVLINK_NOTE if "NVLink" in name else None,
        "basis": basis,
        "unpriced_s": unpriced,  # seconds of phases without link readings, left out of the total
    }


def whatif_report(
    header: SessionHeader, analyzer: SessionAnalyzer, findings: dict[int, list[dict[str, Any]]] | None = None
) -> dict[str, Any]:
    """Per GPU and phase: link shares and upper-bound speed-ups / slow-downs for other links, both ways.

    ``findings`` (:func:`pcie_tui.analyze.attribution.phase_findings`) adds "pinned instead of
    pageable" where a phase was transfer-bound on pageable memory.
    """
    gpus = []
    any_staged = False
    for index in sorted(analyzer.series):
        gpu, staged = _gpu_whatif(header, analyzer, index, (findings or {}).get(index, []))
        gpus.append(gpu)
        any_staged = any_staged or staged
    formula = "T_new/T_old = (1 - f) + f / r; f = link busy share, r = new/old bandwidth; upper bound (no overlap)"
    if any_staged:
        # The rule the rows follow where a phase waited on pageable copies (docs/whatif.md, "Staged copies").
        formula += (
            "; time waiting on staged (pageable) copies, s, keeps its own rate: s x max(1, rate / new link's"
            f" reachable rate) in place of its share of f / r (a link not measured here reaches"
            f" {COUNTER_AT_SATURATION:.2f} x its theoretical rate, the rule of this link's default ceiling)"
        )
    return {"formula": formula, "gpus": gpus}


def _gpu_whatif(
    header: SessionHeader, analyzer: SessionAnalyzer, index: int, findings: list[dict[str, Any]]
) -> tuple[dict[str, Any], bool]:
    """One GPU's what-if entry (its link, phases and scenario rows), and whether any of its phases
    waited on staged (pageable) copies."""
    info = header.gpu(index)
    gen = info.link.max_gen or info.link.gen if info else None
    width = info.link.max_width or info.link.width if info else None
    cur = pcie_capacity_Bps(gen, width)
    phases = link_shares(header, analyzer, index)
    busy_basis = (
        f"link busy share per phase against the {gpu_ceilings(analyzer, index).pinned.detail} ceiling"
        "; link time never hidden behind compute (upper bound both ways)"
    )
    by_phase = {f["phase"]: f for f in findings}
    staged = _staged_transfers(phases, by_phase)
    if staged:
        busy_basis += "; transfer-bound time on pageable (staged) memory runs at its own rate, capped by the new link"
    n_gpus = max(len(header.gpus), len(analyzer.series))
    rows = [
        _row(name, "link", target, target / cur if cur else None, phases, _link_ratio(cur, target, staged), busy_basis)
        for name, target in scenarios(gen, width, n_gpus)
    ]
    pinned = {ph: f["whatif_pinned"] for ph, f in by_phase.items() if f.get("whatif_pinned") and f["bound_s"] > 0}
    if pinned:
        rows.append(_pinned_row(by_phase, phases, pinned))
    rows.append(_infinite_row(phases, staged, pinned, busy_basis))
    gpu = {
        "index": index,
        "name": info.name if info else None,
        "link": {"gen": gen, "width": width, "capacity_Bps": cur},
        "phases": phases,
        "duration_s": sum(p["duration_s"] for p in phases.values()),
        "scenarios": rows,
    }
    return gpu, bool(staged)


def _link_ratio(cur: float | None, target: float, staged: dict[str, tuple[float, float, float]]) -> Any:
    """``ratio(phase, entry)`` for a link of ``target`` bytes/s in place of ``cur``: Amdahl on the link
    busy share, with staged (pageable) copies at their own rate, capped by the new link."""
    r = target / cur if cur else None

    def link_ratio(ph: str, p: dict[str, Any]) -> float | None:
        f = p["link_busy_share"]
        if f is None or r is None:
            return None
        st = staged.get(ph)
        if st is None:
            return time_ratio(f, r)
        t_f, rate, f_other = st
        achievable = target * COUNTER_AT_SATURATION
        return (1.0 - f_other - t_f) + f_other / r + t_f * max(1.0, rate / achievable)

    return link_ratio


def _pinned_row(by_phase: dict[str, Any], phases: dict[str, Any], pinned: dict[str, Any]) -> dict[str, Any]:
    """The "pinned instead of pageable host memory" scenario, from the findings' pinned predictions."""
    target = next(iter(by_phase.values()))["ceilings"]["pinned_Bps"]

    def pin_ratio(ph: str, p: dict[str, Any]) -> float:
        w = pinned.get(ph)
        return w["phase_s_at_best"] / w["phase_s"] if w and w["phase_s"] > 0 else 1.0

    return _row(
        "pinned instead of pageable host memory",
        "pinned",
        target,
        None,
        phases,
        pin_ratio,
        "bytes moved while transfer-bound, at the pinned ceiling, hidden behind the rest of the phase "
        "(at best; the report's attribution also gives the no-overlap time)",
    )


def _infinite_row(
    phases: dict[str, Any], staged: dict[str, tuple[float, float, float]], pinned: dict[str, Any], basis: str
) -> dict[str, Any]:
    """The "infinitely fast link" scenario, with a note where staged copies hold a phase anyway."""

    def infinite(ph: str, p: dict[str, Any]) -> float | None:
        f = p["link_busy_share"]
        if f is None:
            return None
        st = staged.get(ph)
        return 1.0 - (st[2] if st is not None else min(max(f, 0.0), 1.0))

    row = _row("infinitely fast link", "infinite", None, None, phases, infinite, basis)
    held = [f"{ph} {st[0]:.0%}" for ph, st in staged.items() if st[0] >= STAGED_NOTE_SHARE and ph in pinned]
    if held:
        # Why the link scenarios barely move a phase the headline says a fix would shorten.
        row["note"] = (
            f"waiting on staged (pageable) copies: {', '.join(held)} of the phase; no link speed changes "
            "those, pinned host memory does (the pinned scenario)"
        )
    return row


def _signed(v: float) -> str:
    """A percentage change with its sign. A change under 0.05 % keeps its direction with two
    decimals ("-0.04%": a faster link never reads "+0.0%"); one under 0.005 % is "±0.0%"."""
    if round(v, 1) != 0:
        return f"{v:+.1f}%"
    if round(v, 2) != 0:
        return f"{v:+.2f}%"
    return "±0.0%"


def render_whatif(rep: dict[str, Any]) -> str:
    if not rep["gpus"]:
        return ""  # no GPU readings (an engine-only recording): nothing to price
    lines = ["What would another link buy? Upper bounds from " + rep["formula"]]
    for g in rep["gpus"]:
        link = g["link"]
        cap = link["capacity_Bps"]
        lines.append(
            f"GPU{g['index']} {g['name'] or ''}: Gen{link['gen']} x{link['width']}"
            + (f" ({fmt_rate(cap)} per direction)" if cap else " (link unknown)")
        )
        for ph, p in g["phases"].items():
            lines.append(
                f"  {ph:<14} {p['duration_s']:7.1f} s  link busy {_pct(p['link_busy_share'])}  "
                f"{BOUND_WORDS['link']} {_pct(p['link_bound_share'] if p['link_busy_share'] is not None else None)}  "
                f"({p['basis']})"
            )
        for s in g["scenarios"]:
            if s["time_ratio"] is None:
                lines.append(f"  {s['scenario']}: n/a (no link readings in both directions)")
                continue
            how = (
                f"x{s['bandwidth_ratio']:.2f} bandwidth"
                if s.get("bandwidth_ratio")
                else f"at {fmt_rate(s['target_Bps'])}"
                if s.get("target_Bps")
                else "no link time at all"
            )
            left = f" (left out: {s['unpriced_s']:.1f} s without link readings)" if s.get("unpriced_s") else ""
            lines.append(
                f"  {s['scenario']} ({how}): time {_signed(s['time_change_pct'])}, "
                f"throughput {_signed(s['throughput_change_pct'])} at most{left}"
            )
            if s.get("note"):
                lines.append(f"      ({s['note']})")
            moved = [
                f"{ph} {v['time_s']:.1f} -> {v['new_time_s']:.1f} s ({v['time_ratio'] * 100 - 100:+.0f}%)"
                for ph, v in s["phases"].items()
                if v is not None and abs(v["time_ratio"] - 1) >= 0.005
            ]
            if moved:
                lines.append("      by phase (time): " + ", ".join(moved))
    return "\n".join(lines)


def _pct(v: float | None) -> str:
    """A share in the what-if table's column, one decimal, 5 wide: " 12.5%", "  n/a"."""
    return pct(v, space=False, digits=1).rjust(5)
