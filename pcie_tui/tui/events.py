"""The saturation events box: newest first, rows updated in place, only as tall as its rows."""

from __future__ import annotations

import time
from collections.abc import Iterable, Sequence

from rich.cells import cell_len, set_cell_size
from rich.control import strip_control_codes
from rich.segment import Segment
from rich.style import Style
from textual.app import ComposeResult
from textual.color import Color
from textual.containers import Vertical
from textual.css.scalar import Scalar
from textual.geometry import Region, Size
from textual.scroll_view import ScrollView
from textual.strip import Strip

from pcie_tui.tui import fmt
from pcie_tui.tui.frame import EventView
from pcie_tui.tui.widgets import BUS_WORDS, set_border_title

# Rows the box grows to before its table scrolls (it never takes more than the room below the panels).
EVENTS_MAX_ROWS = 8
# The rows of known events (an open one's running peak and mean, an end) are redrawn at most this often
# (seconds; a new event at once): with several GPUs saturated some figure changes every frame.
REDRAW_EVERY_S = 1.0


def _event_cells(e: EventView) -> tuple[str, ...]:
    if e.detail is not None:
        end = "open" if e.end_s is None else fmt.offset(e.end_s)
        return (fmt.offset(e.start_s), end, str(e.gpu), e.resource, "-", e.detail, "-", e.phase or fmt.NA)
    if e.resource == "link":
        res = f"link ({BUS_WORDS.get(e.bus or '', '?')})"
        peak = f"{fmt.rate(e.peak_Bps)} {fmt.pct(e.peak_util)}"
    else:
        res = (
            "memory (proxy)"
            if e.resource == "memory" and e.proxy
            else "DRAM BW"
            if e.resource == "memory"
            else e.resource
        )
        peak = fmt.pct(e.peak_util)
    return (
        fmt.offset(e.start_s),
        "open" if e.end_s is None else fmt.offset(e.end_s),
        str(e.gpu),
        res,
        (e.direction or "-").upper() if e.resource == "link" else "-",
        peak,
        fmt.pct(e.mean_util),
        e.phase or fmt.NA,
    )


# (key, label, width): wide enough for "+99.99 s" (and "+123.4 s", "+1:02:03": fmt.offset, 8 characters
# for a session under 10 hours), "memory (proxy)", "99.9 GB/s 100 %", plus one space between columns (no
# cell padding, so all of it fits in 80 columns). The time columns widen to a longer time (TIME_COLUMNS);
# the phase (None) is as wide as its longest cell; any other longer cell is cut at its column's width.
EVENT_COLUMNS = (
    ("start", "start", 9),
    ("end", "end", 9),
    ("gpu", "GPU", 4),
    ("res", "resource", 15),
    ("dir", "dir", 5),
    ("peak", "peak", 16),
    ("mean", "mean", 6),
    ("phase", "phase", None),
)
TIME_COLUMNS = (("start", 0), ("end", 1))  # (key, cell index): as wide as their longest time and a space


def _time_widths(cells: Iterable[tuple[str, ...]]) -> dict[str, int]:
    """Each time column's width for these rows: its EVENT_COLUMNS width, or its longest cell and a space."""
    base = {key: width or 0 for key, _, width in EVENT_COLUMNS}
    rows = list(cells)
    return {key: max([base[key], *(len(c[i]) + 1 for c in rows)]) for key, i in TIME_COLUMNS}


def _column_widths(rows: Sequence[tuple[str, ...]]) -> tuple[int, ...]:
    """Every column's width for these rows: the fixed ones (the time columns as :func:`_time_widths` widens
    them), the phase as wide as its label and its longest cell."""
    times = _time_widths(rows)
    return tuple(
        times.get(key, width) if width is not None else max([cell_len(label), *(cell_len(r[i]) for r in rows)])
        for i, (key, label, width) in enumerate(EVENT_COLUMNS)
    )


def _cell(text: str) -> str:
    """A cell's text as drawn on one line: its first line, without control codes."""
    return strip_control_codes(text.split("\n", 1)[0])


def _extension(row: Style, background: Color) -> Style:
    """The blank right of a row: its colours, its background a quarter of the way to the widget's."""
    if row.bgcolor is None:
        return Style.from_color(row.color, None)
    return Style.from_color(row.color, Color.from_rich_color(row.bgcolor).blend(background, 0.25).rich_color)


