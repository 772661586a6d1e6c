"""The analyzer as it was before it took chunks: per-tick scalar utilisation and hysteresis, verbatim.

tests/test_chunks_equal_ticks.py holds the chunked analyzer to this reference on random and real recordings,
so the unification changed no figure and no event.
"""

from __future__ import annotations

from typing import Any

from pcie_tui.analyze.columns import sample_phase
from pcie_tui.analyze.verdict import (
    DEFAULT_THRESHOLDS,
    RESOURCES,
    Event,
    Thresholds,
    Utilisation,
)
from pcie_tui.core.ceiling import pinned_ceiling
from pcie_tui.core.model import GpuInfo, GpuSample, Sample, SessionHeader


def ref_utilisation(info: GpuInfo | None, s: GpuSample, observed: dict | None = None) -> Utilisation:
    """Fractions of each resource's ceiling used in this tick. ``observed``: the highest PCIe reading so
    far by gen x width (updated here), which raises the ceiling once a reading goes above it."""
    link = link_Bps = ceiling = None
    bus = direction = None
    c = pinned_ceiling(info, s.link_gen, s.link_width)
    pc, theo = c.Bps, c.theoretical_Bps
    if pc and observed is not None:
        key = (s.link_gen, s.link_width)
        seen = [v for v in (observed.get(key), s.pcie_rx_Bps, s.pcie_tx_Bps) if v is not None]
        if seen:
            observed[key] = min(max(seen), theo) if theo else max(seen)  # a glitch above theoretical is not a ceiling
            pc = max(pc, observed[key])
    if pc:
        for d, v in (("rx", s.pcie_rx_Bps), ("tx", s.pcie_tx_Bps)):
            if v is not None and (link is None or min(v / pc, 1.0) > link):
                link, link_Bps, ceiling, bus, direction = min(v / pc, 1.0), v, pc, "pcie", d
    nc = info.nvlink_capacity_Bps if info is not None else None
    if nc:
        for d, v in (("rx", s.nvlink_rx_Bps), ("tx", s.nvlink_tx_Bps)):
            if v is not None and (link is None or v / nc > link):
                link, link_Bps, ceiling, bus, direction = v / nc, v, nc, "nvlink", d
    if s.dram_bw_util is not None or (info is not None and info.metrics_source == "gpm"):
        mem, proxy = s.dram_bw_util, False
    else:
        mem, proxy = s.mem_busy, s.mem_busy is not None
    return Utilisation(link, bus, direction, link_Bps, ceiling, mem, proxy, s.sm_util)


class _ResourceTracker:
    __slots__ = ("resource", "active", "above_since", "below_since", "last_above", "event", "pending")

    def __init__(self, resource: str) -> None:
        self.resource = resource
        self.active = False
        self.above_since: float | None = None
        self.below_since: float | None = None
        self.last_above: float | None = None  # last tick at or above the exit threshold
        self.event: Event | None = None
        # Readings since above_since, folded into the event when it opens.
        self.pending: list[tuple[float, float, Utilisation, str | None]] = []


class RefTracker:
    """Feeds one GPU's ticks through the hysteresis rules; emits events."""

    def __init__(self, info: GpuInfo | None, index: int, thresholds: Thresholds = DEFAULT_THRESHOLDS) -> None:
        self.info = info
        self.index = index
        self.th = thresholds
        self._trackers = {r: _ResourceTracker(r) for r in RESOURCES}
        self.verdict = "none"
        self.last_util: Utilisation | None = None
        self.observed: dict = {}

    def update(self, t: float, s: GpuSample, phase: str | None = None) -> tuple[str, list[Event], list[Event]]:
        """Feed one tick. Returns (verdict, events opened, events closed)."""
        u = ref_utilisation(self.info, s, self.observed)
        self.last_util = u
        opened: list[Event] = []
        closed: list[Event] = []
        th = self.th
        for r, tr in self._trackers.items():
            val = u.link if r == "link" else u.memory if r == "memory" else u.compute
            if val is None:
                continue  # unknown: hold state; a missing reading proves nothing
            proxy = r == "memory" and u.memory_proxy
            if not tr.active:
                if val >= th.enter(r, proxy):
                    if tr.above_since is None:
                        tr.above_since = t
                        tr.pending.clear()
                    tr.pending.append((t, val, u, phase))
                    if t - tr.above_since >= th.hold_s:
                        ev = Event(self.index, r, start=tr.above_since, proxy=proxy)
                        for _pt, pv, pu, pp in tr.pending:
                            _fold(ev, pv, pu, pp)
                        tr.pending.clear()
                        tr.active, tr.event, tr.below_since, tr.last_above = True, ev, None, t
                        opened.append(ev)
                else:
                    tr.above_since = None
                    tr.pending.clear()
            else:
                cur = tr.event
                assert cur is not None
                if val < th.exit(r, proxy):
                    if tr.below_since is None:
                        tr.below_since = t
                    if t - tr.below_since >= th.hold_s:
                        cur.end = tr.last_above
                        tr.active, tr.event, tr.above_since = False, None, None
                        closed.append(cur)
                else:
                    tr.below_since = None
                    tr.last_above = t
                    _fold(cur, val, u, phase)
        self.verdict = next((r for r in RESOURCES if self._trackers[r].active), "none")
        return self.verdict, opened, closed

    def open_events(self) -> list[Event]:
        return [tr.event for tr in self._trackers.values() if tr.event is not None]

    def close_all(self, t: float) -> list[Event]:
        """Close open events at the end of a session."""
        out = []
        for tr in self._trackers.values():
            if tr.event is not None:
                tr.event.end = tr.last_above if tr.below_since is not None else t
                out.append(tr.event)
                tr.event, tr.active = None, False
        return out


