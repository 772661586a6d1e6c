"""History sparklines with phase shading, drawn as Rich Text.

Each cell covers a fixed number of ticks aligned to the absolute tick index,
so cells do not shimmer as new ticks arrive. A cell shows the highest reading
in it (peaks survive however many ticks share a cell); a cell whose readings
were all missing shows a dim dot, never an empty bar.
"""

from __future__ import annotations

import math
import zlib
from collections import Counter
from collections.abc import Sequence
from functools import lru_cache
from itertools import pairwise
from typing import Any

from rich.style import Style
from rich.text import Text

from pcie_tui.core import units

BARS = " ▁▂▃▄▅▆▇█"

# Backgrounds for phases: dark enough that the bars stay readable on top.
PHASE_BG = {
    "prefill": "#5a3d12",
    "decode": "#173d5c",
    "mixed": "#46265c",
    "loading": "#3a3a3a",
    "queue": "#3d4a12",
    "housekeeping": "#4a2a1a",
    "down": "#5c1717",
}
_PALETTE = ("#173d5c", "#5a3d12", "#1d4d2b", "#46265c", "#0f4a4a", "#5c1740", "#3d4a12", "#4a2a1a")
# Phases that mean nothing is running get no shading.
UNSHADED = frozenset({"idle", "gap"})
BLANK = Style()  # a cell before the history starts


@lru_cache(maxsize=256)
def phase_bg(phase: str | None) -> str | None:
    """A stable background colour for a phase name (same name, same colour, every run)."""
    if phase is None or phase in UNSHADED:
        return None
    if phase in PHASE_BG:
        return PHASE_BG[phase]
    return _PALETTE[zlib.crc32(phase.encode()) % len(_PALETTE)]


def ticks_per_cell(history_ticks: int, width: int) -> int:
    return max(1, math.ceil(history_ticks / max(1, width)))


def buckets(
    values: Sequence[float | None],
    phases: Sequence[str | None],
    start: int,
    width: int,
    per_cell: int,
) -> list[tuple[float | None, str | None, bool]]:
    """(peak, phase, has_ticks) per cell, newest cell at the right edge."""
    blank, peaks, phs = _cells(values, phases, start, width, per_cell)
    return [(None, None, False)] * blank + [(p, ph, True) for p, ph in zip(peaks, phs, strict=True)]


