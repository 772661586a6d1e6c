"""The saturation events box: newest first, rows updated in place, only as tall as its rows."""

from __future__ import annotations

import time
from collections.abc import Iterable, Sequence

from textual.app import ComposeResult
from textual.containers import Vertical
from textual.css.scalar import Scalar
from textual.widgets import DataTable
from textual.widgets.data_table import ColumnKey

from pcie_tui.tui import fmt
from pcie_tui.tui.frame import EventView
from pcie_tui.tui.widgets import BUS_WORDS, set_border_title

# Rows the box grows to before its table scrolls (it never takes more than the room below the panels).
EVENTS_MAX_ROWS = 8
# The rows of known events (an open one's running peak and mean, an end) are redrawn at most this often
# (seconds; a new event at once): a changed cell repaints the whole table, and with several GPUs
# saturated some figure changes every frame.
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
# for a session under 10 hours), "memory (proxy)", "99.9 GB/s 100 %", plus one space between columns (the
# table has no cell padding, so all of it fits in 80 columns). The time columns widen to a longer time
# (TIME_COLUMNS); a fixed width is never widened by its cells, so any other longer cell would be cut.
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


class EventsPane(Vertical):
    """Saturation events, newest first; rows updated in place by key."""

    def __init__(self) -> None:
        super().__init__(id="events")
        self.table: DataTable[str] = DataTable(
            cursor_type="none", zebra_stripes=False, show_cursor=False, cell_padding=0
        )
        self.table.can_focus = False
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
        for key, label, width in EVENT_COLUMNS:
            self.table.add_column(label, key=key, width=width)
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
        t = self.table
        for key, width in _time_widths(cells.values()).items():
            column = t.columns[ColumnKey(key)]
            if column.width != width:  # applied by the rows' redraw below (a new row or a changed cell)
                column.width = width
        if order != self._order:
            t.clear()
            for key in order:
                t.add_row(*cells[key], key=key)
        else:
            for key in order:
                old = self._cells.get(key)
                new = cells[key]
                if old != new:
                    for (col, _, _), a, b in zip(EVENT_COLUMNS, old or (), new, strict=False):
                        if a != b:
                            t.update_cell(key, col, b, update_width=True)
        self._order, self._cells = order, cells
