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
from itertools import chain
from operator import add, itemgetter
from typing import Any

import numpy as np

from pcie_tui.analyze.columns import from_samples
from pcie_tui.analyze.suspect import SuspectFilter
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
from pcie_tui.core.model import GpuInfo, GpuSample, Sample


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
        self.suspect = SuspectFilter()  # PCIe readings no link produces (wrapped, stuck): set aside
        self.verdict = "none"
        self.last_util: Utilisation | None = None
        self._limits = {r: (thresholds.enter(r), thresholds.exit(r)) for r in RESOURCES}
        self.ceilings: dict[tuple[float, float], float] = {}  # PCIe ceiling by link gen x width (utilisation_columns)
        self.observed: dict[tuple[float, float], float] = {}  # highest PCIe reading so far by gen x width

    @property
    def observed_Bps(self) -> float | None:
        """The highest PCIe reading of this GPU so far (any gen x width)."""
        return max(self.observed.values(), default=None)

    def update(self, t: float, s: GpuSample, phase: str | None = None) -> tuple[str, list[Event], list[Event]]:
        """Feed one tick. Returns (verdict, events opened, events closed)."""
        u = utilisation_columns(self.info, from_samples([Sample(t, (s,))]).cols, self.ceilings, self.observed)
        opened, closed, _spans = self.advance(np.array([t], dtype=np.float64), u, [phase])
        return self.verdict, [e for _i, _r, e in opened], closed

    def advance(
        self, t: np.ndarray, u: dict[str, np.ndarray], phase: list[Any], tl: list[float] | None = None
    ) -> tuple[list[tuple[int, int, Event]], list[Event], list[list[tuple[int, int]]]]:
        """Feed a chunk of this GPU's ticks (times, utilisation columns, phases), in order.

        Returns the events opened, each as (position in the chunk, resource order, event), the
        events closed, and per resource the spans [a, b) of the chunk it was saturated in (see
        :func:`verdict_codes`). ``tl``: ``t`` as a list, where the caller has it already.
        """
        m = t.size
        if not m:
            return [], [], [[] for _ in RESOURCES]
        tl = t.tolist() if tl is None else tl
        th = self.th
        proxy = u["proxy"]
        opened: list[tuple[int, int, Event]] = []
        closed: list[Event] = []
        spans: list[list[tuple[int, int]]] = []
        picked: dict[bytes, tuple[list[int], list[float], list[Any]]] = {}
        for ri, r in enumerate(RESOURCES):
            en: Any
            ex: Any
            memory = r == "memory"
            if memory and proxy.any():
                en = np.where(proxy, th.proxy_memory_enter, th.memory_enter)
                ex = np.where(proxy, th.proxy_memory_exit, th.memory_exit)
            else:
                en, ex = self._limits[r]
            st = self._trackers[r]
            if m <= _SMALL and not st.active and st.above_since is None and _all_below(u[r], en):
                spans.append([])  # idle and staying so: nothing to walk
                continue
            k, runs = _runs(u[r], en, ex)
            ki: list[int] | None = None
            if k is None:
                view = _View(tl, u[r].tolist(), phase, u["src"], u["link_Bps"], proxy if memory else None)
            else:
                key = k.tobytes()  # resources usually miss the same ticks: pick their times and phases once
                if key not in picked:
                    picked[key] = (k.tolist(), t[k].tolist(), _pick(phase, k.tolist()))
                ki, tk, pk = picked[key]
                view = _View(tk, u[r][k].tolist(), pk, u["src"][k], u["link_Bps"][k], proxy[k] if memory else None)
            op, cl, sp = _walk(self._trackers[r], self.index, view, runs, th.hold_s, r == "link")
            if ki is not None:
                op = [(ki[j], e) for j, e in op]
                sp = [(ki[a] if a >= 0 else 0, ki[b] if b < len(ki) else m) for a, b in sp]
            opened += [(i, ri, e) for i, e in op]
            closed += cl
            spans.append(sp)
        self.verdict = "none"
        for r, tr in self._trackers.items():
            if tr.active:
                self.verdict = r
                break
        self.last_util = last_utilisation(u)
        return opened, closed, spans

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