def _fold(ev: Event, val: float, u: Utilisation, phase: str | None) -> None:
    ev.n += 1
    ev.sum_util += val
    if phase:
        ev.phases[phase] = ev.phases.get(phase, 0) + 1
    if ev.resource == "link" and u.link_dir:
        ev.directions.add(u.link_dir)
    if val >= ev.peak_util:
        ev.peak_util = val
        if ev.resource == "link":
            ev.bus, ev.direction, ev.peak_Bps = u.link_bus, u.link_dir, u.link_Bps


def _set_aside(info: GpuInfo | None, g: GpuSample, state: list[tuple[float | None, int]]) -> GpuSample:
    """PCIe readings no link produces, as pcie_tui.analyze.suspect sets them aside (added with it, on
    purpose): above 1.25 x the theoretical rate or below 0, or repeated exactly (non-zero) 20 ticks in a row."""
    import dataclasses

    from pcie_tui.analyze.suspect import IMPOSSIBLE_OVER, STUCK_TICKS
    from pcie_tui.core.model import pcie_capacity_Bps

    theo = pcie_capacity_Bps(g.link_gen, g.link_width)
    if not theo and info is not None:
        theo = info.link.capacity_Bps or info.link.max_capacity_Bps
    out: dict[str, Any] = {}
    for d, key in enumerate(("pcie_rx_Bps", "pcie_tx_Bps")):
        v = getattr(g, key)
        last, run = state[d]
        run = run + 1 if v is not None and v == last and v != 0 else 0
        state[d] = (v, run)
        if v is not None and (v < 0 or (theo and v > IMPOSSIBLE_OVER * theo) or run >= STUCK_TICKS - 1):
            out[key] = None
    return dataclasses.replace(g, **out) if out else g


def ref_run(header: SessionHeader, samples: list[Sample], th: Thresholds = DEFAULT_THRESHOLDS) -> dict[str, Any]:
    """Per-tick reference: per GPU series, events in opening order, per tick opened events, final trackers."""
    trackers: dict[int, RefTracker] = {}
    series: dict[int, dict[str, list[Any]]] = {}
    events: list[Event] = []
    per_tick: list[list[Event]] = []
    # The session's phase rule (changed since this copy was taken, on purpose): once an engine is in
    # the session, a tick's phase is the engine's alone (None without one); before, the label.
    engine_session = header.engine is not None
    aside: dict[int, list[tuple[float | None, int]]] = {}  # per GPU and direction: last reading, repeats
    for s in samples:
        engine_session = engine_session or s.engine is not None
        phase = (s.engine.phase or None if s.engine is not None else None) if engine_session else sample_phase(s)
        opened_all: list[Event] = []
        for g in s.gpus:
            tr = trackers.get(g.index)
            if tr is None:
                tr = trackers[g.index] = RefTracker(header.gpu(g.index), g.index, th)
                series[g.index] = {k: [] for k in ("t", "verdict", "link", "link_Bps", "memory", "compute", "phase")}
            g = _set_aside(header.gpu(g.index), g, aside.setdefault(g.index, [(None, 0), (None, 0)]))
            verdict, opened, _closed = tr.update(s.t, g, phase)
            opened_all.extend(opened)
            u = tr.last_util
            assert u is not None
            ser = series[g.index]
            for k, v in (("t", s.t), ("verdict", verdict), ("link", u.link), ("link_Bps", u.link_Bps),
                         ("memory", u.memory), ("compute", u.compute), ("phase", phase)):  # fmt: skip
                ser[k].append(v)
        events.extend(opened_all)
        per_tick.append(opened_all)
    if samples:
        for tr in trackers.values():
            tr.close_all(samples[-1].t)
    return {"trackers": trackers, "series": series, "events": events, "per_tick": per_tick}
