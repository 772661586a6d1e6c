"""Widgets that render Frames. They never read a source; they only draw what they are given."""

from __future__ import annotations

import time
from collections.abc import Sequence
from functools import lru_cache

from rich.segment import Segment
from rich.style import Style
from rich.text import Text
from textual.app import ComposeResult
from textual.containers import Horizontal
from textual.geometry import Region
from textual.strip import Strip
from textual.style import Style as VisualStyle
from textual.visual import Visual, VisualType, visualize
from textual.widget import Widget
from textual.widgets import Static

from pcie_tui.core import units
from pcie_tui.core.model import SessionHeader
from pcie_tui.tui import fmt, spark
from pcie_tui.tui.state import Frame

DIRECTION_WORDS = {"rx": "RX (into GPU)", "tx": "TX (out of GPU)", "both": "TX+RX"}
BUS_WORDS = {"pcie": "PCIe", "nvlink": "NVLink"}
# An event's direction label: "both" when both directions crossed the threshold in it.
EVENT_DIRECTION_WORDS = {**DIRECTION_WORDS, "both": "TX+RX (both directions)"}
# A headline that got shorter keeps its rows this long (seconds of wall time), so the screen does not jump.
HEADLINE_HOLD_S = 5.0


def set_text(widget: Static, content: str | Text, *, layout: bool = False) -> None:
    """Update only when the content changed; ``layout`` only where the size can follow the text.

    A changed Static normally relayouts the whole screen; most of ours have a
    fixed size, so a repaint is enough (this keeps a 10 Hz screen cheap).
    """
    if getattr(widget, "_shown", None) == content:
        return
    widget._shown = content  # type: ignore[attr-defined]
    widget.update(content, layout=False)
    if layout:
        # A relayout repaints the whole screen: only when the text's size changed (its width for a
        # width-auto widget, the rows it wraps to at this width), not each time a figure ticks.
        shape = _shape(widget)
        if shape is None or shape != getattr(widget, "_shape", None):
            widget.refresh(layout=True)
        widget._shape = shape  # type: ignore[attr-defined]


def _shape(widget: Static) -> tuple[int, int] | None:
    """(cells wide, rows tall) the widget's text takes as it is laid out now; None before layout."""
    if not widget.is_mounted:
        return None
    visual = widget.visual  # built by update(): measured here, not built twice
    w = widget.styles.width
    auto = w is not None and w.is_auto
    if not auto and not widget.size.width:
        return None
    # The rules the visual is laid out by (text wrap, overflow, line padding): those set on the widget;
    # an unset one reads as its default, the same as the styles object itself gives.
    rules = widget.styles.get_rules()
    if auto:  # its width follows the text: the rows at that width
        cells = visual.get_optimal_width(rules, widget.size.width)
        return cells, visual.get_height(rules, max(1, cells))
    return -1, visual.get_height(rules, widget.size.width)


def set_border_title(widget: Widget, title: str) -> None:
    if widget.border_title != title:
        widget.border_title = title


class QuickStatic(Static):
    """A Static for text replaced every frame (the charts' figures, the legends, the headline), its lines drawn
    straight from the text (a string, never markup, or Rich Text), not through Textual's Content (issue 22:
    ~0.4 ms a line there, each time the figures change). A line wider than the widget, for Textual to wrap or
    cut as the stylesheet says, is drawn by the Static as before; so is anything but a string or Text. What
    is drawn is the same either way (the text's runs on the widget's style, left-aligned, unpadded)."""

    def __init__(self, content: str | Text = "", *, id: str | None = None, classes: str | None = None) -> None:
        super().__init__(content, markup=False, id=id, classes=classes)
        self._text: VisualType = content
        self._visual: Visual | None = None
        self._drawn: tuple[int, VisualStyle, list[Strip] | None] | None = None  # width, style, lines (None: Textual's)

    @property
    def visual(self) -> Visual:
        if self._visual is None:
            self._visual = visualize(self, self._text, markup=False)
        return self._visual

    @property
    def content(self) -> VisualType:
        return self._text

    @content.setter
    def content(self, content: VisualType) -> None:
        self.update(content)

    def update(self, content: VisualType = "", *, layout: bool = True) -> None:
        """New text: drawn when it is shown (a Static would make it Textual Content now)."""
        self._text = content
        self._visual = None
        self._drawn = None
        self.refresh(layout=layout)

    def notify_style_update(self) -> None:
        super().notify_style_update()
        self._drawn = None

    def render_line(self, y: int) -> Strip:
        width = self.size.width
        style = self.visual_style
        drawn = self._drawn
        if drawn is None or drawn[0] != width or drawn[1] is not style:
            drawn = self._drawn = (width, style, text_strips(self, self._text, width, style))
        lines = drawn[2]
        if lines is None:
            return super().render_line(y)
        return lines[y] if y < len(lines) else Strip.blank(width, style.rich_style)


