"""The immutable snapshot the screen renders: a :class:`Frame` and the views it holds.

:class:`pcie_tui.tui.state.ViewModel` builds these in the worker thread; the UI
thread only reads them. No Textual here.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from pcie_tui.analyze.verdict import DEFAULT_THRESHOLDS, Event, Utilisation
from pcie_tui.core.model import GpuInfo, GpuSample


@dataclass(frozen=True, slots=True)
class EventView:
    """A frozen copy of one saturation event (the analyzer's Event mutates)."""

    key: str
    gpu: int
    resource: str
    start_s: float  # since the session's first tick
    end_s: float | None  # None while open
    peak_util: float
    mean_util: float
    proxy: bool
    bus: str | None
    direction: str | None
    peak_Bps: float | None
    phase: str | None
    # Heat and link-health events (resource: what cut the clocks, "PCIe replays", "AER ...", "PCIe downtrained"):
    # what to show in the peak column ("SM 1,290 MHz", "1,203 at 40.1/s", "Gen3 x8"); None for a saturation event.
    detail: str | None = None

    @classmethod
    def of_health(cls, ev: Any, t0: float) -> EventView:
        """A throttled stretch or a link-health event (:meth:`SessionAnalyzer.health_events`)."""
        return cls(
            key=f"{ev.gpu}/{ev.kind}/{ev.start!r}", gpu=ev.gpu, resource=ev.reason(), start_s=ev.start - t0,
            end_s=None if ev.open else ev.end - t0, peak_util=0.0, mean_util=0.0, proxy=False, bus=None,
            direction=None, peak_Bps=None, phase=ev.phase, detail=ev.detail(),
        )  # fmt: skip

    @classmethod
    def of(cls, ev: Event, t0: float) -> EventView:
        return cls(
            key=f"{ev.gpu}/{ev.resource}/{ev.start!r}",
            gpu=ev.gpu,
            resource=ev.resource,
            start_s=ev.start - t0,
            end_s=None if ev.end is None else ev.end - t0,
            peak_util=ev.peak_util,
            mean_util=ev.mean_util,
            proxy=ev.proxy,
            bus=ev.bus,
            direction=ev.direction_label,
            peak_Bps=ev.peak_Bps,
            phase=ev.phase,
        )


@dataclass(frozen=True, slots=True)
class GpuView:
    """One GPU at the moment of the frame, plus its recent history."""

    index: int
    info: GpuInfo | None
    sample: GpuSample | None
    util: Utilisation | None
    verdict: str  # link | memory | compute | none
    ceiling_Bps: float | None
    ceiling_kind: str  # where the ceiling came from: calibrated | default | observed | unknown (pcie_tui.core.ceiling)
    # Highest reading since the previous frame (ticks can outpace renders).
    peak_tx_Bps: float | None
    peak_rx_Bps: float | None
    open_events: tuple[EventView, ...]
    has_nvlink: bool
    # History: absolute index of the first tick, then one entry per tick.
    hist_start: int
    hist_tx: tuple[float | None, ...]
    hist_rx: tuple[float | None, ...]
    hist_nvlink: tuple[float | None, ...]  # max of both directions
    hist_mem: tuple[float | None, ...]  # per memory_basis: DRAM_BW_UTIL or the memory-busy proxy
    hist_phase: tuple[str | None, ...]
    hist_span_s: float
    # "gpm": true DRAM bandwidth; "proxy": only NVML's memory-busy duty cycle; None: neither.
    memory_basis: str | None = None
    mem_util: float | None = None  # the figure to show for memory_basis
    link_enter: float = DEFAULT_THRESHOLDS.link_enter  # below it an open link event is easing

    @property
    def memory_proxy(self) -> bool:
        return self.memory_basis == "proxy"


@dataclass(frozen=True, slots=True)
class ReplayView:
    position: int  # index of the next tick
    total: int
    speed: float
    paused: bool
    start_t: float
    end_t: float
    current_t: float
    loading: str | None = None  # "loading 37 % of 200 MB" while the recording is still being read


@dataclass(frozen=True, slots=True)
class Frame:
    """Everything one render needs; built in the worker thread."""

    seq: int
    ticks: int  # ticks analysed so far
    t: float | None  # unix time of the latest tick
    t_rel: float | None  # seconds since the first tick
    phase: str | None
    gpus: tuple[GpuView, ...]
    events: tuple[EventView, ...]  # newest last
    events_total: int
    engine: Any  # EngineSample | None (latest tick's)
    engine_stats: dict[str, Any] | None
    engine_stats_available: bool
    replay: ReplayView | None
    ended: bool = False
    # Engine history, one entry per tick like the GPU history: requests running, and the phase.
    engine_hist_start: int = 0
    engine_hist_running: tuple[float | None, ...] = ()
    engine_hist_phase: tuple[str | None, ...] = ()
    engine_hist_span_s: float = 0.0
    engine_hist_tokens: tuple[float | None, ...] = ()  # prompt + generated tokens/s over the last second
    built_s: float = 0.0  # monotonic clock when built (for rate checks; never shown)
    headline: str | None = None  # headline_text(state): one line on what holds things back; None: hide
    placement: str | None = None  # what the engine put in host memory, as its flags/log/API said; None: nothing known
    # The one analysis' findings ("What held each phase back"), the lines report prints; so far while
    # the source runs (answer_final False), the report's own once it ended.
    findings: tuple[str, ...] = ()
    answer_final: bool = False
    # Per GPU index, the metrics-table rows (recording keys) the session has a reading of: the ? page lists
    # the others as not in it. A replay's cover its whole recording once figures_whole; None: not known.
    figures: Mapping[int, frozenset[str]] | None = None
    figures_whole: bool = False
    # The engine panel's figures the session has had a reading of so far (tui.seen.EngineFiguresSeen); None:
    # not known, every engine source listed.
    engine_figures: frozenset[str] | None = None
