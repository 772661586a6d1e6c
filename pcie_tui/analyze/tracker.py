"""The saturation verdict's hysteresis state machine, one per GPU, advanced over a chunk of ticks.

Rules (docs/verdict.md): a resource enters the saturated state once its use stayed at or above
its enter threshold for ``hold_s`` (the event starts where that run began) and leaves once it
stayed below its exit threshold for ``hold_s`` (the event ends at the last tick still at or
above exit); an unknown reading holds the state. :meth:`GpuVerdictTracker.advance` takes one
GPU's utilisation for a whole chunk (:func:`pcie_tui.analyze.verdict.utilisation_columns`)
and walks it tick by tick in plain Python over lists, carrying its state from chunk to chunk;
the readings an event sums (count, sum, peak, phases, directions) are folded per stretch of
ticks. A live tick is a chunk of one, so live, replay and report run this same code.
"""

from __future__ import annotations

from collections import Counter
from functools import reduce
from operator import add
from typing import Any

import numpy as np

from pcie_tui.analyze.columns import from_samples
from pcie_tui.analyze.verdict import (
    BUS,
    DEFAULT_THRESHOLDS,
    DIR,
    RESOURCES,
    Event,
    Thresholds,
    Utilisation,
    last_utilisation,
    utilisation_columns,
)
from pcie_tui.model import GpuInfo, GpuSample, Sample

class _ResourceTracker:
    __slots__ = ("resource", "active", "above_since", "below_since", "last_above", "event")

    def __init__(self, resource: str) -> None:
        self.resource = resource
        self.active = False
        self.above_since: float | None = None
        self.below_since: float | None = None
        self.last_above: float | None = None  # last tick at or above the exit threshold
        # The open event while active; before that, the one gathering the run since above_since.
        self.event: Event | None = None


class GpuVerdictTracker:
    """One GPU's ticks through the hysteresis rules; emits events."""

    def __init__(self, info: GpuInfo | None, index: int, thresholds: Thresholds = DEFAULT_THRESHOLDS) -> None:
        self.info = info
        self.index = index
        self.th = thresholds
        self._trackers = {r: _ResourceTracker(r) for r in RESOURCES}
        self.verdict = "none"
        self.last_util: Utilisation | None = None

    def update(self, t: float, s: GpuSample, phase: str | None = None) -> tuple[str, list[Event], list[Event]]:
        """Feed one tick. Returns (verdict, events opened, events closed)."""
        u = utilisation_columns(self.info, from_samples([Sample(t, (s,))]).cols)
        opened, closed, _codes = self.advance([t], u, [phase])
        return self.verdict, [e for _i, _r, e in opened], closed

    def advance(
        self, t: list[float], u: dict[str, np.ndarray], phase: list[Any]
    ) -> tuple[list[tuple[int, int, Event]], list[Event], np.ndarray]:
        """Feed a chunk of this GPU's ticks (times, utilisation columns, phases), in order.

        Returns the events opened, each as (position in the chunk, resource order, event), the
        events closed, and the verdict of every tick as an index into VERDICTS.
        """
        m = len(t)
        codes = np.full(m, len(RESOURCES), dtype=np.int64)
        if not m:
            return [], [], codes
        th = self.th
        src = u["src"].tolist()
        link_Bps = u["link_Bps"].tolist()
        proxy = u["proxy"].tolist()
        opened: list[tuple[int, int, Event]] = []
        closed: list[Event] = []
        spans = []
        for ri, r in enumerate(RESOURCES):
            if r == "memory":
                en = np.where(u["proxy"], th.proxy_memory_enter, th.memory_enter).tolist()
                ex = np.where(u["proxy"], th.proxy_memory_exit, th.memory_exit).tolist()
                prox = proxy
            else:
                en, ex, prox = [th.enter(r)] * m, [th.exit(r)] * m, [False] * m
            val = u[r].tolist()
            fold = _folder(val, phase, src, link_Bps, r == "link")
            op, cl, sp = _walk(self._trackers[r], self.index, t, val, en, ex, prox, th.hold_s, fold)
            opened += [(i, ri, e) for i, e in op]
            closed += cl
            spans.append(sp)
        for ri in range(len(RESOURCES) - 1, -1, -1):  # lowest priority first; higher ones overwrite
            for a, b in spans[ri]:
                codes[a:b] = ri
        self.verdict = next((r for r in RESOURCES if self._trackers[r].active), "none")
        self.last_util = last_utilisation(u)
        return opened, closed, codes

    def open_events(self) -> list[Event]:
        return [tr.event for tr in self._trackers.values() if tr.active and tr.event is not None]

    def close_all(self, t: float) -> list[Event]:
        """Close open events at the end of a session."""
        out = []
        for tr in self._trackers.values():
            if tr.active and tr.event is not None:
                tr.event.end = tr.last_above if tr.below_since is not None else t
                out.append(tr.event)
                tr.event, tr.active, tr.above_since = None, False, None
        return out