def text_strips(widget: Widget, text: object, width: int, style: VisualStyle) -> list[Strip] | None:
    """``text``'s lines as strips for ``widget``, or None where Textual must draw it (not a string or Rich Text,
    or a line wider than ``width``). Each run's style as Textual's Content gives it: the text's (its colours as
    Textual reads them: "grey50" is #808080) on the widget's, with its offset in the text (mouse selection
    reads it)."""
    if isinstance(text, str):
        lines = [Text(line) for line in text.split("\n")]
    elif isinstance(text, Text):
        lines = list(text.split("\n", allow_blank=True))
    else:
        return None
    console = widget.app.console
    theme = widget.app.ansi_theme
    out = []
    for y, line in enumerate(lines):
        if line.cell_len > width:
            return None
        # The text's own style under its spans, read as Textual reads it: a string by Textual's parser ("yellow"
        # is #ffff00 there, an ANSI colour in a span), the spans by Rich's.
        under, line.style = line.style, ""
        if isinstance(under, str):
            base = style + _parsed(under) if under else style
        else:
            base = style + VisualStyle.from_rich_style(under, theme)
        segments = []
        x = 0
        for seg in line.render(console):
            if seg.text:
                run = base + VisualStyle.from_rich_style(seg.style, theme) if seg.style else base
                segments.append(Segment(seg.text, run.rich_style_with_offset(x, y)))
                x += len(seg.text)
        out.append(Strip(segments))
    return out


@lru_cache(maxsize=64)
def _parsed(style: str) -> VisualStyle:
    return VisualStyle.parse(style)


class Spark(Widget):
    """A sparkline of one figure's history, shaded by phase; fills its size."""

    COMPONENT_CLASSES = {"spark--bar", "spark--hot", "spark--missing"}
    DEFAULT_CSS = """
    Spark { height: 1; width: 1fr; min-width: 8; }
    Spark > .spark--bar { color: $success; }
    Spark > .spark--hot { color: $error; }
    Spark > .spark--missing { color: $text-muted; }
    """

    def __init__(self, *, hot_at: float | None = None, id: str | None = None, classes: str | None = None) -> None:
        super().__init__(id=id, classes=classes)
        self.hot_at = hot_at
        self.values: Sequence[float | None] = ()
        self.phases: Sequence[str | None] = ()
        self.start = 0
        self.scale: float | None = None
        self.history_ticks = 1
        self._version = 0
        self._strips: list[Strip] = []
        self._rows: list[list[tuple[str, Style]]] = []
        self._styles: tuple[Style, Style, Style, Style] | None = None
        self._strips_key: tuple[int, int, int] | None = None

    def show(
        self,
        values: Sequence[float | None],
        phases: Sequence[str | None],
        start: int,
        scale: float | None,
        history_ticks: int,
    ) -> None:
        """New data; only the rows whose cells changed are repainted (none when the picture is the same:
        an idle link scrolling zeros, or a frame that fell inside the same cells)."""
        self.values, self.phases, self.start, self.scale = values, phases, start, scale
        self.history_ticks = history_ticks
        self._version += 1
        width, height = self.size
        if not (width and height and self.is_mounted) or self._strips_key is None:
            self.refresh()
            return
        old_rows, old_key = self._rows, self._strips_key
        self._render_rows(width, height)
        if old_key[:2] != (width, height):
            self.refresh()
            return
        changed = [y for y, (a, b) in enumerate(zip(old_rows, self._rows, strict=True)) if a != b]
        if changed:
            self.refresh(*_row_regions(changed, width))

    def render_line(self, y: int) -> Strip:
        """Line API: the rows are built once per data or size change, as merged segments."""
        width, height = self.size
        if self._strips_key != (width, height, self._version):
            self._render_rows(width, height)
        if y < len(self._strips):
            return self._strips[y]
        return Strip.blank(width, self.rich_style)

    def notify_style_update(self) -> None:
        super().notify_style_update()
        self._styles = None  # the CSS changed (a theme, a class above): the next rows are built anew
        self._strips_key = None

    def _render_rows(self, width: int, height: int) -> None:
        if self._styles is None:  # looked up once, not for each frame (they walk the DOM)
            self._styles = (
                self.rich_style,
                self.get_component_rich_style("spark--bar", partial=True),
                self.get_component_rich_style("spark--hot", partial=True),
                self.get_component_rich_style("spark--missing", partial=True),
            )
        base, bar, hot, missing = self._styles
        self._rows = spark.runs(
            self.values,
            self.phases,
            self.start,
            width=width,
            height=height,
            scale=self.scale,
            history_ticks=self.history_ticks,
            bar_style=bar,
            hot_style=hot,
            missing_style=missing,
            hot_at=self.hot_at,
        )
        self._strips = [Strip([Segment(text, base + style) for text, style in row], width) for row in self._rows]
        self._strips_key = (width, height, self._version)