class EventsTable(ScrollView, can_focus=False):
    """The events under a header row, one line each, scrolled under the header (mouse wheel, scrollbar).

    Drawn line by line (issue 22: a DataTable rendered every cell anew through Rich after each changed cell):
    a row's line is built once per change of its cells or of the column widths, and a changed row repaints
    its line alone. Looks as the DataTable it replaces did (no cursor, no cell padding, no zebra stripes): the
    header bold on the panel colour, one run of text per cell."""

    COMPONENT_CLASSES = {"events-table--header"}
    DEFAULT_CSS = """
    EventsTable {
        background: $surface;
        color: $foreground;
        height: auto;
        max-height: 100%;
        & > .events-table--header {
            text-style: bold;
            background: $panel;
            color: $foreground;
        }
        &:ansi > .events-table--header {
            background: ansi_bright_blue;
            color: ansi_default;
        }
    }
    """

    def __init__(self) -> None:
        super().__init__()
        self.rows: list[tuple[str, ...]] = []  # the cells of each row, newest first
        self.widths: tuple[int, ...] = tuple(cell_len(label) if w is None else w for _, label, w in EVENT_COLUMNS)
        self._lines: dict[int, list[Segment]] = {}  # the table's lines (0: the header), as built for self.widths
        self._strips: dict[int, Strip] = {}  # the lines drawn at _strips_key
        self._strips_key: tuple[int, int, int] | None = None  # (width, scroll x, scroll y)
        self._styles: tuple[Style, Style, Style, Style] | None = None  # base, header, their blanks on the right

    @property
    def row_count(self) -> int:
        return len(self.rows)

    def get_row_at(self, index: int) -> tuple[str, ...]:
        """The cells of the row ``index`` (0: the newest event)."""
        return self.rows[index]

    @property
    def column_widths(self) -> dict[str, int]:
        return {key: w for (key, _, _), w in zip(EVENT_COLUMNS, self.widths, strict=True)}

    def set_rows(self, rows: Sequence[tuple[str, ...]], scroll_home: bool) -> None:
        """The rows to show, newest first; ``scroll_home``: back to the newest (a new event, as the table's
        refill did). Repaints the lines that changed; a relayout only where the rows' count or the table's
        width changes (its scrollbars)."""
        rows = [tuple(_cell(c) for c in r) for r in rows]
        widths = _column_widths(rows)
        if widths != self.widths:
            self.widths = widths
            self._lines.clear()
            changed = None  # every line
        else:
            old = self.rows
            changed = [i for i, r in enumerate(rows) if i >= len(old) or old[i] != r]
            changed += range(len(rows), len(old))  # rows gone: blank lines now
            for i in changed:
                self._lines.pop(i + 1, None)
        self.rows = rows
        size = Size(sum(widths), len(rows) + 1)
        if size != self.virtual_size:
            self.virtual_size = size  # a relayout (the scrollbars)
        if scroll_home and self.scroll_offset != (0, 0):
            self.scroll_to(0, 0, animate=False, immediate=True)  # repaints every line
        if changed is None or self._strips_key is None:
            self._strips.clear()
            self.refresh()
            return
        width, scroll_y = self.size.width, self.scroll_offset.y
        for i in changed:
            y = i + 1 - scroll_y
            if y >= 1:
                self._strips.pop(y, None)
                self.refresh(Region(0, y, width, 1))

    def notify_style_update(self) -> None:
        super().notify_style_update()
        self._styles = None  # the CSS changed (a theme): the lines are built anew
        self._lines.clear()
        self._strips.clear()

    def render_line(self, y: int) -> Strip:
        """Line API: the header stays on top, the rows scroll under it."""
        width = self.size.width
        x, scroll_y = self.scroll_offset
        key = (width, x, scroll_y)
        if key != self._strips_key:
            self._strips.clear()
            self._strips_key = key
        strip = self._strips.get(y)
        if strip is None:
            strip = self._strips[y] = self._draw(y if y == 0 else y + scroll_y, x, width)
        return strip

    def _draw(self, line: int, x: int, width: int) -> Strip:
        if self._styles is None:
            base = self.rich_style
            header = self.get_component_styles("events-table--header").rich_style
            background = self.background_colors[1]
            self._styles = (base, header, _extension(base, background), _extension(header, background))
        base = self._styles[0]
        if line > len(self.rows):
            return Strip.blank(width, base)
        segments = self._lines.get(line)
        if segments is None:
            segments = self._lines[line] = self._line(line)
        strip = Strip(segments)
        total = strip.cell_length
        if total < width:
            blank = self._extend(line) + Style.from_meta({"row": line - 1, "column": 0, "out_of_bounds": True})
            strip = Strip([*segments, Segment(" " * (width - total), blank)], width)
        elif x or total > width:
            strip = strip.crop(x, x + width).adjust_cell_length(width, base)
        return strip

    def _extend(self, line: int) -> Style:
        """The style of the blank right of the table's line ``line`` (0: the header)."""
        assert self._styles is not None
        return self._styles[3] if line == 0 else self._styles[2]

    def _line(self, line: int) -> list[Segment]:
        """Line ``line`` of the table (0: the header) at the column widths: one segment per cell, its text
        cut or padded to its column."""
        assert self._styles is not None
        base, header = self._styles[:2]
        if line == 0:
            cells, style = tuple(label for _, label, _ in EVENT_COLUMNS), header
        else:
            cells, style = self.rows[line - 1], base
        # Each cell its own run (its place in the style's meta, as the DataTable had: a screenshot that merges
        # runs of one style keeps one run per cell).
        return [
            Segment(set_cell_size(c, w), style + Style.from_meta({"row": line - 1, "column": i}))
            for i, (c, w) in enumerate(zip(cells, self.widths, strict=True))
            if w > 0
        ]


