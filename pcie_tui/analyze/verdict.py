"""Which resource is saturated, per GPU and tick, with time hysteresis.

Pure functions and small state machines over Samples; no I/O.

Rules (defaults in :class:`Thresholds`, reasoning in docs/verdict.md):

* ``link``: PCIe or NVLink use, either direction, as a fraction of the link's
  ceiling (the calibrated counter reading if ``pcie-tui calibrate`` ran, else
  the theoretical rate of the link's current gen x width).
* ``memory``: GPM ``DRAM_BW_UTIL`` (true bandwidth); without GPM, NVML's
  memory-busy duty cycle with stricter thresholds, labelled as a proxy.
* ``compute``: SM utilisation.

A resource enters the saturated state only after its utilisation stayed at or
above ``*_enter`` for ``hold_s``; it leaves after staying below ``*_exit`` for
``hold_s``. When several are saturated at once the verdict is the first of
link > memory > compute: the link is the one a user can change by moving a
card, and a saturated link starves the others.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from pcie_tui.model import GpuInfo, GpuSample, pcie_capacity_Bps

RESOURCES = ("link", "memory", "compute")
VERDICTS = ("link", "memory", "compute", "none")


@dataclass(frozen=True, slots=True)
class Thresholds:
    """Verdict thresholds. Fractions 0..1 of the resource's ceiling; times in seconds."""

    # Saturating pinned copies read 0.87-0.92 of the theoretical Gen5 x16 rate
    # (NVML/GPM count protocol overhead); a link at half duty reads ~0.45.
    link_enter: float = 0.70
    link_exit: float = 0.55
    # GPM DRAM_BW_UTIL: a device-to-device copy reads 0.87, a bf16 matmul 0.16.
    memory_enter: float = 0.70
    memory_exit: float = 0.55
    # NVML memory-busy is a duty cycle: a D2D copy reads 1.00 but so can light
    # streaming; a matmul reads 0.22. Only a pegged duty cycle counts.
    proxy_memory_enter: float = 0.95
    proxy_memory_exit: float = 0.85
    # GPM SM_UTIL (or NVML gpu util): a large bf16 matmul reads 0.95.
    compute_enter: float = 0.85
    compute_exit: float = 0.70
    hold_s: float = 0.5

    def enter(self, resource: str, proxy: bool = False) -> float:
        if resource == "memory" and proxy:
            return self.proxy_memory_enter
        return float(getattr(self, f"{resource}_enter"))

    def exit(self, resource: str, proxy: bool = False) -> float:
        if resource == "memory" and proxy:
            return self.proxy_memory_exit
        return float(getattr(self, f"{resource}_exit"))


DEFAULT_THRESHOLDS = Thresholds()


@dataclass(frozen=True, slots=True)
class Utilisation:
    """One GPU's utilisation of each resource for one tick (None = unknown)."""

    link: float | None
    link_bus: str | None  # "pcie" | "nvlink"
    link_dir: str | None  # "tx" | "rx"
    link_Bps: float | None
    link_ceiling_Bps: float | None
    memory: float | None
    memory_proxy: bool
    compute: float | None


def pcie_ceiling_Bps(info: GpuInfo | None, sample: GpuSample | None = None) -> tuple[float | None, str]:
    """The denominator for PCIe use and what it is ("measured" or "theoretical").

    The tick's own gen x width wins over the header's when present, because
    links retrain; a calibrated ceiling is used unless the link is now narrower.
    """
    theo = None
    if sample is not None and sample.link_gen is not None and sample.link_width is not None:
        theo = pcie_capacity_Bps(sample.link_gen, sample.link_width)
    if theo is None and info is not None:
        theo = info.link.capacity_Bps
    measured = info.link.measured_Bps if info is not None else None
    if measured is not None and (theo is None or measured <= theo):
        return measured, "measured"
    return theo, "theoretical"


def utilisation(info: GpuInfo | None, s: GpuSample) -> Utilisation:
    """Fractions of each resource's ceiling used in this tick."""
    link = link_Bps = ceiling = None
    bus = direction = None
    pc, _ = pcie_ceiling_Bps(info, s)
    if pc:
        for d, v in (("rx", s.pcie_rx_Bps), ("tx", s.pcie_tx_Bps)):
            if v is not None and (link is None or v / pc > link):
                link, link_Bps, ceiling, bus, direction = v / pc, v, pc, "pcie", d
    nc = info.nvlink_capacity_Bps if info is not None else None
    if nc:
        for d, v in (("rx", s.nvlink_rx_Bps), ("tx", s.nvlink_tx_Bps)):
            if v is not None and (link is None or v / nc > link):
                link, link_Bps, ceiling, bus, direction = v / nc, v, nc, "nvlink", d
    # A GPU with GPM never mixes in the duty-cycle proxy: a missing GPM window
    # stays unknown rather than switching meaning from tick to tick.
    if s.dram_bw_util is not None or (info is not None and info.metrics_source == "gpm"):
        mem, proxy = s.dram_bw_util, False
    else:
        mem, proxy = s.mem_busy, s.mem_busy is not None
    return Utilisation(link, bus, direction, link_Bps, ceiling, mem, proxy, s.sm_util)


@dataclass
class Event:
    """A period during which one resource of one GPU was saturated."""

    gpu: int
    resource: str
    start: float
    end: float | None = None  # None while still open
    peak_util: float = 0.0
    sum_util: float = 0.0
    n: int = 0
    proxy: bool = False
    # Link only: which bus and direction carried the peak, and its rate.
    bus: str | None = None
    direction: str | None = None
    peak_Bps: float | None = None
    directions: set[str] = field(default_factory=set)
    phases: dict[str, int] = field(default_factory=dict)

    @property
    def mean_util(self) -> float:
        return self.sum_util / self.n if self.n else 0.0

    @property
    def phase(self) -> str | None:
        """The engine phase (or recording label) that dominated the event."""
        return max(self.phases, key=self.phases.__getitem__) if self.phases else None

    @property
    def direction_label(self) -> str | None:
        if not self.directions:
            return None
        return "both" if len(self.directions) > 1 else next(iter(self.directions))

    def to_json(self) -> dict[str, Any]:
        return {
            "gpu": self.gpu,
            "resource": self.resource,
            "start": self.start,
            "end": self.end,
            "peak_util": self.peak_util,
            "mean_util": self.mean_util,
            "basis": "proxy" if self.proxy else "measured",
            "bus": self.bus,
            "direction": self.direction_label,
            "peak_Bps": self.peak_Bps,
            "phase": self.phase,
        }


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


class GpuVerdictTracker:
    """Feeds one GPU's ticks through the hysteresis rules; emits events."""

    def __init__(self, info: GpuInfo | None, index: int, thresholds: Thresholds = DEFAULT_THRESHOLDS) -> None:
        self.info = info
        self.index = index
        self.th = thresholds
        self._trackers = {r: _ResourceTracker(r) for r in RESOURCES}
        self.verdict = "none"
        self.last_util: Utilisation | None = None

    def update(self, t: float, s: GpuSample, phase: str | None = None) -> tuple[str, list[Event], list[Event]]:
        """Feed one tick. Returns (verdict, events opened, events closed)."""
        u = utilisation(self.info, s)
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