def _row_regions(rows: list[int], width: int) -> list[Region]:
    """One region per run of consecutive rows."""
    out: list[Region] = []
    for y in rows:
        if out and out[-1].bottom == y:
            last = out[-1]
            out[-1] = Region(0, last.y, width, last.height + 1)
        else:
            out.append(Region(0, y, width, 1))
    return out


def spark_share(rows: int, charts: int, most: int | None = None, least: int = 1) -> list[int]:
    """``rows`` shared by ``charts`` stacked charts: ``least`` each at least, ``most`` at most, and the rows an
    even share leaves over one each to the first charts (so the charts fill the rows exactly, no blank row)."""
    if charts <= 0:
        return []
    each, over = divmod(max(rows, least * charts), charts)
    out = [each + (i < over) for i in range(charts)]
    return [min(n, most) for n in out] if most is not None else out


def set_spark_rows(spark: Widget, rows: int | None) -> None:
    """A chart's height in rows (None: the stylesheet's), set only when it changes (a change relayouts)."""
    h = spark.styles.height
    if (h.value if h is not None else None) != rows:
        spark.styles.height = rows


class MetricRow(Horizontal):
    """A label with the current figure, and its sparkline."""

    DEFAULT_CSS = """
    MetricRow { height: auto; }
    MetricRow > .metric-label { width: 46; height: 1; text-wrap: nowrap; text-overflow: ellipsis; }
    """

    def __init__(self, *, hot_at: float | None = None, id: str | None = None, classes: str | None = None) -> None:
        super().__init__(id=id, classes=classes)
        self.label = QuickStatic("", classes="metric-label")
        self.spark = Spark(hot_at=hot_at)

    def compose(self) -> ComposeResult:
        yield self.label
        yield self.spark


class HistoryLegend(QuickStatic):
    """The line under sparklines (history span, phase swatches), refitted to its width when laid out."""

    def __init__(self) -> None:
        super().__init__("", classes="legend")
        self._args: tuple[float, Sequence[str | None]] | None = None

    def show(self, span_s: float, phases: Sequence[str | None]) -> None:
        self._args = (span_s, phases)
        self._fit()

    def _fit(self) -> None:
        if self._args is not None:
            set_text(self, spark.history_legend(*self._args, self.size.width))

    def on_resize(self) -> None:
        self._fit()


