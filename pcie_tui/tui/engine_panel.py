"""The engine panel: state, token rates, latency quantiles, requests running over time."""

from __future__ import annotations

from typing import Any

from rich.text import Text
from textual.app import ComposeResult
from textual.containers import Vertical
from textual.widgets import Static

from pcie_tui.engines import registry
from pcie_tui.tui import fmt
from pcie_tui.tui.state import Frame
from pcie_tui.tui.widgets import HistoryLegend, MetricRow, set_spark_rows, set_text, spark_share


def _cache_counters(stats: dict[str, Any]) -> str:
    """Prefix-cache hits and KV offload bytes/s, where the engine counts them (vLLM)."""
    out = ""
    if stats.get("prefix_cache_hit_rate") is not None:
        out += f" · prefix hits {fmt.pct(stats['prefix_cache_hit_rate'])}"
    if stats.get("kv_offload_Bps") is not None:
        out += f" · KV offload {fmt.rate(stats['kv_offload_Bps'])}"
    return out


def progress_line(progress: Any) -> str | None:
    """Requests still running as the engine's log says, per slot (llama-server's progress lines: a prompt
    that takes over 3 s, a generation past 100 tokens): "slot 0 prefill 85 % (5,120 tok in 3.0 s, 1,705
    tok/s)"; None where the log has said nothing of a running request."""
    if not isinstance(progress, list):
        return None
    parts = []
    for r in progress:
        if not isinstance(r, dict) or not isinstance(r.get("slot"), int):
            continue
        n, tps = r.get("n_tokens"), r.get("tokens_per_s")
        tok = f"{n:,} tok" if isinstance(n, int) else fmt.NA
        if r.get("phase") == "prefill":
            done = r.get("progress")
            share = fmt.pct(done) if isinstance(done, int | float) else fmt.NA
            t = r.get("t_s")
            took = f" in {fmt.seconds(t)}" if isinstance(t, int | float) else ""
            parts.append(f"slot {r['slot']} prefill {share} ({tok}{took}, {fmt.tokens_per_s(tps)})")
        elif r.get("phase") == "decode":
            parts.append(f"slot {r['slot']} decode {tok} at {fmt.tokens_per_s(tps)}")
    return "log: " + " · ".join(parts) if parts else None


def engine_lines(frame: Frame, wide: bool, stacked: bool = False) -> Text:
    """State, token rates and latency quantiles of the attached engine.

    ``stacked``: the panel stands beside the GPUs (a narrow, tall column), so every
    latency gets its own line, all five of them.
    """
    eng = frame.engine
    if eng is None:
        return Text("no engine attached", style="dim")
    out = Text()
    stats = frame.engine_stats or {}
    out.append(f"{registry.display(eng.kind)} {'up' if eng.up else 'DOWN'}", style="bold" if eng.up else "bold red")
    out.append(f" · phase {eng.phase or fmt.NA}")
    running = stats.get("requests_running", eng.requests_running)
    waiting = stats.get("requests_waiting", eng.requests_waiting)
    reqs = f"running {fmt.count(running, 'req')} · waiting {fmt.count(waiting, 'req')}"
    if frame.engine_stats is not None:
        out.append(f" · KV cache {fmt.pct(stats.get('kv_cache_util'))}{_cache_counters(stats)}")
    out.append(f"\n{reqs}" if stacked else f" · {reqs}")
    err = stats.get("error") or eng.error
    if err:
        out.append(f" · error: {err}", style="red")
    progress = progress_line(eng.extra.get("progress"))
    if progress:
        out.append(f"\n{progress}")
    if frame.placement:
        out.append(f"\nin host memory: {frame.placement}", style="dim")
    if frame.engine_stats is None:
        why = "engine statistics module not in this build" if not frame.engine_stats_available else "no statistics yet"
        out.append(f"\ntoken timing n/a ({why})", style="dim")
        return out
    window = stats.get("window_s")
    out.append(f"\ntokens prompt {fmt.tokens_per_s(stats.get('prompt_tokens_per_s'))}")
    out.append(f" · generated {fmt.tokens_per_s(stats.get('generation_tokens_per_s'))}")
    if window:
        # The rates cover what the window holds so far: less than the window in its first seconds.
        span = stats.get("span_s")
        shown = f"{span:.1f}" if isinstance(span, int | float) and span < window - 0.05 else f"{window:g}"
        out.append(f" (last {shown} s)" if stacked else f" · over the last {shown} s", style="dim")
    for line in _latency_lines(stats, wide, stacked):
        out.append("\n" + line)
    method = stats.get("quantile_method")
    if method:
        if (stacked or not wide) and " (" in method:
            method = method.split(" (")[0] + " (details: ?)"  # one line at 80 columns
        out.append(f"\nquantiles: {method}", style="dim")
    return out


def compact_lines(frame: Frame) -> Text:
    """A short terminal's engine panel: the state on one line, token rates and p50 timing on another (the
    placement, the quantiles' tails and their method are on the ``?`` and ``a`` pages)."""
    eng = frame.engine
    if eng is None:
        return Text("no engine attached", style="dim")
    stats = frame.engine_stats or {}
    out = Text()
    out.append(f"{registry.display(eng.kind)} {'up' if eng.up else 'DOWN'}", style="bold" if eng.up else "bold red")
    running = stats.get("requests_running", eng.requests_running)
    waiting = stats.get("requests_waiting", eng.requests_waiting)
    out.append(f" · {eng.phase or fmt.NA} · running {fmt.count(running, 'req')} · waiting {fmt.count(waiting, 'req')}")
    if frame.engine_stats is None:
        return out

    def p50(k: str) -> str:
        q = stats.get(k)
        return fmt.seconds(q.get("p50")) if isinstance(q, dict) else fmt.NA

    out.append(
        f"\nprompt {fmt.tokens_per_s(stats.get('prompt_tokens_per_s'))} · gen "
        f"{fmt.tokens_per_s(stats.get('generation_tokens_per_s'))} · TTFT p50 {p50('ttft_s')} · ITL p50 {p50('itl_s')}"
    )
    return out