def _walk(
    st: _ResourceTracker,
    gpu: int,
    t: list[float],
    val: list[float],
    en: list[float],
    ex: list[float],
    proxy: list[bool],
    hold: float,
    fold: Any,
) -> tuple[list[tuple[int, Event]], list[Event], list[tuple[int, int]]]:
    """One resource over a chunk: (events opened with their tick, events closed, active spans [a, b))."""
    active, above, below, last_above, ev = st.active, st.above_since, st.below_since, st.last_above, st.event
    take: list[int] = []  # ticks of this chunk still to fold into ev
    opened: list[tuple[int, Event]] = []
    closed: list[Event] = []
    spans: list[tuple[int, int]] = []
    since = 0
    for i, x in enumerate(val):
        if x != x:
            continue  # unknown: hold state; a missing reading proves nothing
        if not active:
            if x >= en[i]:
                ti = t[i]
                if above is None:
                    above = ti
                    ev = Event(gpu, st.resource, start=ti)
                    take = []
                take.append(i)
                if ti - above >= hold:
                    assert ev is not None
                    ev.proxy = proxy[i]
                    fold(ev, take)
                    take = []
                    active, below, last_above, since = True, None, ti, i
                    opened.append((i, ev))
            elif above is not None:
                above = ev = None
                take = []
        elif x < ex[i]:
            ti = t[i]
            if below is None:
                below = ti
            if ti - below >= hold:
                assert ev is not None
                fold(ev, take)
                take = []
                ev.end = last_above
                closed.append(ev)
                spans.append((since, i))
                active, above, ev = False, None, None
        else:
            below, last_above = None, t[i]
            take.append(i)
    if ev is not None and take:
        fold(ev, take)
    if active:
        spans.append((since, len(val)))
    st.active, st.above_since, st.below_since, st.last_above, st.event = active, above, below, last_above, ev
    return opened, closed, spans


def _folder(val: list[float], phase: list[Any], src: list[int], link_Bps: list[float], link: bool) -> Any:
    """The fold of an event's readings over some ticks of the chunk, in tick order (as += would)."""

    def fold(ev: Event, ticks: list[int]) -> None:
        if not ticks:
            return
        vals = [val[i] for i in ticks]
        ev.n += len(vals)
        ev.sum_util = reduce(add, vals, ev.sum_util)  # sequential, as a running += is
        top = max(vals)
        if top >= ev.peak_util:
            ev.peak_util = top
            if link:  # the last tick at the peak carries it
                at = ticks[len(vals) - 1 - vals[::-1].index(top)]
                s = src[at]
                ev.bus, ev.direction, ev.peak_Bps = BUS[s], DIR[s], link_Bps[at]
        phases = ev.phases
        for p, k in Counter([phase[i] for i in ticks]).items():
            if p:
                phases[p] = phases.get(p, 0) + k
        if link:
            ev.directions.update(DIR[k] for k in {src[i] for i in ticks} if k)

    return fold
