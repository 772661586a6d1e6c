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

from rich.style import Style
from rich.text import Text

BARS = " ▁▂▃▄▅▆▇█"

# Backgrounds for phases: dark enough that the bars stay readable on top.
PHASE_BG = {
    "prefill": "#5a3d12",
    "decode": "#173d5c",
    "mixed": "#46265c",
    "loading": "#3a3a3a",
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
        seg = [values[i - start] for i in range(lo, hi)]
        present = [v for v in seg if v is not None]
        ph = Counter(phases[i - start] for i in range(lo, hi)).most_common(1)[0][0] if phases else None
        out.append((max(present) if present else None, ph, True))
    return out


def render(
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
) -> Text:
    """A ``height``-row sparkline ``width`` cells wide. ``scale`` is the full-bar value.

    Cells at or above ``hot_at`` x ``scale`` use ``hot_style``.
    """
    height = max(1, height)
    bar_style = bar_style or Style(color="green")
    hot_style = hot_style or Style(color="red")
    missing_style = missing_style or Style(color="grey50")
    # One tick per cell until the history is wider than the widget; then fixed-size cells.
    cells = buckets(values, phases, start, width, ticks_per_cell(min(len(values), history_ticks), width))
    levels = 8 * height
    rows = [Text() for _ in range(height)]
    for peak, phase, has in cells:
        if not has:
            for r in rows:
                r.append(" ")
            continue
        bg = phase_bg(phase)
        shade = Style(bgcolor=bg) if bg else Style()
        if peak is None or not scale:
            for i, r in enumerate(rows):
                r.append("·" if i == height - 1 else " ", missing_style + shade)
            continue
        frac = max(0.0, min(peak / scale, 1.0))
        level = round(frac * levels)
        level = max(level, 1)  # a reading (even zero) is the lowest bar; missing is a dot
        style = (hot_style if hot_at is not None and frac >= hot_at else bar_style) + shade
        for i, r in enumerate(rows):
            row_from_bottom = height - 1 - i
            n = max(0, min(8, level - 8 * row_from_bottom))
            r.append(BARS[n], style)
    return Text("\n").join(rows)


def legend(phases: Sequence[str | None]) -> Text:
    """Swatches for the phases in view, in order of first appearance."""
    seen: list[str] = []
    for p in phases:
        if p is not None and p not in seen:
            seen.append(p)
    out = Text()
    for p in seen:
        bg = phase_bg(p)
        out.append("  ")
        out.append("··" if bg is None else "  ", Style(color="grey50") if bg is None else Style(bgcolor=bg))
        out.append(f" {p}")
    return out