def _pick(values: list[Any], at: list[int]) -> list[Any]:
    """values[i] for i in at."""
    return list(itemgetter(*at)(values)) if len(at) > 1 else [values[i] for i in at]


def _all_below(v: np.ndarray, en: Any) -> bool:
    """No reading of a (short) chunk at or above its enter threshold (an unknown one is not)."""
    if isinstance(en, np.ndarray):
        return not any(x >= e for x, e in zip(v.tolist(), en.tolist(), strict=True))
    return not any(x >= en for x in v.tolist())


def verdict_codes(m: int, spans: list[list[tuple[int, int]]]) -> np.ndarray:
    """The verdict of each of a chunk's ``m`` ticks (an index into VERDICTS) from :meth:`GpuVerdictTracker.advance`'s spans."""
    codes = np.full(m, len(RESOURCES), dtype=np.int64)
    for ri in range(len(RESOURCES) - 1, -1, -1):  # lowest priority first; higher ones overwrite
        for a, b in spans[ri]:
            codes[max(a, 0) : b] = ri
    return codes


_SMALL = 16  # chunks up to this many ticks find their runs in plain Python (numpy costs more there)


def _runs(v: np.ndarray, en: Any, ex: Any) -> tuple[np.ndarray | None, list[tuple[int, int, bool, bool]]]:
    """The ticks with a reading (None: all of them) and, over those, the runs of ticks alike in
    (at or above enter, at or above exit): (start, end, above enter, above exit), end exclusive."""
    m = v.size
    if m <= _SMALL:
        vl = v.tolist()
        enl = en.tolist() if isinstance(en, np.ndarray) else [en] * m
        exl = ex.tolist() if isinstance(ex, np.ndarray) else [ex] * m
        ki = [i for i, x in enumerate(vl) if x == x]
        out: list[list[Any]] = []
        for j, i in enumerate(ki):
            h, k = vl[i] >= enl[i], vl[i] >= exl[i]
            if out and out[-1][2] == h and out[-1][3] == k:
                out[-1][1] = j + 1
            else:
                out.append([j, j + 1, h, k])
        return (None if len(ki) == m else np.array(ki, dtype=np.int64)), [(a, b, h, k) for a, b, h, k in out]
    known = ~np.isnan(v)
    kidx: np.ndarray | None = None
    if not known.all():
        kidx = np.flatnonzero(known)
        v = v[kidx]
        en = en[kidx] if isinstance(en, np.ndarray) else en
        ex = ex[kidx] if isinstance(ex, np.ndarray) else ex
    if not v.size:
        return kidx, []
    hi, kp = v >= en, v >= ex
    code = hi.view(np.int8) * 2 + kp.view(np.int8)
    cut = (np.flatnonzero(code[1:] != code[:-1]) + 1).tolist()
    starts, ends = [0, *cut], [*cut, int(v.size)]
    return kidx, list(zip(starts, ends, hi[starts].tolist(), kp[starts].tolist(), strict=True))


class _View:
    """One resource's ticks with a reading: time, use and phase as lists; link source and rate, proxy as arrays."""

    __slots__ = ("t", "val", "phase", "src", "link_Bps", "proxy")

    def __init__(self, t: list[float], val: list[float], phase: list[Any], src: np.ndarray, link_Bps: np.ndarray,
                 proxy: np.ndarray | None) -> None:  # fmt: skip
        self.t, self.val, self.phase, self.src, self.link_Bps, self.proxy = t, val, phase, src, link_Bps, proxy


def _first_held(t: list[float], a: int, b: int, since: float, hold: float) -> int:
    """The first tick in [a, b) that is ``hold`` past ``since`` (b if none): the per-tick test, in order."""
    for j in range(a, b):
        if t[j] - since >= hold:
            return j
    return b


