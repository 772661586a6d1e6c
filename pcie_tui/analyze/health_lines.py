"""The heat and link-health sections in words: the lines ``report`` prints (from ``report --json``'s
``heat`` and ``link_health`` objects, so the text and the JSON cannot disagree)."""

from __future__ import annotations

from typing import Any

from pcie_tui.core import units
from pcie_tui.core.units import NA

MAX_STRETCHES = 12  # the text lists this many stretches (the longest); --json has them all


def _pct(v: float | None) -> str:
    return units.pct(v, space=False)


def _mhz(v: float | None) -> str:
    return f"{v:,.0f} MHz" if v is not None else NA


def _pair(d: dict[str, Any], fmt: Any, unit: str = "") -> str | None:
    a, b = d.get("throttled"), d.get("unthrottled")
    if a is None and b is None:
        return None
    return f"{_with(fmt, a, unit)} throttled vs {_with(fmt, b, unit)} unthrottled"


def _with(fmt: Any, v: float | None, unit: str) -> str:
    return f"{fmt(v)}{unit}" if v is not None else NA


def _num(v: float | None, spec: str = ",.1f") -> str:
    return format(v, spec) if v is not None else NA


def heat_lines(heat: dict[str, Any] | None, t0: float | None) -> list[str]:
    """Per GPU what ran throttled, per phase the token timing inside vs outside, the time lost, the stretches."""
    if heat is None:
        return ["  no clock readings in this recording (recorded before pcie-tui read them, or the GPU gave none)"]
    out = [_gpu_line(gi, g) for gi, g in heat["gpus"].items()]
    for phase, p in heat["phases"].items():
        out.append(_phase_line(phase, p))
    if heat["lost_s"] or heat["phases"]:
        upto = "up to " if heat.get("lost_is_upper_bound") else ""
        unknown = heat.get("lost_unknown_phases") or []
        tail = f"; not known for {', '.join(unknown)} (not counted)" if unknown else ""
        out.append(
            f"  lost to throttling: {upto}{heat['lost_s']:.1f} s = {upto}{_pct(heat['lost_share'])} of the session{tail}"
        )
    stretches = sorted(heat["stretches"], key=lambda s: -s["duration_s"])[:MAX_STRETCHES]
    folded = heat.get("stretches_folded") or []  # a long session's old ones beyond the longest (analyze/fold.py)
    if stretches:
        listed = len(heat["stretches"])
        total = listed + sum(f["stretches"] for f in folded)
        json = (
            "--json lists all"
            if not folded
            else f"--json lists {listed:,}, the newest and longest, and counts the rest"
        )
        more = total - len(stretches)
        out.append(
            "  throttled stretches" + (f" (the {len(stretches)} longest of {total:,}; {json})" if more else "") + ":"
        )
        out += [_stretch_line(s, t0) for s in sorted(stretches, key=lambda s: s["start"])]
    if folded:
        out.append("  older stretches, counted: " + "; ".join(_folded_line(f) for f in folded))
    return out


def _folded_line(f: dict[str, Any]) -> str:
    phase = f" in {f['phase']}" if f["phase"] else ""
    return f"GPU {f['gpu']} {f['reason']}{phase} {f['stretches']:,} ({f['duration_s']:.1f} s)"


def _gpu_line(gi: str, g: dict[str, Any]) -> str:
    reasons = ", ".join(f"{k} {n} ticks" for k, n in sorted(g["reason_ticks"].items(), key=lambda kv: -kv[1]))
    temp = f"{g['temp_max_C']:.0f} °C peak" if g["temp_max_C"] is not None else "temperature n/a"
    low = (
        f"SM clock down to {_mhz(g['sm_clock_min_MHz'])} of {_mhz(g['sm_clock_max_MHz'])} while throttled"
        if g["throttled_ticks"]
        else f"SM clock max {_mhz(g['sm_clock_max_MHz'])}"
    )
    return (
        f"  GPU {gi}: throttled {g['throttled_ticks']} of {g['ticks']} ticks; {temp}; {low}; "
        f"reasons seen: {reasons or 'none'}"
    )


def _phase_line(phase: str, p: dict[str, Any]) -> str:
    parts = [f"  {phase}: clocks cut {_pct(p['share'])} of {p['time_s']:.1f} s"]
    tok = _pair(p["tokens_per_s"], lambda v: _num(v), " tokens/s")
    if tok:
        parts.append(tok)
    itl = p["itl_s"]
    pair = _pair(itl, lambda v: _num(v * 1e3 if v is not None else None, ".1f"), " ms")
    if pair:
        parts.append(f"ITL {pair}")
    clk = _pair(p["sm_clock_MHz"], lambda v: _num(v, ",.0f"), " MHz")
    if clk:
        parts.append(f"SM {clk}")
    lost = f"lost {p['lost_s']:.1f} s ({p['lost_basis']})" if p["lost_s"] is not None else "time lost unknown"
    return "; ".join([*parts, lost])


def _stretch_line(s: dict[str, Any], t0: float | None) -> str:
    start = f"+{s['start'] - t0:.1f} s" if t0 is not None else f"{s['start']:.1f}"
    reason = "+".join(list(s["reasons"])[:2]) or s["reason"]
    clock = _mhz(s["sm_clock_MHz"]) + (f" of {s['sm_clock_max_MHz']:,.0f}" if s["sm_clock_max_MHz"] else "")
    temp = f", {s['temp_max_C']:.0f} °C" if s["temp_max_C"] is not None else ""
    power = (
        f", {s['power_W']:.0f} of {s['power_limit_W']:.0f} W"
        if s["power_W"] is not None and s["power_limit_W"] is not None
        else ""
    )
    phase = f" in {s['phase']}" if s["phase"] else ""
    return f"    GPU {s['gpu']} {start} for {s['duration_s']:.1f} s: {reason}{phase}, SM {clock}{temp}{power}"


def link_health_lines(lh: dict[str, Any], t0: float | None) -> list[str]:
    """Every link-health event in a line, or what was read and found quiet."""
    out = []
    for e in lh["events"]:
        at = f"+{e['start'] - t0:.1f} s" if t0 is not None else f"{e['start']:.1f}"
        out.append(f"  GPU {e['gpu']} {at}: {e['text']}")
    if not out:
        read = ", ".join(lh["read"]) if lh["read"] else None
        out.append(
            f"  no rise in {read}; no downtraining under load"
            if read
            else "  no link error counters in this recording; no downtraining under load"
        )
    return out
