"""Frozen per-tick snapshots shared by every layer.

Units are in the names: ``_Bps`` bytes per second, ``_util`` a fraction 0..1,
``_s`` seconds, ``_bytes`` bytes, ``_W`` watts.  ``None`` always means
"not available from this source", never zero.
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields
from typing import Any

from pcie_tui.core import metrics

# Per-lane payload rate after line coding, bytes/s per direction (GB = 1e9 B).
# Gen1/2 use 8b/10b, Gen3+ 128b/130b; Gen6 is PAM4 with FLIT (~242b/256b).
PCIE_LANE_Bps: dict[int, float] = {
    1: 2.5e9 * 0.8 / 8,
    2: 5.0e9 * 0.8 / 8,
    3: 8.0e9 * 128 / 130 / 8,
    4: 16.0e9 * 128 / 130 / 8,
    5: 32.0e9 * 128 / 130 / 8,
    6: 64.0e9 * 242 / 256 / 8,
}


def pcie_capacity_Bps(gen: int | None, width: int | None) -> float | None:
    """Theoretical per-direction capacity of a PCIe link, or None if unknown."""
    if gen is None or width is None or gen not in PCIE_LANE_Bps or width <= 0:
        return None
    return PCIE_LANE_Bps[gen] * width


@dataclass(frozen=True, slots=True)
class LinkInfo:
    """PCIe link of one GPU as read at session start."""

    gen: int | None
    width: int | None
    max_gen: int | None
    max_width: int | None
    # Per direction, theoretical, from the current gen x width.
    capacity_Bps: float | None
    # Achievable rate measured by ``pcie-tui calibrate`` (the counter's reading on saturating pinned
    # copies, per direction), if any.
    measured_Bps: float | None = None
    # The same on pageable host memory (driver-staged copies), if calibrated.
    measured_pageable_Bps: float | None = None

    @property
    def max_capacity_Bps(self) -> float | None:
        return pcie_capacity_Bps(self.max_gen, self.max_width)

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "gen": self.gen,
            "width": self.width,
            "max_gen": self.max_gen,
            "max_width": self.max_width,
            "capacity_Bps": self.capacity_Bps,
        }
        if self.measured_Bps is not None:
            out["measured_Bps"] = self.measured_Bps
        if self.measured_pageable_Bps is not None:
            out["measured_pageable_Bps"] = self.measured_pageable_Bps
        return out

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> LinkInfo:
        return cls(
            gen=d.get("gen"),
            width=d.get("width"),
            max_gen=d.get("max_gen"),
            max_width=d.get("max_width"),
            capacity_Bps=d.get("capacity_Bps"),
            measured_Bps=d.get("measured_Bps"),
            measured_pageable_Bps=d.get("measured_pageable_Bps"),
        )


@dataclass(frozen=True, slots=True)
class GpuInfo:
    """Static facts about one GPU."""

    index: int
    uuid: str
    name: str
    pci_bus_id: str
    link: LinkInfo
    memory_total_bytes: int | None
    # Sum over active NVLinks, per direction; None when the GPU has no NVLink.
    nvlink_capacity_Bps: float | None = None
    nvlink_count: int | None = None
    # Where the per-tick metrics come from: "gpm" or "nvml" (duty-cycle proxies).
    metrics_source: str | None = None
    # Highest SM clock the GPU runs at (nvmlDeviceGetMaxClockInfo), MHz; None where unknown (older recordings).
    sm_clock_max_MHz: float | None = None

    def to_json(self) -> dict[str, Any]:
        out = {
            "index": self.index,
            "uuid": self.uuid,
            "name": self.name,
            "pci_bus_id": self.pci_bus_id,
            "link": self.link.to_json(),
            "memory_total_bytes": self.memory_total_bytes,
            "nvlink_capacity_Bps": self.nvlink_capacity_Bps,
            "nvlink_count": self.nvlink_count,
            "metrics_source": self.metrics_source,
        }
        if self.sm_clock_max_MHz is not None:
            out["sm_clock_max_MHz"] = self.sm_clock_max_MHz
        return out

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> GpuInfo:
        return cls(
            index=int(d["index"]),
            uuid=str(d.get("uuid", "")),
            name=str(d.get("name", "")),
            pci_bus_id=str(d.get("pci_bus_id", "")),
            link=LinkInfo.from_json(d.get("link") or {}),
            memory_total_bytes=d.get("memory_total_bytes"),
            nvlink_capacity_Bps=d.get("nvlink_capacity_Bps"),
            nvlink_count=d.get("nvlink_count"),
            metrics_source=d.get("metrics_source"),
            sm_clock_max_MHz=d.get("sm_clock_max_MHz"),
        )


@dataclass(frozen=True, slots=True)
class GpuSample:
    """One GPU's readings for one tick. TX = leaving the GPU.

    The figures and their units are the rows of :mod:`pcie_tui.core.metrics`; a row without an
    attribute here travels in ``extra`` (name -> value, unavailable ones left out). Read any
    row with :meth:`get`.
    """

    index: int
    pcie_tx_Bps: float | None = None
    pcie_rx_Bps: float | None = None
    nvlink_tx_Bps: float | None = None
    nvlink_rx_Bps: float | None = None
    # True DRAM bandwidth use (GPM DRAM_BW_UTIL), fraction of theoretical peak.
    dram_bw_util: float | None = None
    # NVML utilization.memory: a duty cycle (share of time the memory was busy), not bandwidth.
    mem_busy: float | None = None
    sm_util: float | None = None
    mem_used_bytes: int | None = None
    power_W: float | None = None
    # Current link state this tick (idle links train down).
    link_gen: int | None = None
    link_width: int | None = None
    # Heat and clocks (written only when the GPU reports them).
    temp_C: float | None = None
    sm_clock_MHz: float | None = None
    mem_clock_MHz: float | None = None
    # NVML clock-event (throttle) reasons, a bitmask: pcie_tui.core.clocks decodes it.
    clock_events: int | None = None
    power_limit_W: float | None = None
    fan_util: float | None = None
    # Link health, cumulative counts since boot, read about once a second (absent in the ticks between).
    pcie_replays: int | None = None
    aer_correctable: int | None = None
    aer_nonfatal: int | None = None
    aer_fatal: int | None = None
    extra: dict[str, Any] = field(default_factory=dict, hash=False)  # stays hashable, as before

    def get(self, name: str) -> Any:
        """The reading of one metrics-table row (None: unavailable)."""
        return getattr(self, name) if name in _TYPED else self.extra.get(name)

    def to_json(self) -> dict[str, Any]:
        d: dict[str, Any] = {"index": self.index}
        for name, typed, always in _codec():
            v = getattr(self, name) if typed else self.extra.get(name)
            if always or v is not None:
                d[name] = v
        return d

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> GpuSample:
        extra = {n: v for n in _extra_names() if (v := d.get(n)) is not None}
        return cls(index=int(d["index"]), **{n: d.get(n) for n in TYPED_METRICS}, extra=extra)


# The metrics-table rows that are GpuSample attributes, in attribute order.
TYPED_METRICS = tuple(f.name for f in fields(GpuSample))[1:-1]
_TYPED = frozenset(TYPED_METRICS)


@metrics.per_table
def _codec() -> tuple[tuple[str, bool, bool], ...]:
    """(name, typed attribute, written when unavailable) per row, in the order a tick writes them."""
    return tuple((m.name, m.name in TYPED_METRICS, m.always) for m in metrics.table())


@metrics.per_table
def _extra_names() -> tuple[str, ...]:
    """Rows carried in GpuSample.extra."""
    return tuple(m.name for m in metrics.table() if m.name not in TYPED_METRICS)


if tuple(n for n in metrics.names() if n in TYPED_METRICS) != TYPED_METRICS:  # pragma: no cover - a dev error
    raise RuntimeError("GpuSample's metric attributes and their pcie_tui.core.metrics rows must match, in one order")


@dataclass(frozen=True, slots=True)
class EngineSample:
    """The attached inference engine's state for one tick.

    Counters are the engine's cumulative values as read (they reset when the
    engine restarts). ``extra`` carries engine-specific raw readings (histogram
    buckets, slot states, parsed log timings) as plain JSON.
    """

    kind: str  # the engine's registry name (pcie_tui.engines.registry)
    up: bool
    phase: str | None = None  # loading|prefill|decode|mixed|idle|down
    prompt_tokens_total: float | None = None
    generation_tokens_total: float | None = None
    requests_running: float | None = None
    requests_waiting: float | None = None
    error: str | None = None
    extra: dict[str, Any] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        d: dict[str, Any] = {
            "kind": self.kind,
            "up": self.up,
            "phase": self.phase,
            "prompt_tokens_total": self.prompt_tokens_total,
            "generation_tokens_total": self.generation_tokens_total,
            "requests_running": self.requests_running,
            "requests_waiting": self.requests_waiting,
        }
        if self.error is not None:
            d["error"] = self.error
        d.update(self.extra)
        return d

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> EngineSample:
        known = {
            "kind",
            "up",
            "phase",
            "prompt_tokens_total",
            "generation_tokens_total",
            "requests_running",
            "requests_waiting",
            "error",
        }
        return cls(
            kind=str(d.get("kind", "")),
            up=bool(d.get("up", False)),
            phase=d.get("phase"),
            prompt_tokens_total=d.get("prompt_tokens_total"),
            generation_tokens_total=d.get("generation_tokens_total"),
            requests_running=d.get("requests_running"),
            requests_waiting=d.get("requests_waiting"),
            error=d.get("error"),
            extra={k: v for k, v in d.items() if k not in known},
        )


@dataclass(frozen=True, slots=True)
class Sample:
    """Everything read in one tick. ``t`` is unix seconds."""

    t: float
    gpus: tuple[GpuSample, ...]
    engine: EngineSample | None = None
    # Extra top-level keys found in (or destined for) the recording, e.g. phase labels.
    extra: dict[str, Any] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        d: dict[str, Any] = {
            "t": self.t,
            "gpus": [g.to_json() for g in self.gpus],
            "engine": self.engine.to_json() if self.engine is not None else None,
        }
        d.update(self.extra)
        return d

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> Sample:
        eng = d.get("engine")
        return cls(
            t=float(d["t"]),
            gpus=tuple(GpuSample.from_json(g) for g in d.get("gpus") or ()),
            engine=EngineSample.from_json(eng) if isinstance(eng, dict) else None,
            extra={k: v for k, v in d.items() if k not in ("t", "gpus", "engine")},
        )


@dataclass(frozen=True, slots=True)
class SessionHeader:
    """First line of a recording; also what a live source reports at start."""

    created: str
    host: str
    tool_version: str
    gpus: tuple[GpuInfo, ...]
    engine: dict[str, Any] | None = None
    interval_s: float | None = None
    extra: dict[str, Any] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        d: dict[str, Any] = {
            "format": "pcie-tui/recording",
            "version": 1,
            "created": self.created,
            "host": self.host,
            "tool_version": self.tool_version,
            "gpus": [g.to_json() for g in self.gpus],
            "engine": self.engine,
            "interval_s": self.interval_s,
        }
        d.update(self.extra)
        return d

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> SessionHeader:
        known = {"format", "version", "created", "host", "tool_version", "gpus", "engine", "interval_s"}
        return cls(
            created=str(d.get("created", "")),
            host=str(d.get("host", "")),
            tool_version=str(d.get("tool_version", "")),
            gpus=tuple(GpuInfo.from_json(g) for g in d.get("gpus") or ()),
            engine=d.get("engine"),
            interval_s=d.get("interval_s"),
            extra={k: v for k, v in d.items() if k not in known},
        )

    def gpu(self, index: int) -> GpuInfo | None:
        for g in self.gpus:
            if g.index == index:
                return g
        return None