def _walk(
    st: _ResourceTracker, gpu: int, w: _View, runs: list[tuple[int, int, bool, bool]], hold: float, link: bool
) -> tuple[list[tuple[int, Event]], list[Event], list[tuple[int, int]]]:
    """One resource over a chunk, run by run: (events opened with their tick, events closed, active spans [a, b)).

    Per tick the rules are: inactive, a reading at or above enter starts (or extends) a run, and
    the run opens an event once it lasted ``hold``; below enter drops it. Active, a reading below
    exit starts (or extends) a quiet stretch that closes the event once it lasted ``hold``; at or
    above exit ends the stretch and is folded into the event. Inside a run of ticks alike, only
    the hold test differs from tick to tick, so it alone is tested per tick.
    """
    active, above, below, last_above, ev = st.active, st.above_since, st.below_since, st.last_above, st.event
    t = w.t
    take: list[tuple[int, int]] = []  # stretches of this chunk still to fold into ev
    opened: list[tuple[int, Event]] = []
    closed: list[Event] = []
    spans: list[tuple[int, int]] = []
    since = -1  # active since before this chunk
    for a, b, hi, kp in runs:
        i = a
        while i < b:
            if not active:
                if not hi:
                    if above is not None:
                        above = ev = None
                        take = []
                    break
                if above is None:
                    above = t[i]
                    ev = Event(gpu, st.resource, start=above)
                    take = []
                j = _first_held(t, i, b, above, hold)
                if j == b:
                    take.append((i, b))
                    break
                opened.append((j, _open(ev, take, w, i, j, link)))
                active, below, last_above, since = True, None, t[j], j
                i = j + 1
            elif kp:
                below, last_above = None, t[b - 1]
                take.append((i, b))
                break
            else:
                if below is None:
                    below = t[i]
                c = _first_held(t, i, b, below, hold)
                if c == b:
                    break
                closed.append(_close(ev, take, w, last_above, link))
                spans.append((since, c))
                active, above, ev = False, None, None
                i = c + 1
    if ev is not None and take:
        _fold(ev, take, w, link)
    if active:
        spans.append((since, len(t)))
    st.active, st.above_since, st.below_since, st.last_above, st.event = active, above, below, last_above, ev
    return opened, closed, spans


def _open(ev: Event | None, take: list[tuple[int, int]], w: _View, i: int, j: int, link: bool) -> Event:
    """The run held at tick ``j``: the event folds its readings from ``i`` up to and including
    ``j``, takes ``j``'s proxy flag and is returned; ``take`` is emptied."""
    assert ev is not None
    take.append((i, j + 1))
    ev.proxy = bool(w.proxy[j]) if w.proxy is not None else False
    _fold(ev, take, w, link)
    take.clear()
    return ev


def _close(ev: Event | None, take: list[tuple[int, int]], w: _View, last_above: float | None, link: bool) -> Event:
    """The quiet stretch held: the event folds what it still had to take, ends at the last tick
    still at or above exit, and is returned; ``take`` is emptied."""
    assert ev is not None
    _fold(ev, take, w, link)
    take.clear()
    ev.end = last_above
    return ev


def _fold(ev: Event, take: list[tuple[int, int]], w: _View, link: bool) -> None:
    """Fold an event's readings over stretches [a, b) of the chunk, in tick order (as a running += would)."""
    if len(take) == 1:
        a, b = take[0]
        vals, ticks = w.val[a:b], range(a, b)
    else:
        vals = list(chain.from_iterable(w.val[a:b] for a, b in take))
        ticks = list(chain.from_iterable(range(a, b) for a, b in take))  # type: ignore[assignment]
    if not vals:
        return
    ev.n += len(vals)
    ev.sum_util = reduce(add, vals, ev.sum_util)  # sequential, as a running += is
    top = max(vals)
    if top >= ev.peak_util:
        ev.peak_util = top
        if link:  # the last tick at the peak carries it
            at = ticks[len(vals) - 1 - vals[::-1].index(top)]
            s = int(w.src[at])
            ev.bus, ev.direction, ev.peak_Bps = BUS[s], DIR[s], float(w.link_Bps[at])
    phases = ev.phases
    for p, k in Counter(chain.from_iterable(w.phase[a:b] for a, b in take)).items():
        if p:
            phases[p] = phases.get(p, 0) + k
    if link:
        used = set(chain.from_iterable(set(w.src[a:b].tolist()) for a, b in take))
        ev.directions.update(d for x in used if (d := DIR[x]))