class EnginePanel(Vertical):
    """The engine's state and token timing, and its history shaded by phase: requests running and tokens/s
    (prompt and generated). Beside the GPU panels the two charts grow to the GPU panel's height (:meth:`fit`)."""

    def __init__(self, history_ticks: int) -> None:
        super().__init__(id="engine")
        self.history_ticks = history_ticks
        self.text = Static(Text("no engine attached", style="dim"), classes="engine-text")
        self.running = MetricRow(classes="row-running")
        self.tokens = MetricRow(classes="row-tokens")
        self.legend = HistoryLegend()
        self._most: int | None = None  # the max height set beside the GPUs (None: the stylesheet's)

    @property
    def charts(self) -> tuple[MetricRow, MetricRow]:
        return (self.running, self.tokens)

    def compose(self) -> ComposeResult:
        yield self.text
        yield from self.charts
        yield self.legend

    def on_mount(self) -> None:
        self.border_title = "engine"
        for w in (*self.charts, self.legend):
            w.display = False

    def natural_rows(self, tall: bool) -> int:
        """The panel's rows with its charts one row each (two on a tall screen), as its text is laid out now."""
        if not self.display:
            return 0
        charts = sum(1 for row in self.charts if row.display) * (2 if tall else 1)
        return self.gutter.height + self.text.outer_size.height + charts + (1 if self.legend.display else 0)

    def fit(self, height: int | None, tall: bool) -> None:
        """The charts one row each (two on a tall screen); with ``height`` (the GPU panel's, beside it), as
        tall as makes the panel that high, so no rows stand blank under it. Set only when it changes."""
        shown = [row for row in self.charts if row.display]
        base = len(shown) * (2 if tall else 1)
        rows = base if height is None else max(base, base + height - self.natural_rows(tall))
        for row, n in zip(shown, spark_share(rows, len(shown)), strict=True):
            set_spark_rows(row.spark, n)
        if height != self._most:  # compared with what was set (the stylesheet's 50vh reads back otherwise)
            self._most = height
            self.styles.max_height = height  # beside the GPUs: never taller than their panel

    def show(self, frame: Frame, wide: bool, stacked: bool = False, compact: bool = False) -> None:
        """``compact``: a short terminal (two lines, no history): the rows go to the saturation events."""
        text = compact_lines(frame) if compact else engine_lines(frame, wide, stacked)
        set_text(self.text, text, layout=True)  # line count may change
        attached = not compact and (any(v is not None for v in frame.engine_hist_running) or frame.engine is not None)
        for w in (*self.charts, self.legend):
            if w.display != attached:
                w.display = attached
        if not attached:
            return
        hist = frame.engine_hist_running
        top = max((v for v in hist if v is not None), default=None)
        now = frame.engine.requests_running if frame.engine is not None and frame.engine.up else None
        set_text(self.running.label, f"{'running':<8}{fmt.count(now, 'req'):>10} (top {fmt.count(top, 'req')})")
        self.running.spark.show(
            hist, frame.engine_hist_phase, frame.engine_hist_start, max(top or 0.0, 1.0), self.history_ticks
        )
        self._show_tokens(frame)
        self.legend.show(frame.engine_hist_span_s, frame.engine_hist_phase)

    def _show_tokens(self, frame: Frame) -> None:
        """Prompt and generated tokens a second over the history (the shared timeline's figure)."""
        hist = frame.engine_hist_tokens
        top = max((v for v in hist if v is not None), default=None)
        now = hist[-1] if hist else None
        set_text(self.tokens.label, f"{'tokens':<8}{fmt.tokens_per_s(now):>10} (top {fmt.tokens_per_s(top)})")
        self.tokens.spark.show(hist, frame.engine_hist_phase, frame.engine_hist_start, top or 1.0, self.history_ticks)


def _latency_lines(stats: dict[str, Any], wide: bool, stacked: bool) -> list[str]:
    """TTFT and ITL (wide: prefill, decode, queue and, where the engine times it, slot setup), p50/p95/p99."""
    names = {"ttft_s": "TTFT", "itl_s": "ITL", "prefill_s": "prefill", "decode_s": "decode", "queue_s": "queue"}
    if stats.get("setup_s"):  # engines that time their own work before a request (llama-server's prompt cache)
        names["setup_s"] = "slot setup"
    wide_group = ("prefill_s", "decode_s", "queue_s", *(("setup_s",) if "setup_s" in names else ()))
    groups = [("ttft_s", "itl_s")] + ([wide_group] if wide else [])
    if stacked:
        groups = [(k,) for k in names]
    lines = []
    for keys in groups:
        parts = []
        for k in keys:
            q = stats.get(k)
            if q is None:
                parts.append(f"{names[k]} n/a")
            else:
                parts.append(
                    f"{names[k]} p50 {fmt.seconds(q.get('p50'))} p95 {fmt.seconds(q.get('p95'))}"
                    f" p99 {fmt.seconds(q.get('p99'))}"
                )
        lines.append(" · ".join(parts))
    return lines