class EventsPane(Vertical):
    """Saturation events, newest first; rows updated in place by key."""

    def __init__(self) -> None:
        super().__init__(id="events")
        self.table = EventsTable()
        self._order: tuple[str, ...] = ()
        self._cells: dict[str, tuple[str, ...]] = {}
        self._rows = -1  # table rows the box is sized for
        self.fixed = False  # as tall as its rows need (under the shared timeline), else it fills the room left
        self._redrawn_at = 0.0  # monotonic time the rows were last redrawn

    @property
    def rows_needed(self) -> int:
        """Borders, the header and up to EVENTS_MAX_ROWS rows; only the titled border with none. The app
        sizes the charts so that these remain, and no more: the box grows as events come (a relayout per
        new row, up to EVENTS_MAX_ROWS); it takes more only where the charts stop at their most rows."""
        return 2 + (self._rows + 1 if self._rows > 0 else 0)

    def set_fixed(self, fixed: bool) -> None:
        """``fixed``: exactly :attr:`rows_needed` tall (the timeline above takes the rows left); else 1fr."""
        self.fixed = fixed
        self._apply_height()

    def _apply_height(self) -> None:
        want = Scalar.from_number(self.rows_needed) if self.fixed else Scalar.parse("1fr")
        if self.styles.height != want:
            self.styles.height = want

    def _fit(self, n: int) -> None:
        """Show the table once there is a row (set only when the count changes: a redraw never relayouts)."""
        rows = min(n, EVENTS_MAX_ROWS)
        if rows == self._rows:
            return
        self._rows = rows
        self.table.display = rows > 0
        self._apply_height()

    def compose(self) -> ComposeResult:
        yield self.table

    def on_mount(self) -> None:
        self.border_title = "saturation events: none yet"
        self._fit(0)

    def show(self, events: Sequence[EventView], total: int, exact: bool = False) -> None:
        """``exact``: no frame may follow soon (paused, ended): the rows are redrawn now in any case."""
        opened = sum(1 for e in events if e.end_s is None)
        # Throttled stretches and link-health events share the box: then it is not saturation alone.
        word = "events" if any(e.detail is not None for e in events) else "saturation events"
        title = f"{word}: {total} ({opened} open)" if total else "saturation events: none yet"
        if len(events) > EVENTS_MAX_ROWS:
            title += " · newest first, scroll for older"
        set_border_title(self, title)
        self._fit(len(events))
        order = tuple(e.key for e in reversed(events))
        if not exact and order == self._order and time.monotonic() - self._redrawn_at < REDRAW_EVERY_S:
            return  # the same events: their running figures (and ends) wait for the next redraw
        self._redrawn_at = time.monotonic()
        cells = {e.key: _event_cells(e) for e in events}
        if order != self._order or cells != self._cells:
            self.table.set_rows([cells[key] for key in order], scroll_home=order != self._order)
        self._order, self._cells = order, cells
