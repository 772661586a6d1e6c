"""The per-GPU metrics table: one row per figure a tick records for each GPU.

Each row says what the figure is (recording key, unit, kind), where it comes from (the NVML
call or GPM metric id, worded as the ``?`` page shows it), which values are physical (the
reader's and the collectors' validation), how the TUI shows it and what Prometheus calls it.
These read the table instead of keeping their own lists:

* the recording codec: ``GpuSample.to_json``/``from_json`` (:mod:`pcie_tui.core.model`) and the
  reader's fast path (:mod:`pcie_tui.recording.reader`);
* validation and the analyzer's columns: :mod:`pcie_tui.recording.validate` (``GPU_RULES``,
  ``clean_gpu_dict``, ``clean_gpu_sample``, ``gpu_columns_ok``, ``cached_columns``);
* the TUI: the GPU panel's labels and its figures line (:mod:`pcie_tui.tui.widgets`), the ``?``
  page's per-GPU rows (:func:`pcie_tui.tui.sources.figure_sources`);
* ``export --prometheus``: the per-GPU gauges (:mod:`pcie_tui.export.prometheus`).

A metric whose name is a typed attribute of :class:`pcie_tui.core.model.GpuSample` is read from it;
any other row travels in ``GpuSample.extra`` (a collector passes ``extra={name: value}``).
Rows are in the order a tick writes them; a recording's bytes depend on it, so new rows go last.

This module is the base layer: it imports nothing from pcie_tui.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from dataclasses import dataclass
from typing import TypeVar

MAX_LINK_Bps = 2e12  # no PCIe or NVLink link of today comes near 2 TB/s per direction
UTIL_JITTER = 1.05  # GPM's ratios overshoot a little; up to here is jitter, clamped to 1.0
LINK_WIDTHS = frozenset({1, 2, 4, 8, 12, 16, 32})
# Where a figure can be shown in a GPU panel. Only "figures" is drawn from the table alone
# (``label value``, joined by " · "); the others are rows with their own layout in tui/widgets.py.
PANELS = ("title", "link", "memory", "figures")
KINDS = ("rate", "fraction", "bytes", "watts", "state", "count", "celsius", "clock", "mask")
BACKENDS = ("gpm", "nvml")  # GpuInfo.metrics_source values a Source can name
GPM_WINDOW = "one tick ({tick}) between two GPM samples"


@dataclass(frozen=True, slots=True)
class Source:
    """One row of the ``?`` page: where a figure comes from, for one kind of GPU or any."""

    figure: str  # the row's name on the page
    what: str  # NVML call, GPM metric id, or how it is derived; say so when it is a proxy
    units: str  # the source's unit and the conversion to what is recorded
    window: str  # what one reading spans; "{tick}" stands for the recording interval
    backend: str | None = None  # GpuInfo.metrics_source it applies to ("gpm", "nvml"); None: any GPU
    nvlink_only: bool = False  # listed only for a GPU with NVLink


@dataclass(frozen=True, slots=True)
class Show:
    """How the TUI shows a figure."""

    label: str  # as on screen
    fmt: str  # the function of pcie_tui.tui.fmt that formats one value with its unit
    panel: str = "figures"  # one of PANELS
    of: str | None = None  # a GpuInfo attribute shown after the value as " of <total>"


@dataclass(frozen=True, slots=True)
class Prom:
    """The Prometheus gauge a figure is exported as (one sample per GPU, label ``gpu``)."""

    name: str
    help: str
    labels: tuple[tuple[str, str], ...] = ()  # constant labels that tell rows of one family apart


@dataclass(frozen=True, slots=True)
class Metric:
    """One per-GPU figure of a tick."""

    name: str  # the recording key (and GpuSample attribute, if it has one)
    unit: str  # unit of the recorded value
    kind: str  # one of KINDS
    lo: float  # valid range, inclusive; outside it a value reads as unavailable
    hi: float
    integer: bool = False  # an integral float is taken as the integer; a fraction is wrong-typed
    clamp: float | None = None  # values in (clamp, hi] are jitter: read as clamp, silently
    allowed: frozenset[int] | None = None  # the only values in range that are valid
    always: bool = True  # written in every tick (null when unavailable); False: only when known
    show: Show | None = None
    sources: tuple[Source, ...] = ()
    page: int = 90  # position among the ``?`` page's rows (the derived "% of link" row is at 50)
    prom: Prom | None = None


_RATE = "pcie_link_rate_bytes_per_second"
_RATE_HELP = "link traffic, bytes/s per direction (tx = leaving the GPU)"
_DRIVER_PERIOD = "driver sample period (1/6 s to 1 s)"
_HEALTH = "every second (link health; ticks between reads leave it out)"


def _rate(name: str, bus: str, d: str, label: str, page: int, sources: tuple[Source, ...]) -> Metric:
    prom = Prom(_RATE, _RATE_HELP, (("bus", bus), ("direction", d)))
    panel = Show(label, "rate", "link")
    return Metric(name, "B/s", "rate", 0.0, MAX_LINK_Bps, show=panel, sources=sources, page=page, prom=prom)


def _util(name: str, unit: str, show: Show, sources: tuple[Source, ...], page: int, prom: Prom) -> Metric:
    return Metric(name, unit, "fraction", 0.0, UTIL_JITTER, clamp=1.0, show=show, sources=sources, page=page, prom=prom)


_BUILTIN: tuple[Metric, ...] = (
    _rate(
        "pcie_tx_Bps", "pcie", "tx", "PCIe TX", 10,
        (
            Source("PCIe TX", "GPM NVML_GPM_METRIC_PCIE_TX_PER_SEC (leaving the GPU)", "MiB/s x 2^20 -> B/s",
                   GPM_WINDOW, "gpm"),
            Source("PCIe TX", "nvmlDeviceGetPcieThroughput(NVML_PCIE_UTIL_TX_BYTES)", "KB/s x 1024 -> B/s", "20 ms",
                   "nvml"),
        ),
    ),
    _rate(
        "pcie_rx_Bps", "pcie", "rx", "PCIe RX", 11,
        (
            Source("PCIe RX", "GPM NVML_GPM_METRIC_PCIE_RX_PER_SEC (into the GPU)", "MiB/s x 2^20 -> B/s",
                   GPM_WINDOW, "gpm"),
            Source("PCIe RX", "nvmlDeviceGetPcieThroughput(NVML_PCIE_UTIL_RX_BYTES)", "KB/s x 1024 -> B/s", "20 ms",
                   "nvml"),
        ),
    ),
    _rate(
        "nvlink_tx_Bps", "nvlink", "tx", "NVLink", 40,
        (
            Source("NVLink TX/RX", "GPM NVML_GPM_METRIC_NVLINK_TOTAL_TX_PER_SEC / _RX_PER_SEC", "MiB/s x 2^20 -> B/s",
                   GPM_WINDOW, "gpm", nvlink_only=True),
            Source("NVLink TX/RX", "nvmlDeviceGetFieldValues NVLink throughput counters", "B/s", "{tick}", "nvml",
                   nvlink_only=True),
        ),
    ),
    _rate("nvlink_rx_Bps", "nvlink", "rx", "NVLink", 40, ()),  # on the page with nvlink_tx_Bps
    _util(
        "dram_bw_util", "fraction of peak DRAM bandwidth", Show("DRAM BW", "pct", "memory"),
        (
            Source("DRAM BW", "GPM NVML_GPM_METRIC_DRAM_BW_UTIL (an empty GPM window shows the previous reading up "
                   "to 0.5 s, then n/a)", "% of theoretical DRAM bandwidth", GPM_WINDOW, "gpm"),
        ),
        20, Prom("pcie_dram_bandwidth_util_ratio", "DRAM bandwidth used, fraction of peak (GPM DRAM_BW_UTIL)"),
    ),
    _util(
        "mem_busy", "fraction of time (duty cycle)", Show("mem busy", "pct", "memory"),
        (
            Source("mem busy (proxy)", "nvmlDeviceGetUtilizationRates().memory (no GPM on this GPU)",
                   "% of time memory was read or written (a duty cycle, not bandwidth)", _DRIVER_PERIOD, "nvml"),
        ),
        20, Prom("pcie_memory_busy_duty_ratio", "NVML memory utilization: a duty cycle, NOT bandwidth"),
    ),
    _util(
        "sm_util", "fraction", Show("SM", "pct"),
        (
            Source("SM", "GPM NVML_GPM_METRIC_SM_UTIL", "% of SMs busy", GPM_WINDOW, "gpm"),
            Source("SM", "nvmlDeviceGetUtilizationRates().gpu", "% of time any kernel ran (not SM occupancy)",
                   _DRIVER_PERIOD, "nvml"),
        ),
        30, Prom("pcie_sm_util_ratio", "SM utilisation, 0..1 (GPM SM_UTIL, else NVML gpu utilization)"),
    ),
    Metric(
        "mem_used_bytes", "bytes", "bytes", 0.0, float(1 << 50), integer=True,
        show=Show("mem used", "gib", of="memory_total_bytes"),
        sources=(Source("mem used", "nvmlDeviceGetMemoryInfo().used / .total", "bytes -> GiB (2^30)", "instant"),),
        page=70, prom=Prom("pcie_memory_used_bytes", "GPU memory in use"),
    ),
    Metric(
        "power_W", "W", "watts", 0.0, 10_000.0, show=Show("power", "watts"),
        sources=(Source("power", "nvmlDeviceGetPowerUsage", "mW -> W", "driver average (about 1 s)"),),
        page=80, prom=Prom("pcie_power_watts", "board power draw"),
    ),
    Metric(
        "link_gen", "PCIe generation", "state", 1.0, 6.0, integer=True, always=False,
        show=Show("PCIe", "link", "title"),
        sources=(
            Source("link gen/width", "nvmlDeviceGetCurrPcieLinkGeneration, nvmlDeviceGetCurrPcieLinkWidth; max: "
                   "nvmlDeviceGetMaxPcieLinkGeneration, nvmlDeviceGetMaxPcieLinkWidth", "PCIe generation, lanes",
                   "per tick when the source reports it, else at session start"),
        ),
        page=60, prom=Prom("pcie_link_gen", "PCIe generation the link is trained at now"),
    ),
    Metric(
        "link_width", "lanes", "state", 1.0, 32.0, integer=True, allowed=LINK_WIDTHS, always=False,
        show=Show("PCIe", "link", "title"), page=60,  # on the page with link_gen
        prom=Prom("pcie_link_width", "PCIe lanes the link is trained at now"),
    ),
    # Heat and clocks (issue 25): read every tick where the GPU reports them, written only when known.
    Metric(
        "temp_C", "degrees Celsius", "celsius", 0.0, 200.0, always=False,
        sources=(Source("temperature", "nvmlDeviceGetTemperature(NVML_TEMPERATURE_GPU)", "degrees C", "instant"),),
        page=81, prom=Prom("pcie_gpu_temperature_celsius", "GPU die temperature"),
    ),
    Metric(
        "sm_clock_MHz", "MHz", "clock", 0.0, 10_000.0, always=False,
        sources=(Source("SM / memory clock", "nvmlDeviceGetClockInfo(NVML_CLOCK_SM / NVML_CLOCK_MEM); max: "
                        "nvmlDeviceGetMaxClockInfo(NVML_CLOCK_SM)", "MHz", "instant"),),
        page=82, prom=Prom("pcie_gpu_clock_mhz", "current clock, MHz", (("clock", "sm"),)),
    ),
    Metric(
        "mem_clock_MHz", "MHz", "clock", 0.0, 40_000.0, always=False, page=82,  # on the page with sm_clock_MHz
        prom=Prom("pcie_gpu_clock_mhz", "current clock, MHz", (("clock", "mem"),)),
    ),
    Metric(
        "clock_events", "NVML clock-event reasons bitmask", "mask", 0.0, float(1 << 32), integer=True, always=False,
        sources=(Source("clock events", "nvmlDeviceGetCurrentClocksEventReasons (older drivers: "
                        "nvmlDeviceGetCurrentClocksThrottleReasons)", "bitmask, decoded by name (power cap, SW/HW "
                        "thermal, HW slowdown, power brake, sync boost, idle, app/display clocks)",
                        "instant"),),
        page=83,
    ),
    Metric(
        "power_limit_W", "W", "watts", 0.0, 10_000.0, always=False,
        sources=(Source("power limit", "nvmlDeviceGetEnforcedPowerLimit", "mW -> W", "instant"),),
        page=84, prom=Prom("pcie_power_limit_watts", "enforced board power limit"),
    ),
    Metric(
        "fan_util", "fraction of maximum fan speed", "fraction", 0.0, UTIL_JITTER, clamp=1.0, always=False,
        sources=(Source("fan", "nvmlDeviceGetFanSpeed (absent on passively cooled GPUs)", "% -> fraction",
                        "instant"),),
        page=85, prom=Prom("pcie_fan_speed_ratio", "fan speed, fraction of its maximum (where the GPU has a fan)"),
    ),
    Metric(
        "pcie_replays", "count since boot", "count", 0.0, float(1 << 50), integer=True, always=False,
        sources=(Source("PCIe replays", "nvmlDeviceGetPcieReplayCounter (link-level retransmissions)", "count",
                        _HEALTH),),
        page=86, prom=Prom("pcie_link_replays", "PCIe replay counter since boot (NVML)"),
    ),
    *(
        Metric(
            f"aer_{kind}", "count since boot", "count", 0.0, float(1 << 50), integer=True, always=False,
            sources=(Source("AER errors", "sysfs /sys/bus/pci/devices/<bdf>/aer_dev_correctable, _nonfatal, _fatal "
                            "(TOTAL_ERR_*; absent where not readable)", "count", _HEALTH),) if kind == "correctable" else (),
            page=87, prom=Prom("pcie_aer_errors", "PCIe AER errors reported by the GPU since boot (sysfs)",
                               (("severity", kind),)),
        )
        for kind in ("correctable", "nonfatal", "fatal")
    ),
)  # fmt: skip

GPU_METRICS: tuple[Metric, ...] = _BUILTIN
_by_name: dict[str, Metric] = {m.name: m for m in GPU_METRICS}
_cache: dict[object, object] = {}
T = TypeVar("T")


def metric(name: str) -> Metric:
    """The row of one recording key (KeyError for a name the table lacks)."""
    return _by_name[name]


def table() -> tuple[Metric, ...]:
    """Every row, in recording order (read it through here: :func:`register` replaces the tuple)."""
    return GPU_METRICS


def names() -> tuple[str, ...]:
    return tuple(m.name for m in GPU_METRICS)


def per_table(fn: Callable[[], T]) -> Callable[[], T]:
    """``fn()`` computed once per state of the table (recomputed after :func:`register`)."""

    @functools.wraps(fn)
    def cached() -> T:
        try:
            return _cache[fn]  # type: ignore[return-value]
        except KeyError:
            v = _cache[fn] = fn()
            return v

    return cached


def _check(m: Metric) -> None:
    why = None
    if m.kind not in KINDS:
        why = f"kind {m.kind!r} is not one of {', '.join(KINDS)}"
    elif not m.lo <= m.hi:
        why = "lo > hi"
    elif m.clamp is not None and not m.lo <= m.clamp <= m.hi:
        why = "clamp outside lo..hi"
    elif m.show is not None and m.show.panel not in PANELS:
        why = f"panel {m.show.panel!r} is not one of {', '.join(PANELS)}"
    elif m.name in ("index", "extra") or not m.name.isidentifier():
        why = "not a usable recording key"
    if why is not None:
        raise ValueError(f"metric {m.name!r}: {why}")


def register(m: Metric) -> Metric:
    """Add a row at the end of the table (a new metric; its collector fills ``GpuSample.extra``)."""
    global GPU_METRICS
    _check(m)
    if m.name in _by_name:
        raise ValueError(f"metric {m.name!r} is already in the table")
    GPU_METRICS = (*GPU_METRICS, m)
    _by_name[m.name] = m
    _cache.clear()
    return m


def unregister(name: str) -> None:
    """Take a row added by :func:`register` out again (the built-in rows stay)."""
    global GPU_METRICS
    if any(m.name == name for m in _BUILTIN):
        raise ValueError(f"metric {name!r} is built in")
    GPU_METRICS = tuple(m for m in GPU_METRICS if m.name != name)
    _by_name.pop(name, None)
    _cache.clear()


for _m in _BUILTIN:
    _check(_m)