def _cells(
    values: Sequence[float | None], phases: Sequence[str | None], start: int, width: int, per_cell: int
) -> tuple[int, list[float | None], list[str | None]]:
    """:func:`buckets` as (blank cells on the left, then each cell's peak and phase). A cell holds the ticks
    of its absolute indices that the history has; the cells before the first tick are blank. Slices, max and
    count run in C, a cell's bounds found once: this is drawn for every chart (and every GPU's line) each
    frame (issue 22)."""
    n = len(values)
    end = start + n  # absolute index one past the newest tick
    if width <= 0:
        return 0, [], []
    last_cell = (end - 1) // per_cell if end > 0 else 0
    first_cell = last_cell - width + 1
    first = max(first_cell, 0, start // per_cell) if n else last_cell + 1  # the first cell holding a tick
    if first > last_cell:
        return width, [], []
    lo = max(first * per_cell, start) - start
    if per_cell == 1:
        peaks = list(values[lo:])
        return first - first_cell, peaks, list(phases[lo:]) if phases else [None] * len(peaks)
    bounds = [lo, *range((first + 1) * per_cell - start, n, per_cell), n]
    spans = list(pairwise(bounds))
    if None not in values:  # no missing reading: a cell's peak is max() of its slice
        peaks = [max(values[a:b]) for a, b in spans]  # type: ignore[type-var]
    else:
        peaks = [max([v for v in values[a:b] if v is not None], default=None) for a, b in spans]
    if not phases:
        phs: list[str | None] = [None] * len(spans)
    elif (tail := phases[lo:]).count(tail[0]) == len(tail):  # one phase over the whole window
        phs = [tail[0]] * len(spans)
    else:
        phs = []
        for a, b in spans:
            run = phases[a:b]
            ph = run[0]
            if run.count(ph) != len(run):  # a phase change inside the cell: the most ticks win
                ph = Counter(run).most_common(1)[0][0]
            phs.append(ph)
    return first - first_cell, peaks, phs


def runs(
    values: Sequence[float | None],
    phases: Sequence[str | None],
    start: int,
    width: int,
    height: int,
    scale: float | None,
    history_ticks: int,
    bar_style: Style | None = None,
    hot_style: Style | None = None,
    missing_style: Style | None = None,
    hot_at: float | None = None,
) -> list[list[tuple[str, Style]]]:
    """A ``height``-row sparkline ``width`` cells wide, as runs of (text, style) per row.

    ``scale`` is the full-bar value; cells at or above ``hot_at`` x ``scale`` use
    ``hot_style``. Neighbouring cells of one style share a run (cheap to draw).
    """
    height = max(1, height)
    bar_style = bar_style or Style(color="green")
    hot_style = hot_style or Style(color="red")
    missing_style = missing_style or Style(color="grey50")
    # One tick per cell until the history is wider than the widget; then fixed-size cells.
    cells = _cells(values, phases, start, width, ticks_per_cell(min(len(values), history_ticks), width))
    levels = 8 * height
    cell_levels, cell_styles = _levels_and_styles(cells, levels, scale, (bar_style, hot_style, missing_style), hot_at)
    # Runs of one style are cut the same way on every row: the cuts are found once, and each row is
    # its glyph string sliced at them.
    cuts: list[tuple[int, int, Style]] = []
    for i, st in enumerate(cell_styles):
        if cuts and cuts[-1][2] is st:
            cuts[-1] = (cuts[-1][0], i + 1, st)
        else:
            cuts.append((i, i + 1, st))
    coded = "".join([chr(lv + 1) for lv in cell_levels])  # one character per cell, mapped per row in C
    rows: list[list[tuple[str, Style]]] = []
    for r in range(height):
        text = coded.translate(_row_glyphs(height - 1 - r, r == height - 1, levels))
        rows.append([(text[lo:hi], st) for lo, hi, st in cuts])
    return rows


def _levels_and_styles(
    cells: tuple[int, list[float | None], list[str | None]],
    levels: int,
    scale: float | None,
    bar_hot_missing: tuple[Style, Style, Style],
    hot_at: float | None,
) -> tuple[list[int], list[Style]]:
    """Per cell (:func:`_cells`): its bar level in eighths of a row (-1 blank, 0 missing: a dot) and its style
    (one object per distinct style, so neighbours of one style are found by identity)."""
    blank, peaks, phases = cells
    kinds = (bar_hot_missing[2], bar_hot_missing[0], bar_hot_missing[1])  # missing, bar, hot
    styled: dict[tuple[int, str | None], Style] = {}
    cell_levels: list[int] = [-1] * blank
    cell_styles: list[Style] = [BLANK] * blank
    add_level, add_style = cell_levels.append, cell_styles.append
    hot = 2.0 if hot_at is None else hot_at  # a share is never 2: no cell is hot
    for peak, bg in zip(peaks, map(phase_bg, phases), strict=True):
        if peak is None or not scale:
            kind = level = 0
        else:
            frac = peak / scale
            frac = 0.0 if frac < 0.0 else 1.0 if frac > 1.0 else frac
            kind = 2 if frac >= hot else 1
            level = round(frac * levels) or 1  # a reading (even zero) is the lowest bar
        style = styled.get((kind, bg))
        if style is None:
            style = styled[(kind, bg)] = kinds[kind] + _shade(bg)
        add_level(level)
        add_style(style)
    return cell_levels, cell_styles


@lru_cache(maxsize=64)
def _shade(bg: str | None) -> Style:
    """The background of a phase's cells (one object per colour, not one per chart drawn)."""
    return Style(bgcolor=bg) if bg else Style()


@lru_cache(maxsize=256)
def _row_glyphs(below: int, bottom: bool, levels: int) -> dict[int, str]:
    """For a row with ``below`` rows under it: the glyph of each coded cell (level + 1): blank, the
    missing dot (bottom row only) or the part of the bar in this row."""
    floor = 8 * below
    table = {0: " ", 1: "·" if bottom else " "}
    for level in range(1, levels + 1):
        table[level + 1] = BARS[max(0, min(8, level - floor))]
    return table


def render(*args: Any, **kwargs: Any) -> Text:
    """The sparkline of :func:`runs` as Rich Text (rows joined by newlines)."""
    lines = []
    for row in runs(*args, **kwargs):
        t = Text()
        for text, style in row:
            t.append(text, style)
        lines.append(t)
    return Text("\n").join(lines)


def legend(phases: Sequence[str | None], gap: str = "  ") -> Text:
    """Swatches for the phases in view, in order of first appearance."""
    seen: list[str] = []
    for p in phases:
        if p is not None and p not in seen:
            seen.append(p)
    out = Text()
    for p in seen:
        bg = phase_bg(p)
        out.append(gap)
        out.append("··" if bg is None else "  ", Style(color="grey50") if bg is None else Style(bgcolor=bg))
        out.append(f" {p}")
    return out


def history_legend(span_s: float, phases: Sequence[str | None], room: int) -> Text:
    """The line under sparklines: how much history they show and the phase swatches; shorter words
    where the full line does not fit ``room`` cells (0: not laid out yet), so no phase is cut off."""
    # 15.1 s; past 1,000 s as the session's times are (units.elapsed): 0:49:50 over a long session's 10 s ticks
    span = units.duration(span_s) if round(span_s, 1) < 1000 else units.elapsed(span_s)
    full = Text(f"history {span}, newest right;", style="dim")
    full.append_text(legend(phases))
    if not room or full.cell_len <= room:
        return full
    short = Text(f"last {span}:", style="dim")
    short.append_text(legend(phases, gap=" "))
    return short
