"""The sparkline cells and runs as pcie_tui/tui/spark.py drew them before issue 22's rewrite (63fd370, verbatim
but for this docstring and the imports): tests/test_tui_spark_reference.py checks the faster ones against it."""

from __future__ import annotations

import math
import zlib
from collections import Counter
from collections.abc import Sequence
from functools import lru_cache
from typing import cast

from rich.style import Style

from pcie_tui.tui.spark import _PALETTE, BARS, BLANK, PHASE_BG, UNSHADED


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
    end = start + len(values)  # absolute index one past the newest tick
    if width <= 0:
        return []
    last_cell = (end - 1) // per_cell if end > 0 else 0
    first_cell = last_cell - width + 1
    out: list[tuple[float | None, str | None, bool]] = []
    whole = None not in values  # no missing reading: a cell's peak is max() of its slice, all in C
    for cell in range(first_cell, last_cell + 1):
        lo = max(cell * per_cell, start)
        hi = min((cell + 1) * per_cell, end)
        if cell < 0 or lo >= hi:
            out.append((None, None, False))
            continue
        # Slices and filter/max run in C: this is redrawn for every sparkline at 10 Hz.
        if whole:
            peak: float | None = max(cast("Sequence[float]", values)[lo - start : hi - start])
        else:
            peak = max([v for v in values[lo - start : hi - start] if v is not None], default=None)
        if not phases:
            ph = None
        elif hi - lo == 1:
            ph = phases[lo - start]
        else:
            run = phases[lo - start : hi - start]
            ph = run[0]
            if run.count(ph) != len(run):  # a phase change inside the cell: the most ticks win
                ph = Counter(run).most_common(1)[0][0]
        out.append((peak, ph, True))
    return out


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
    cells = buckets(values, phases, start, width, ticks_per_cell(min(len(values), history_ticks), width))
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
    cells: list[tuple[float | None, str | None, bool]],
    levels: int,
    scale: float | None,
    bar_hot_missing: tuple[Style, Style, Style],
    hot_at: float | None,
) -> tuple[list[int], list[Style]]:
    """Per cell: its bar level in eighths of a row (-1 blank, 0 missing: a dot) and its style (one
    object per distinct style, so neighbours of one style are found by identity)."""
    bar_style, hot_style, missing_style = bar_hot_missing
    blank = BLANK
    shades: dict[str | None, Style] = {}
    styled: dict[tuple[int, str | None], Style] = {}
    cell_levels: list[int] = []
    cell_styles: list[Style] = []
    for peak, phase, has in cells:
        if not has:
            cell_levels.append(-1)
            cell_styles.append(blank)
            continue
        bg = phase_bg(phase)
        if bg not in shades:
            shades[bg] = _shade(bg)
        if peak is None or not scale:
            key = (0, bg)
            if key not in styled:
                styled[key] = missing_style + shades[bg]
            cell_levels.append(0)
            cell_styles.append(styled[key])
            continue
        frac = max(0.0, min(peak / scale, 1.0))
        hot = hot_at is not None and frac >= hot_at
        key = (2 if hot else 1, bg)
        if key not in styled:
            styled[key] = (hot_style if hot else bar_style) + shades[bg]
        cell_levels.append(max(round(frac * levels), 1))  # a reading (even zero) is the lowest bar
        cell_styles.append(styled[key])
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
