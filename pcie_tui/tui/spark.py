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
from typing import Any

from rich.style import Style
from rich.text import Text

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
    for cell in range(first_cell, last_cell + 1):
        lo = max(cell * per_cell, start)
        hi = min((cell + 1) * per_cell, end)
        if cell < 0 or lo >= hi:
            out.append((None, None, False))
            continue
        # Slices and filter/max run in C: this is redrawn for every sparkline at 10 Hz.
        peak = max([v for v in values[lo - start : hi - start] if v is not None], default=None)
        if not phases:
            ph = None
        elif hi - lo == 1:
            ph = phases[lo - start]
        else:
            ph = Counter(phases[lo - start : hi - start]).most_common(1)[0][0]
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
    rows: list[list[tuple[str, Style]]] = [[] for _ in range(height)]
    blank = Style()
    shades: dict[str | None, Style] = {}
    styled: dict[tuple[int, str | None], Style] = {}
    for peak, phase, has in cells:
        if not has:
            for r in rows:
                _extend_run(r, " ", blank)
            continue
        bg = phase_bg(phase)
        if bg not in shades:
            shades[bg] = Style(bgcolor=bg) if bg else Style()
        shade = shades[bg]
        if peak is None or not scale:
            key = (0, bg)
            if key not in styled:
                styled[key] = missing_style + shade
            for i, r in enumerate(rows):
                _extend_run(r, "·" if i == height - 1 else " ", styled[key])
            continue
        frac = max(0.0, min(peak / scale, 1.0))
        level = max(round(frac * levels), 1)  # a reading (even zero) is the lowest bar; missing is a dot
        hot = hot_at is not None and frac >= hot_at
        key = (2 if hot else 1, bg)
        if key not in styled:
            styled[key] = (hot_style if hot else bar_style) + shade
        for r, ch in zip(rows, _bar_glyphs(level, height), strict=True):
            _extend_run(r, ch, styled[key])
    return rows


def _extend_run(row: list[tuple[str, Style]], ch: str, style: Style) -> None:
    """Add one cell to a row of (text, style) runs: it joins the last run when that has the same style."""
    if row and row[-1][1] is style:
        row[-1] = (row[-1][0] + ch, style)
    else:
        row.append((ch, style))


def _bar_glyphs(level: int, height: int) -> list[str]:
    """The glyph of each row (top row first) of a bar ``level`` eighths of a row tall."""
    return [BARS[max(0, min(8, level - 8 * (height - 1 - i)))] for i in range(height)]


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
    full = Text(f"history {span_s:.1f} s, newest right;", style="dim")
    full.append_text(legend(phases))
    if not room or full.cell_len <= room:
        return full
    short = Text(f"last {span_s:.1f} s:", style="dim")
    short.append_text(legend(phases, gap=" "))
    return short
