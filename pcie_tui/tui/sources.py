"""Where each figure on screen comes from, per GPU, from the header's metrics_source."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from pcie_tui.analyze.verdict import pcie_ceiling_Bps
from pcie_tui.engines import registry
from pcie_tui.model import GpuInfo, SessionHeader
from pcie_tui.tui import fmt


@dataclass(frozen=True, slots=True)
class FigureSource:
    figure: str
    source: str
    units: str
    window: str


def _interval(header: SessionHeader) -> str:
    return f"{header.interval_s:g} s" if header.interval_s else "one tick"


def figure_sources(header: SessionHeader, info: GpuInfo) -> list[FigureSource]:
    """One row per figure shown in this GPU's panel."""
    src = (info.metrics_source or "").lower()
    tick = _interval(header)
    rows: list[FigureSource] = []
    if src == "gpm":
        gpm_win = f"one tick ({tick}) between two GPM samples"
        rows += [
            FigureSource(
                "PCIe TX", "GPM NVML_GPM_METRIC_PCIE_TX_PER_SEC (leaving the GPU)", "MiB/s x 2^20 -> B/s", gpm_win
            ),
            FigureSource(
                "PCIe RX", "GPM NVML_GPM_METRIC_PCIE_RX_PER_SEC (into the GPU)", "MiB/s x 2^20 -> B/s", gpm_win
            ),
            FigureSource(
                "DRAM BW",
                "GPM NVML_GPM_METRIC_DRAM_BW_UTIL (an empty GPM window shows the previous reading up to 0.5 s, then n/a)",
                "% of theoretical DRAM bandwidth",
                gpm_win,
            ),
            FigureSource("SM", "GPM NVML_GPM_METRIC_SM_UTIL", "% of SMs busy", gpm_win),
        ]
        if info.nvlink_capacity_Bps:
            rows.append(
                FigureSource(
                    "NVLink TX/RX",
                    "GPM NVML_GPM_METRIC_NVLINK_TOTAL_TX_PER_SEC / _RX_PER_SEC",
                    "MiB/s x 2^20 -> B/s",
                    gpm_win,
                )
            )
    elif src == "nvml":
        rows += [
            FigureSource(
                "PCIe TX", "nvmlDeviceGetPcieThroughput(NVML_PCIE_UTIL_TX_BYTES)", "KB/s x 1024 -> B/s", "20 ms"
            ),
            FigureSource(
                "PCIe RX", "nvmlDeviceGetPcieThroughput(NVML_PCIE_UTIL_RX_BYTES)", "KB/s x 1024 -> B/s", "20 ms"
            ),
            FigureSource(
                "mem busy (proxy)",
                "nvmlDeviceGetUtilizationRates().memory (no GPM on this GPU)",
                "% of time memory was read or written (a duty cycle, not bandwidth)",
                "driver sample period (1/6 s to 1 s)",
            ),
            FigureSource(
                "SM",
                "nvmlDeviceGetUtilizationRates().gpu",
                "% of time any kernel ran (not SM occupancy)",
                "driver sample period (1/6 s to 1 s)",
            ),
        ]
        if info.nvlink_capacity_Bps:
            rows.append(
                FigureSource("NVLink TX/RX", "nvmlDeviceGetFieldValues NVLink throughput counters", "B/s", tick)
            )
    else:
        rows.append(
            FigureSource(
                "PCIe, DRAM, SM",
                f"not stated by this source (metrics_source={info.metrics_source!r})",
                "as labelled on screen",
                tick,
            )
        )
    ceiling, kind = pcie_ceiling_Bps(info)
    if kind == "measured":
        ceil_src = "measured by `pcie-tui calibrate` (timed pinned copies, payload per direction)"
    else:
        ceil_src = f"theoretical: {fmt.link(info.link.gen, info.link.width)} x per-lane rate after line coding"
    rows += [
        FigureSource("% of link", f"reading / ceiling {fmt.gbps(ceiling)}; ceiling {ceil_src}", "%", "per tick"),
        FigureSource(
            "link gen/width",
            "nvmlDeviceGetCurrPcieLinkGeneration, nvmlDeviceGetCurrPcieLinkWidth; max: "
            "nvmlDeviceGetMaxPcieLinkGeneration, nvmlDeviceGetMaxPcieLinkWidth",
            "PCIe generation, lanes",
            "per tick when the source reports it, else at session start",
        ),
        FigureSource("mem used", "nvmlDeviceGetMemoryInfo().used / .total", "bytes -> GiB (2^30)", "instant"),
        FigureSource("power", "nvmlDeviceGetPowerUsage", "mW -> W", "driver average (about 1 s)"),
        FigureSource(
            "verdict / events",
            "pcie_tui.analyze.verdict: enter/exit thresholds held for hold_s (docs/verdict.md)",
            "state",
            "hysteresis, per tick",
        ),
        FigureSource(
            "headline",
            "pcie_tui.analyze.attribution: each tick link-saturated, transfer-bound (GPU idle, host<->GPU traffic "
            "above the transfer floor), host-bound (GPU idle, bus quiet, work in flight), memory, compute or idle; "
            f"the current phase's most common bound, with running means (docs/attribution.md). {_ceilings_text(info)}. "
            "The fix comes from the engine's command line, environment and load-time log (pcie_tui/engines)",
            "bound, % of the phase's time",
            "since the phase began",
        ),
    ]
    return rows


def _ceilings_text(info: GpuInfo) -> str:
    from pcie_tui.analyze.attribution import ceilings

    c = ceilings(info)
    return (
        f"Ceilings: pinned {fmt.gbps(c.pinned_Bps)} ({c.pinned_source}), "
        f"pageable {fmt.gbps(c.pageable_Bps)} ({c.pageable_source})"
    )


def engine_kind(engine: Any, header: SessionHeader) -> str | None:
    """The attached engine's kind (its registry name), from the latest tick or the header."""
    kind = getattr(engine, "kind", None)
    if not kind and isinstance(header.engine, dict):
        kind = header.engine.get("kind")
    return str(kind) if kind else None


def engine_sources(kind: str | None, stats: dict[str, Any] | None, window_s: float | None) -> list[FigureSource]:
    """One row per figure of the engine panel (the keys of pcie_tui.analyze.engine's snapshot)."""
    win = f"the last {window_s:g} s" if window_s else "the statistics window"
    stats = stats or {}
    method = stats.get("quantile_method")
    rate_source = stats.get("rate_source")
    kind = (kind or "").lower()
    rows: list[FigureSource] = []
    eng = registry.get(kind)
    given = eng.sources(win) if eng is not None else []
    if given:
        rows += [FigureSource(*r) for r in given]
    else:
        rows.append(
            FigureSource(
                "engine figures",
                f"engine kind {kind or 'not stated'}: as the engine reports them",
                "as labelled on screen",
                win,
            )
        )
    if method:
        rows.append(FigureSource("quantiles now", str(method), "s / ms (TTFT, ITL, prefill, decode, queue)", win))
    if rate_source:
        rows.append(FigureSource("token rates now", str(rate_source), "tokens/s", win))
    return rows
