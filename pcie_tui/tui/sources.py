"""Where each figure on screen comes from, per GPU, from the header's metrics_source."""

from __future__ import annotations

from collections.abc import Collection
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
NOT_SEEN_PAGE = 1000  # the row naming the figures the session has no reading of: after the table's rows


# Where the headline comes from (the ? page).
HEADLINE_SOURCE = (
    "pcie_tui.analyze.attribution: each tick link-saturated, transfer-bound (GPU idle, host<->GPU traffic "
    "above the transfer floor), host-bound (GPU idle, bus quiet, work in flight), memory, compute or idle; "
    "the headline names the current phase's most common bound (after 1 s of it) with the medians of its "
    "ticks so far, once per second by the one analysis report uses (idle now: the longest phase of work "
    "so far; once the source ended: the report's headline word for word) (docs/attribution.md). "
)


def figure_sources(
    header: SessionHeader, info: GpuInfo, seen: Collection[str] | None = None, whole: bool = False
) -> list[FigureSource]:
    """One row per figure shown in this GPU's panel: the metrics table's sources, then derived figures.

    ``seen``: the metrics-table rows this GPU has a reading of in the session (None: not known, every row
    listed); a figure with none is not given a source but named in one row that says so: not in this
    recording (``whole``: the session is a recording, looked at to its end), else no reading so far.
    """
    placed, missing = _table_rows(header, info, seen)
    if missing:
        placed.append((NOT_SEEN_PAGE, _not_seen_row(missing, whole)))
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


def _has_reading(m: metrics.Metric, seen: Collection[str], info: GpuInfo) -> bool:
    """Whether the session has the figure a row of ``m`` describes: a reading of ``m``, or of a row at its
    page position with no source of its own (mem_clock_MHz beside sm_clock_MHz, the AER severities); the
    link's generation and width also come from the header (the panel's title shows them from there)."""
    if m.name in seen:
        return True
    if m.name == "link_gen" and (info.link.gen is not None or info.link.width is not None):
        return True
    return any(o.page == m.page and not o.sources and o.name in seen for o in metrics.table())


def _table_rows(
    header: SessionHeader, info: GpuInfo, seen: Collection[str] | None
) -> tuple[list[tuple[int, FigureSource]], list[str]]:
    """The metrics table's rows for this GPU at their page positions, and the figures without a reading."""
    src = (info.metrics_source or "").lower()
    tick = _interval(header)
    placed: list[tuple[int, FigureSource]] = []
    missing: list[str] = []
    for m in metrics.table():
        given = [
            r
            for r in m.sources
            if (r.backend is None or r.backend == src) and not (r.nvlink_only and not info.nvlink_capacity_Bps)
        ]
        if seen is not None and given and not _has_reading(m, seen, info):
            missing += [r.figure for r in given if r.figure not in missing]
            continue
        placed += [(m.page, FigureSource(r.figure, r.what, r.units, r.window.format(tick=tick))) for r in given]
    if src not in metrics.BACKENDS:
        why = f"not stated by this source (metrics_source={info.metrics_source!r})"
        placed.append((BACKEND_UNKNOWN_PAGE, FigureSource("PCIe, DRAM, SM", why, "as labelled on screen", tick)))
    placed.append((LINK_SHARE_PAGE, _link_share(info)))
    return placed, missing


def _not_seen_row(missing: list[str], whole: bool) -> FigureSource:
    names = ", ".join(missing)
    if whole:
        return FigureSource(
            "not recorded",
            f"{names}: not in this recording (no tick has a reading of them), so nothing on screen comes from them",
            "",
            "",
        )
    return FigureSource(
        "no reading yet",
        f"{names}: no reading of them in this session so far, so nothing on screen comes from them "
        "(this page names their source once one arrives)",
        "",
        "",
    )


def _link_share(info: GpuInfo) -> FigureSource:
    """The derived "% of link" row: reading / the pinned ceiling, and where that ceiling comes from."""
    c = pinned_ceiling(info)
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
    return FigureSource("% of link", f"reading / ceiling {fmt.gbps(c.Bps)}; ceiling {ceil_src}", "%", "per tick")


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


# The engine panel's figures each source row describes (the keys of pcie_tui.analyze.engine's statistics, the
# ticks' request counts, "placement" for the engine's facts), by the row's figure label in each engine's
# sources(): a row is listed only where the session has a reading of one of them. A label not here (a figure
# this page cannot check) is listed as before.
ENGINE_FIGURE_KEYS: dict[str, tuple[str, ...]] = {
    "tokens prompt / generated": ("prompt_tokens_per_s", "generation_tokens_per_s"),
    "prompt, generation tok/s": ("prompt_tokens_per_s", "generation_tokens_per_s"),
    "TTFT, prefill": ("ttft_s", "prefill_s"),
    "ITL, decode": ("itl_s", "decode_s"),
    "TTFT, ITL": ("ttft_s", "itl_s"),
    "TTFT, ITL, e2e, queue": ("ttft_s", "itl_s", "queue_s"),
    "prefill, decode, queue": ("prefill_s", "decode_s", "queue_s"),
    "queue": ("queue_s",),
    "running, waiting": ("requests_running", "requests_waiting"),
    "KV cache": ("kv_cache_util",),
    "KV cache use": ("kv_cache_util",),
    "prefix hits": ("prefix_cache_hit_rate",),
    "KV offload": ("kv_offload_Bps",),
    "in host memory": ("placement",),
    "model in VRAM": ("models",),
    "model memory not in VRAM": ("models",),
    "GPU layers": ("gpu_layers", "placement"),
    "running, per-request timing": ("requests_running", "ttft_s", "itl_s", "prefill_s", "decode_s"),
    "HiCache host<->GPU": ("hicache",),
    "quantile above the top bucket": ("ttft_s", "itl_s", "queue_s"),
}


NOT_EXPOSED = "not collected by this engine"  # a figure it never reports (not one with no reading yet)


def engine_sources(
    kind: str | None, stats: dict[str, Any] | None, window_s: float | None, seen: Collection[str] | None = None
) -> list[FigureSource]:
    """One row per figure of the engine panel (the keys of pcie_tui.analyze.engine's snapshot).

    ``seen``: the engine figures the session has had a reading of so far (:data:`ENGINE_FIGURE_KEYS`; None: not
    known, every row listed); a row with none is not given a source but named in one row, no reading yet. A
    figure the engine never reports (:attr:`Engine.not_exposed`) keeps its row, saying so and why, whatever
    the session has: no reading will come."""
    win = f"the last {window_s:g} s" if window_s else "the statistics window"
    stats = stats or {}
    method = stats.get("quantile_method")
    rate_source = stats.get("rate_source")
    kind = (kind or "").lower()
    rows: list[FigureSource] = []
    missing: list[str] = []
    eng = registry.get(kind)
    for r in eng.sources(win) if eng is not None else []:
        keys = ENGINE_FIGURE_KEYS.get(r[0])
        if eng is not None and r[0] in eng.not_exposed:
            rows.append(FigureSource(r[0], f"{NOT_EXPOSED}: {r[1]}", r[2], r[3]))
        elif seen is not None and keys is not None and not any(k in seen for k in keys):
            missing.append(r[0])
        else:
            rows.append(FigureSource(*r))
    if eng is None or not (rows or missing):
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
    if missing:
        rows.append(_not_seen_row(missing, whole=False))
    return rows
