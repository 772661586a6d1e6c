"""One time axis for the link, DRAM and token timing (terminals of 200x50 and up).

The GPU panels chart each figure on its own; here the link's TX and RX against its ceiling, DRAM
bandwidth and the engine's tokens/s are stacked on one shared time axis (the same ticks in the same
cells, shaded by phase), so "the link, not memory" or "tokens stall while the link is full" is read
down one column. With several GPUs it follows the one whose link was busiest over the history shown.
"""

from __future__ import annotations

from collections.abc import Sequence

from rich.text import Text
from textual.app import ComposeResult
from textual.containers import Vertical
from textual.widgets import Static

from pcie_tui.tui import fmt, spark
from pcie_tui.tui.frame import Frame, GpuView
from pcie_tui.tui.widgets import MetricRow, set_border_title, set_spark_rows, set_text, spark_share

LABEL_CELLS = 24
# A tick mark every this many seconds: the smallest with room. Past a minute in whole minutes, past an hour in
# quarter and whole hours, so a session hours long reads "-45 min", "-1:30 h" (fmt.ago), not "-2580 s".
AXIS_STEP_S = (1, 2, 5, 10, 15, 30, 60, 120, 300, 600, 900, 1800, 3600, 7200, 10800, 21600, 43200, 86400)
AXIS_GAP = 2  # blank cells at least between two labels


def busiest(gpus: Sequence[GpuView]) -> GpuView | None:
    """The GPU whose link (either direction, against its ceiling) peaked highest over the history shown."""

    def peak(g: GpuView) -> float:
        if not g.ceiling_Bps:
            return -1.0
        top = max((v for v in (*g.hist_tx, *g.hist_rx) if v is not None), default=-1.0)
        return top / g.ceiling_Bps

    return max(gpus, key=peak, default=None)  # the lowest index among equals


def axis(width: int, history_ticks: int, n_ticks: int, interval_s: float) -> Text:
    """The time axis under the charts (their cells: :func:`pcie_tui.tui.spark.runs`): "now" at the right
    edge, then how long ago, every few seconds (minutes, hours), each label ending at its moment's cell and
    AXIS_GAP blank cells at least from its neighbours (a label that would come closer is left out)."""
    cell_s = spark.ticks_per_cell(min(n_ticks, history_ticks), width) * interval_s
    room = max(len(fmt.ago(s)) for s in AXIS_STEP_S) + AXIS_GAP  # cells a label and its gap take at most
    step = next((s for s in AXIS_STEP_S if s / cell_s >= room), AXIS_STEP_S[-1])
    line = [" "] * width

    def put(x: int, label: str) -> None:
        start = x - len(label) + 1
        if start >= 0 and all(c == " " for c in line[max(0, start - AXIS_GAP) : x + 1 + AXIS_GAP]):
            line[start : x + 1] = list(label)

    put(width - 1, "now")
    k = 1
    while (x := width - 1 - round(k * step / cell_s)) >= 0:
        put(x, fmt.ago(k * step))
        k += 1
    return Text("".join(line), style="dim")


class TimelinePanel(Vertical):
    """Link TX, link RX, DRAM and tokens/s of one GPU and the engine, on one time axis."""

    def __init__(self, history_ticks: int) -> None:
        super().__init__(id="timeline")
        self.history_ticks = history_ticks
        self.tx = MetricRow(hot_at=0.70, classes="tl-row")
        self.rx = MetricRow(hot_at=0.70, classes="tl-row")
        self.mem = MetricRow(hot_at=0.70, classes="tl-row")
        self.tokens = MetricRow(classes="tl-row")
        self.axis = Static("", classes="tl-axis")
        self._last: Frame | None = None

    @property
    def rows(self) -> tuple[MetricRow, ...]:
        return (self.tx, self.rx, self.mem, self.tokens)

    def compose(self) -> ComposeResult:
        yield from self.rows
        yield self.axis

    def on_resize(self) -> None:
        """The charts share the panel's rows (the axis keeps one), the first ones a row more where they do
        not divide evenly: no blank row under the axis."""
        for row, n in zip(self.rows, spark_share(self.content_size.height - 1, len(self.rows)), strict=True):
            set_spark_rows(row.spark, n)
        if self._last is not None:
            self.show(self._last)

    def show(self, f: Frame) -> None:
        self._last = f
        g = busiest(f.gpus)
        if g is None:
            return
        many = f" (busiest link of {len(f.gpus)})" if len(f.gpus) > 1 else ""
        set_border_title(self, f"GPU {g.index}{many} · link, DRAM and tokens on one time axis")
        s = g.sample
        ceil = g.ceiling_Bps
        for row, word, value, hist in (
            (self.tx, "link TX", s.pcie_tx_Bps if s else None, g.hist_tx),
            (self.rx, "link RX", s.pcie_rx_Bps if s else None, g.hist_rx),
        ):
            share = fmt.pct(value / ceil) if value is not None and ceil else fmt.NA
            set_text(row.label, f"{word:<8}{fmt.rate(value):>10} {share:>5}")
            row.spark.show(hist, g.hist_phase, g.hist_start, ceil, self.history_ticks)
        word = "MEM busy" if g.memory_proxy else "DRAM BW"
        set_text(self.mem.label, f"{word:<8}{fmt.pct(g.mem_util):>10}")
        self.mem.spark.show(g.hist_mem, g.hist_phase, g.hist_start, 1.0, self.history_ticks)
        self._show_tokens(f, g)
        width = self.tx.spark.size.width
        if width:
            interval = g.hist_span_s / max(1, len(g.hist_tx) - 1) if len(g.hist_tx) > 1 else 0.1
            pad = " " * (self.tx.label.outer_size.width or LABEL_CELLS)
            text = Text(pad)
            text.append_text(axis(width, self.history_ticks, len(g.hist_tx), interval or 0.1))
            set_text(self.axis, text)

    def _show_tokens(self, f: Frame, g: GpuView) -> None:
        """Tokens/s of the engine on the GPU's ticks; without an engine, the phase band alone (no figure)."""
        toks = f.engine_hist_tokens
        if f.engine is None and not any(v is not None for v in toks):
            set_text(self.tokens.label, f"{'phase':<8}{'(no engine)':>16}")
            band = [0.0] * len(g.hist_phase)  # the lowest bar, shaded by each tick's phase
            self.tokens.spark.show(band, g.hist_phase, g.hist_start, 1.0, self.history_ticks)
            return
        now = toks[-1] if toks else None
        top = max((v for v in toks if v is not None), default=None)
        set_text(self.tokens.label, f"{'tokens':<8}{fmt.tokens_per_s(now):>16}")
        # The engine's ticks are the GPU's (one history per tick): the same start, the same cells.
        self.tokens.spark.show(toks, f.engine_hist_phase, f.engine_hist_start, top or 1.0, self.history_ticks)
