"""The headline: one line in plain words saying what holds the session back now.

:func:`headline_text` is the only text source of the headline bar: the view model
calls it once per frame (off the UI thread) and the bar shows the string as is.
Today it reads the per-GPU verdicts the analyzer already keeps; a richer analysis
can replace the body without touching the widget or the frame.
No Textual here.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from pcie_tui.analyze.answer import CALIBRATE_HINT, evidence_text, live_headline, over_default_ceiling, predicted_range
from pcie_tui.analyze.attribution import BOUND_SHORT
from pcie_tui.analyze.verdict import Utilisation, pcie_ceiling_Bps
from pcie_tui.tui import fmt

if TYPE_CHECKING:
    from pcie_tui.tui.state import ViewModel

# Which verdict names the session when GPUs disagree (the verdict's own priority).
RANK = {"link": 3, "memory": 2, "compute": 1, "none": 0}
BUS = {"pcie": "PCIe", "nvlink": "NVLink"}
DIRECTION = {"rx": "RX", "tx": "TX"}
VERDICT_WORDS = {"link": "link-bound", "memory": "memory-bound", "compute": "compute-bound"}


def _load(verdict: str, u: Utilisation) -> float:
    """How hard the GPU is held by its verdict (or, with none, by its busiest resource)."""
    if verdict == "link":
        return u.link or 0.0
    if verdict == "memory":
        return u.memory or 0.0
    if verdict == "compute":
        return u.compute or 0.0
    return max((v for v in (u.link, u.memory, u.compute) if v is not None), default=0.0)


def headline_text(state: ViewModel) -> str | None:
    """What holds the session back (:func:`pcie_tui.analyze.answer.live_headline`): the current phase's
    bound with its numbers, then the fix in the engine's words; None before any reading."""
    h = live_headline(state.attribution, state.phase)
    if h is None or h.get("finding") is None or h["phase"] == "unlabelled":
        # No phase to tie a bound to (GPU-only watch): the saturation state now says more.
        return saturation_text(state) or engine_only_text(state)
    f = h["finding"]
    first = (
        f"{h['phase']} · {BOUND_SHORT[h['bound']]} {h['share'] * 100:.0f}% of the time: {evidence_text(f, short=True)}"
    )
    if len(state.attribution.findings()) > 1 or (f["gpu"] not in (0, None)):
        first = f"GPU{f['gpu']} " + first
    if h.get("fix"):
        pred = h.get("predicted")
        fix = h["fix"].split(": ", 1)[0].split("; ", 1)[0]  # the change itself; its reasons are in the report
        tail = f" ({h['phase']} so far {pred['phase_s']:.1f} s -> {predicted_range(pred)})" if pred else ""
        return f"{first}\nfix: {fix}{tail}"
    if h.get("cause"):
        return f"{first}\ncause: {h['cause']}"
    if h["bound"] == "link" and over_default_ceiling(f):
        return f"{first}\nabove the default ceiling: {CALIBRATE_HINT}"
    return first


def engine_only_text(state: ViewModel) -> str | None:
    """With no GPU readings at all (the engine alone), what runs now and that its bound is unknown."""
    if state.header.gpus or state.phase not in ("prefill", "decode", "mixed"):
        return None
    return f"{state.phase} · no GPU readings (engine alone): what holds it back is unknown"


def saturation_text(state: ViewModel) -> str | None:
    """The verdict of the hottest GPU, with the phase, in plain words; None before any reading."""
    seen = [
        (RANK.get(tr.verdict, 0), _load(tr.verdict, tr.last_util), idx, tr.verdict, tr.last_util)
        for idx, tr in state.analyzer.trackers.items()
        if tr.last_util is not None
        and any(v is not None for v in (tr.last_util.link, tr.last_util.memory, tr.last_util.compute))
    ]
    if not seen:
        return None
    _, _, idx, verdict, u = max(seen, key=lambda x: (x[0], x[1], -x[2]))
    th = state.thresholds
    prefix = f"{state.phase} · " if state.phase else ""
    if verdict == "link":
        body = f"GPU{idx} LINK SATURATED: {_link(state, idx, u)}"
        now, enter = u.link, th.link_enter
    elif verdict == "memory" and u.memory_proxy:
        body = f"GPU{idx} MEMORY BUSY: {fmt.pct(u.memory)} of the time (duty-cycle proxy, not bandwidth)"
        now, enter = u.memory, th.proxy_memory_enter
    elif verdict == "memory":
        body = f"GPU{idx} DRAM BANDWIDTH SATURATED: {fmt.pct(u.memory)} of peak"
        now, enter = u.memory, th.memory_enter
    elif verdict == "compute":
        body = f"GPU{idx} COMPUTE SATURATED: SM {fmt.pct(u.compute)}"
        now, enter = u.compute, th.compute_enter
    else:
        link = fmt.NA
        if u.link is not None:
            bus = " ".join(x for x in (BUS.get(u.link_bus or "", "link"), DIRECTION.get(u.link_dir or "", "")) if x)
            link = f"{bus} {fmt.rate(u.link_Bps)} ({fmt.pct(u.link)} of {fmt.gbps(u.link_ceiling_Bps)})"
        mem = "mem busy" if u.memory_proxy else "DRAM"
        body = f"nothing saturated · GPU{idx} {link}, {mem} {fmt.pct(u.memory)}, SM {fmt.pct(u.compute)}"
        now, enter = None, 0.0
    if verdict != "none" and (now is None or now < enter):
        body += ", easing"  # held by the exit hysteresis, below the enter threshold now
    others = sum(1 for r in seen if r[3] == verdict and r[2] != idx) if verdict != "none" else 0
    if others:
        body += f" (+{others} more GPU{'s' if others > 1 else ''} {VERDICT_WORDS[verdict]})"
    return prefix + body


def _link(state: ViewModel, idx: int, u: Utilisation) -> str:
    """``PCIe RX 45.3 GB/s of 60.0 GB/s measured``: the busiest direction against its ceiling."""
    parts = [BUS.get(u.link_bus or "", "link"), DIRECTION.get(u.link_dir or "", ""), fmt.rate(u.link_Bps)]
    parts += ["of", fmt.gbps(u.link_ceiling_Bps)]
    if u.link_bus == "pcie":
        h = state.hist.get(idx)
        parts.append(pcie_ceiling_Bps(state.header.gpu(idx), h.sample if h is not None else None)[1])
    return " ".join(p for p in parts if p)
