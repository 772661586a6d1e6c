"""The headline: one line in plain words saying what holds the session back now.

:func:`headline_text` is the only text source of the headline bar: the view model
calls it once per frame (off the UI thread) and the bar shows the string as is. It is
the one analysis' headline (:mod:`pcie_tui.analyze.analysis`), the same text ``report``
prints.
No Textual here.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from pcie_tui.analyze.verdict import Utilisation, tick_ceiling
from pcie_tui.core import vocab
from pcie_tui.tui import fmt

if TYPE_CHECKING:
    from pcie_tui.tui.state import ViewModel

# Which verdict names the session when GPUs disagree (the verdict's own priority).
RANK = {"link": 3, "memory": 2, "compute": 1, "none": 0}
BUS = {"pcie": "PCIe", "nvlink": "NVLink"}
DIRECTION = {"rx": "RX", "tx": "TX"}
VERDICT_WORDS = vocab.VERDICT_WORDS


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
    """What holds the session back: the one analysis' headline (:meth:`ViewModel.answer`), word for
    word what ``report`` prints once the source has ended; None before any reading.

    While a session runs with no phase of work to tie a bound to yet (a GPU-only watch, the seconds
    before the first request), the saturation state now says more than "nothing in flight".
    """
    h = state.answer().headline
    if state.analysis.ended and state.header.gpus:
        return h.text
    if h.finding is None or h.phase == "unlabelled":
        return saturation_text(state) or engine_only_text(state)
    now = state.phase
    if now and h.phase and now != h.phase:
        # Between phases of work (idle, loading, a phase with nothing to tell yet) the answer is about the
        # longest one so far: say so, so the headline and the GPU panel's phase never disagree on screen.
        return f"{now} now · so far the longest work: {h.text}"
    return h.text


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
    """``PCIe RX 45.3 GB/s = 75 % of 60.2 GB/s (calibrated)``: the busiest direction against the one ceiling."""
    parts = [BUS.get(u.link_bus or "", "link"), DIRECTION.get(u.link_dir or "", ""), fmt.rate(u.link_Bps)]
    parts += ["=", fmt.pct(u.link), "of", fmt.gbps(u.link_ceiling_Bps)]
    if u.link_bus == "pcie":
        h = state.hist.get(idx)
        tr = state.analyzer.trackers.get(idx)
        c = tick_ceiling(state.header.gpu(idx), h.sample if h is not None else None, tr.observed if tr else {})
        parts.append(f"({c.source})")
    return " ".join(p for p in parts if p)
