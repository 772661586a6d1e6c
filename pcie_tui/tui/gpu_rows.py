"""Many GPUs on one screen: one line per GPU (link TX/RX against the ceiling, DRAM, SM, the verdict).

Where the full GPU panels (:mod:`pcie_tui.tui.gpu_panel`, charts and all) do not fit the rows a terminal
has, every GPU gets one compact line instead, with bars; wide terminals add each GPU's link history as
a one-row sparkline. Where the screen has rows to spare (issue 22: no empty band), each line gets its link
history under it, as many rows as the app gives (:meth:`GpuRows.set_history`), the first GPUs a row more
where they do not divide evenly. Lines that do not fit end in a "+N more" line (up/down scroll them).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import cast

from rich.console import Console
from rich.segment import Segment
from rich.style import Style
from rich.text import Text
from textual.geometry import Region, Size
from textual.strip import Strip
from textual.widget import Widget

from pcie_tui.tui import fmt, spark
from pcie_tui.tui.frame import GpuView
from pcie_tui.tui.widgets import spark_share

Line = tuple[Segment, ...]  # one line of the widget: its runs of text, each in its own style

# The stylesheet's saturation colours (app.tcss), for text drawn here.
VERDICT_STYLE = {"link": "bold #ff2d2d", "memory": "bold #ffb000", "compute": "bold #b48cff", "none": "#5fd75f"}
BAR_STYLE, HOT_STYLE, EMPTY_STYLE = Style(color="#4fc3f7"), Style(color="#ff5252"), Style(color="grey35")
HOT_AT = 0.70  # a bar at or above this share of its ceiling is drawn hot (the panels' sparklines: 0.70)
PARTS = " ▏▎▍▌▋▊▉█"
BAR_MIN, BAR_MAX = 3, 12  # cells of one bar
SPARK_MIN = 16  # a link history narrower than this is left out
DIM, NO_STYLE = Style(dim=True), Style()
HISTORY_LABEL = "  link "  # the first row of a GPU's link history under its line; the others indented as far


def bar(frac: float | None, cells: int) -> Text:
    """A horizontal gauge ``cells`` wide in eighths of a cell; a missing reading is a dim dotted bar."""
    if frac is None:
        return Text("·" * cells, style=EMPTY_STYLE)
    eighths = round(max(0.0, min(frac, 1.0)) * cells * 8)
    full, part = divmod(eighths, 8)
    filled = "█" * full + (PARTS[part] if part and full < cells else "")
    out = Text(filled, style=HOT_STYLE if frac >= HOT_AT else BAR_STYLE)
    out.append("░" * (cells - len(filled)), style=EMPTY_STYLE)
    return out


def verdict_word(g: GpuView) -> str:
    """The verdict in a few cells: LINK RX, DRAM, MEM (the duty-cycle proxy), SM, ok."""
    if g.sample is None:
        return "waiting"
    if g.verdict == "link":
        d = g.util.link_dir if g.util is not None else None
        return f"LINK {(d or '').upper()}".strip()
    if g.verdict == "memory":
        return "MEM" if g.memory_proxy else "DRAM"
    return {"compute": "SM", "none": "ok"}.get(g.verdict, g.verdict)


def _share(v: float | None, ceiling: float | None) -> float | None:
    return v / ceiling if v is not None and ceiling else None


def gpu_row(g: GpuView, width: int, history_ticks: int, inline_history: bool = True) -> Text:
    """One GPU in ``width`` cells: the richest form that fits (rates, name and link history need room;
    ``inline_history``: beside the figures where they leave room, else left out: it is drawn under the line)."""
    s = g.sample
    tx, rx = (s.pcie_tx_Bps, s.pcie_rx_Bps) if s is not None else (None, None)
    mem_word = "MEM" if g.memory_proxy else "DRAM"
    name = (g.info.name if g.info else "").removeprefix("NVIDIA ")[:8]
    metrics = [
        ("TX", _share(tx, g.ceiling_Bps), fmt.rate(tx)),
        ("RX", _share(rx, g.ceiling_Bps), fmt.rate(rx)),
        (mem_word, g.mem_util, None),
        ("SM", s.sm_util if s is not None else None, None),
    ]
    verdict = verdict_word(g)
    for rates, named in ((True, True), (True, False), (False, False)):
        fixed = len(f"GPU {g.index:<2}") + (len(name) + 1 if named else 0) + 3 + max(len(verdict), 7)
        for label, _, rate in metrics:
            fixed += 1 + len(label) + 1 + 1 + 5 + ((1 + 10) if rates and rate is not None else 0)
        cells = (width - fixed) // 4
        if cells >= BAR_MIN or not (rates or named):
            break
    cells = max(1, min(BAR_MAX, cells))
    out = Text(f"GPU {g.index:<2}", style="bold")
    if named:
        out.append(f" {name}")
    for label, frac, rate in metrics:
        out.append(f" {label} ")
        if rates and rate is not None:
            out.append(f"{rate:>10} ")
        out.append_text(bar(frac, cells))
        out.append(f" {fmt.pct(frac):>5}")
    out.append(" · ", style="dim")
    out.append(f"{verdict:<7}", style=VERDICT_STYLE.get(g.verdict, "") if g.sample is not None else "dim")
    room = width - out.cell_len - 6
    if inline_history and room >= SPARK_MIN:
        out.append(" link ", style="dim")
        out.append_text(_link_history(g, room, history_ticks))
    return out


def _link_runs(g: GpuView, width: int, history_ticks: int, rows: int = 1) -> list[list[tuple[str, Style]]]:
    """The busier link direction of each tick over the history, against the ceiling, shaded by phase:
    ``rows`` rows of ``width`` cells, as runs of (text, style) (:func:`pcie_tui.tui.spark.runs`)."""
    tx, rx = g.hist_tx, g.hist_rx
    if len(tx) != len(rx):
        raise ValueError("the TX and RX histories differ in length")
    hist: list[float | None]
    if None in tx or None in rx:
        hist = [a if b is None or (a is not None and a >= b) else b for a, b in zip(tx, rx, strict=True)]
    else:  # no missing reading: the pairwise max in C
        hist = list(map(max, cast("Sequence[float]", tx), cast("Sequence[float]", rx)))
    return spark.runs(hist, g.hist_phase, g.hist_start, width, rows, g.ceiling_Bps, history_ticks, hot_at=HOT_AT)


def _link_history(g: GpuView, width: int, history_ticks: int) -> Text:
    """The link history in one row of ``width`` cells (:func:`_link_runs`)."""
    line = Text()
    for text, style in _link_runs(g, width, history_ticks)[0]:
        line.append(text, style)
    return line


def history_lines(g: GpuView, width: int, history_ticks: int, rows: int) -> list[Line]:
    """A GPU's link history under its line, ``rows`` rows tall, labelled on its first row, dim (as segments:
    a Text of the same runs would only be cut into these again when drawn)."""
    if rows <= 0:
        return []
    pad = len(HISTORY_LABEL)
    out = []
    for i, chart in enumerate(_link_runs(g, max(1, width - pad), history_ticks, rows)):
        label = Segment(HISTORY_LABEL if i == 0 else " " * pad, DIM)
        out.append((label, *(Segment(text, DIM + style) for text, style in chart)))
    return out


class GpuRows(Widget):
    """Every GPU on one line each; ``show`` with the frame's GPU views, ``room`` the lines it may take.

    Drawn line by line (issue 22: with 8 GPUs a Static's whole text was laid out anew twice a second): each
    line is kept as Text and as the Strip drawn from it, and a frame repaints only the lines that changed."""

    def __init__(self, history_ticks: int) -> None:
        super().__init__(id="gpu-rows")
        self.history_ticks = history_ticks
        self.first = 0  # first GPU shown when they do not all fit (up/down move it)
        self.room = 0
        self.history = 0  # rows of link history under the lines, shared by the GPUs shown
        self.lines = 0  # lines shown: one per GPU that fits, and the "+N more" line
        self.complete = True  # every GPU has its line (no "+N more")
        self._rows = -1  # rows of text shown (lines and histories under them)
        self._last: tuple[Sequence[GpuView], int] | None = None
        self._texts: list[Line] = []  # the lines shown
        self._strips: dict[int, Strip] = {}  # the lines drawn, by row, at _strips_width
        self._strips_width = -1
        self._base: Style | None = None  # the widget's own style under the text (looked up once)

    def on_resize(self) -> None:
        if self._last is not None:  # the lines were fitted to the width before: again at this one
            self.show(*self._last)

    def scroll_by(self, lines: int) -> None:
        self.first = max(0, self.first + lines)
        if self._last is not None:
            self.show(*self._last)

    def set_history(self, rows: int) -> None:
        """``rows`` of link history under the lines (the screen's rows to spare); redrawn where it changed."""
        rows = max(0, rows)
        if rows != self.history:
            self.history = rows
            if self._last is not None:
                self.show(*self._last)

    def show(self, gpus: Sequence[GpuView], room: int) -> None:
        self._last = (gpus, room)
        width = max(20, self.content_size.width or self.app.size.width - 4)
        n = len(gpus)
        fit = n if n <= room else max(1, room - 1)  # the last line says how many more
        self.first = max(0, min(self.first, n - fit))
        shown = gpus[self.first : self.first + fit]
        under = spark_share(self.history, len(shown), least=0) if fit == n else [0] * len(shown)
        console = self.app.console
        lines: list[Line] = []
        for g, rows in zip(shown, under, strict=True):
            lines.append(tuple(gpu_row(g, width, self.history_ticks, inline_history=rows == 0).render(console)))
            lines += history_lines(g, width, self.history_ticks, rows)
        self.lines, self.complete = fit + (fit < n), fit == n
        if fit < n:
            hidden = n - fit
            more = Text(f"+{hidden} more GPU{'s' if hidden > 1 else ''} (up/down to scroll)", style="dim")
            lines.append(tuple(more.render(console)))
        self._set_lines(lines)
        self._title(n, width, any(under))

    def _set_lines(self, lines: list[Line]) -> None:
        """The lines to show: a relayout only when their count changes (lines never wrap), else a repaint of
        the lines that changed."""
        old = self._texts
        self._texts = lines
        if len(lines) != self._rows:
            self._rows = len(lines)
            self._strips.clear()
            self.refresh(layout=True)
            return
        width = self.size.width
        for y, (a, b) in enumerate(zip(old, lines, strict=True)):
            if a != b:
                self._strips.pop(y, None)
                self.refresh(Region(0, y, width, 1))

    def get_content_height(self, container: Size, viewport: Size, width: int) -> int:
        return len(self._texts)

    def notify_style_update(self) -> None:
        super().notify_style_update()
        self._base = None  # the CSS changed (a theme): the lines are drawn anew
        self._strips.clear()

    def render_line(self, y: int) -> Strip:
        """Line API: a line's Strip is built once per change of its text (or of the width)."""
        width = self.size.width
        if width != self._strips_width:
            self._strips.clear()
            self._strips_width = width
        strip = self._strips.get(y)
        if strip is None:
            if self._base is None:
                self._base = self.rich_style
            line = self._texts[y] if y < len(self._texts) else ()
            strip = self._strips[y] = _strip(line, width, self._base, self.app.console)
        return strip

    def _title(self, n: int, width: int, history: bool) -> None:
        """What the bars (and the charts under the lines) show: the longest form that fits the border."""
        under = " · under each: its busier link direction over time, newest right" if history else ""
        forms = (
            f"{n} GPUs · bars: TX and RX of the link ceiling, DRAM of peak bandwidth, SM busy{under}",
            f"{n} GPUs · TX/RX of link ceiling · DRAM · SM{under}",
            f"{n} GPUs · TX/RX of link ceiling · DRAM · SM{' · link over time under each' if history else ''}",
        )
        title = next((t for t in forms if len(t) <= width - 2), forms[-1])
        if self.border_title != title:
            self.border_title = title


def _strip(line: Line, width: int, base: Style, console: Console) -> Strip:
    """``line`` on ``base``, at most ``width`` cells (the stylesheet's nowrap and ellipsis)."""
    strip = Strip([Segment(seg.text, base + seg.style if seg.style else base) for seg in line])
    if strip.cell_length <= width:
        return strip  # padded to the width by Textual, in the widget's background
    text = Text.assemble(*((seg.text, seg.style or NO_STYLE) for seg in line))
    text.truncate(width, overflow="ellipsis")
    return _strip(tuple(text.render(console)), width, base, console)