def headline_rows_max(height: int) -> int:
    """The rows the headline may take on a screen ``height`` rows tall: four, or a quarter of the screen
    where that is more (an 80x24 screen's six hold the pageable demo's fix and what it saves, which four cut
    off mid-sentence while the events box below stood empty)."""
    return max(4, height // 4)


class HeadlineBar(QuickStatic):
    """What holds things back now and the fix (up to :func:`headline_rows_max` rows on narrow screens); hidden
    with nothing to say.

    The text comes ready-made in the frame (``Frame.headline``); only its height and
    visibility ever change the layout, and only when they flip.
    """

    def __init__(self) -> None:
        super().__init__("", id="headline")
        self.display = False
        self.text: str | None = None
        self._held = (0, 0.0, 0)  # (rows, since when, at which width)

    def show(self, text: str | None) -> None:
        self.text = text
        if text is None:
            if self.display:
                self.display = False
            return
        self.fit()
        if not self.display:
            self.display = True

    @property
    def rows(self) -> int:
        """The rows it takes, known before the layout: its height as :meth:`fit` set it while shown (the laid-out
        height where none is set in rows)."""
        if not self.display:
            return 0
        height = self.styles.height
        cells = height.cells if height is not None else None
        return cells if cells is not None else self.outer_size.height

    def fit(self) -> None:
        """Its lines wrapped to this width (after a resize too), never between a number and its unit
        (:func:`pcie_tui.core.units.wrap`), in as many rows as they take, :func:`headline_rows_max` at most. A shorter text
        keeps the taller bar for :data:`HEADLINE_HOLD_S` (two spare rows at most): phases that alternate
        every second would otherwise move every panel below up and down (a relayout each time)."""
        width, height = self.app.size
        room = max(1, width - 2)  # the bar spans the screen; padding 0 1
        lines = [part for ln in (self.text or "").split("\n") for part in units.wrap(ln, room)]
        set_text(self, "\n".join(lines))
        need = min(headline_rows_max(height), max(1, len(lines)))
        now = time.monotonic()
        held, since, at_width = self._held
        if need >= held or at_width != width or now - since > HEADLINE_HOLD_S or held - need > 2:
            self._held = (need, now, width)
            rows = need
        else:
            rows = held
        if self.styles.height is None or self.styles.height.value != rows:
            self.styles.height = rows


def header_text(header: SessionHeader, source_label: str, title: str) -> Text:
    out = Text()
    out.append(title, style="bold")
    out.append(f" · {source_label}")
    if header.host:
        out.append(f" · host {header.host}")
    return out


class PositionBar(Widget):
    """Replay position, speed and state; for a live source, tick count and display pause."""

    def __init__(self, live: bool) -> None:
        super().__init__(id="position")
        self.live = live
        self.frame: Frame | None = None
        self.display_paused = False
        self.failure: str | None = None
        self.fault: str | None = None  # the latest thing that went away mid-session (it goes on)
        self._drawn: tuple[int, VisualStyle, list[Strip] | None] | None = None  # as render_line drew it

    def show(self, frame: Frame | None, display_paused: bool, failure: str | None) -> None:
        self.frame, self.display_paused, self.failure = frame, display_paused, failure
        self._drawn = None
        self.refresh()

    def render(self) -> Text:
        return position_text(self.frame, self.content_size.width, self.display_paused, self.failure, self.fault)

    def render_line(self, y: int) -> Strip:
        """Its one line drawn straight from :meth:`render`'s text (:func:`text_strips`), once per frame."""
        width = self.size.width
        style = self.visual_style
        drawn = self._drawn
        if drawn is None or drawn[0] != width or drawn[1] is not style:  # show() clears it: a new frame
            drawn = self._drawn = (width, style, text_strips(self, self.render(), width, style))
        lines = drawn[2]
        if lines is None:
            return super().render_line(y)
        return lines[y] if y < len(lines) else Strip.blank(width, style.rich_style)


def position_text(
    frame: Frame | None, width: int, display_paused: bool, failure: str | None, fault: str | None = None
) -> Text:
    if failure:
        return Text(f"source failed: {failure}", style="bold red")
    if frame is None:
        return Text("waiting for the first tick…", style="dim")
    if frame.replay is None:
        out = Text()
        out.append("● LIVE" if not frame.ended else "■ source ended", style="bold")
        out.append(f" · {frame.ticks} ticks · {fmt.offset(frame.t_rel)}")
        if display_paused:
            out.append(" · display paused (still collecting)", style="bold yellow")
        if fault:
            out.append(f" · {fault}", style="bold yellow")
        return out
    r = frame.replay
    icon = "■ end" if r.position >= r.total else "PAUSED" if r.paused else "▶ playing"
    pos = r.current_t - r.start_t
    dur = r.end_t - r.start_t
    so_far = f" ({r.loading})" if r.loading else ""
    # fmt.elapsed, the events' times unsigned: 15.10 s, 123.4 s, then 1:02:03 (not 39580.00 s)
    head = f"{icon} {r.speed:g}x · {fmt.elapsed(pos):>8} / {fmt.elapsed(dur)}{so_far} · "
    tail = f" · tick {r.position}/{r.total}"
    bar_w = max(0, width - len(head) - len(tail))
    frac = 0.0 if dur <= 0 else min(1.0, pos / dur)
    done = round(frac * bar_w)
    out = Text(head, style="bold" if not r.paused else "bold yellow")
    out.append("━" * done, style="cyan")
    out.append("─" * (bar_w - done), style="grey35")
    out.append(tail)
    return out
