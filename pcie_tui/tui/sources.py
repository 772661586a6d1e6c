"""Where each figure on screen comes from, per GPU, from the header's metrics_source."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from pcie_tui.core import metrics
from pcie_tui.core.ceiling import pinned_ceiling
from pcie_tui.core.model import GpuInfo, SessionHeader
from pcie_tui.engines import registry
from pcie_tui.tui import fmt


@dataclass(frozen=True, slots=True)
class FigureSource:
    figure: str
    source: str
    units: str
    window: str


def _interval(header: SessionHeader) -> str:
    return f"{header.interval_s:g} s" if header.interval_s else "one tick"


# The ``?`` page's position of its derived rows among the metrics table's (``Metric.page``).
BACKEND_UNKNOWN_PAGE = 45
LINK_SHARE_PAGE = 50


# Where the headline comes from (the ? page).
HEADLINE_SOURCE = (
    "pcie_tui.analyze.attribution: each tick link-saturated, transfer-bound (GPU idle, host<->GPU traffic "
    "above the transfer floor), host-bound (GPU idle, bus quiet, work in flight), memory, compute or idle; "
    "the headline names the current phase's most common bound (after 1 s of it) with the medians of its "
    "ticks so far, once per second by the one analysis report uses (idle now: the longest phase of work "
    "so far; once the source ended: the report's headline word for word) (docs/attribution.md). "
)


def figure_sources(header: SessionHeader, info: GpuInfo) -> list[FigureSource]:
    """One row per figure shown in this GPU's panel: the metrics table's sources, then derived figures."""
    src = (info.metrics_source or "").lower()
    tick = _interval(header)
    placed: list[tuple[int, FigureSource]] = []
    for m in metrics.table():
        for r in m.sources:
            if (r.backend is not None and r.backend != src) or (r.nvlink_only and not info.nvlink_capacity_Bps):
                continue
            placed.append((m.page, FigureSource(r.figure, r.what, r.units, r.window.format(tick=tick))))
    if src not in metrics.BACKENDS:
        placed.append(
            (
                BACKEND_UNKNOWN_PAGE,
                FigureSource(
                    "PCIe, DRAM, SM",
                    f"not stated by this source (metrics_source={info.metrics_source!r})",
                    "as labelled on screen",
                    tick,
                ),
            )
        )
    c = pinned_ceiling(info)
    ceiling = c.Bps
    if c.source == "calibrated":
        ceil_src = (
            "measured by `pcie-tui calibrate`: the GPU's own PCIe counter read during timed pinned copies, "
            "the larger direction (the timed payload only where no counter answered), so it includes the "
            "protocol overhead the readings carry, ~5-9 % above the payload rate"
        )
    else:
        ceil_src = (
            f"{c.detail} (theoretical: {fmt.link(info.link.gen, info.link.width)} x per-lane rate after line "
            "coding); a reading above it makes the highest reading the ceiling (observed)"
        )
    share = FigureSource("% of link", f"reading / ceiling {fmt.gbps(ceiling)}; ceiling {ceil_src}", "%", "per tick")
    placed.append((LINK_SHARE_PAGE, share))
    rows = [r for _, r in sorted(placed, key=lambda x: x[0])]  # stable: table order within a position
    rows += [
        FigureSource(
            "verdict / events",
            "pcie_tui.analyze.verdict: enter/exit thresholds held for hold_s (docs/verdict.md)",
            "state",
            "hysteresis, per tick",
        ),
        FigureSource(
            "headline",
            f"{HEADLINE_SOURCE}{_ceilings_text(info)}. The fix comes from the engine's command line, environment and load-time log "
            "(pcie_tui/engines). With no phases (GPU only) or before the first phase of work it shows the hottest "
            "GPU's verdict instead (e.g. GPU0 LINK SATURATED, or nothing saturated)",
            "bound, % of the phase's time",
            "every tick of that phase so far (all its stretches)",
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
