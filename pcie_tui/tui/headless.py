"""Driving the app without a terminal: for tests, screenshots and docs."""

from __future__ import annotations

import asyncio
import io
import time
from collections.abc import Callable
from dataclasses import replace
from typing import Any

from rich.console import Console
from textual.app import App
from textual.geometry import Region
from textual.pilot import Pilot
from textual.widget import Widget

from pcie_tui.analyze.session import SessionAnalyzer
from pcie_tui.recording.reader import Recording
from pcie_tui.recording.replay import ReplaySource


def screen_text(app: App[Any]) -> str:
    """The current screen as plain text (what a user would read)."""
    width, height = app.size
    console = Console(
        width=width,
        height=height,
        file=io.StringIO(),
        force_terminal=True,
        color_system="truecolor",
        record=True,
        legacy_windows=False,
        safe_box=False,
    )
    console.print(app.screen._compositor.render_update(full=True, screen_stack=app._background_screens, simplify=True))
    return console.export_text()


async def wait_until(pilot: Pilot[Any], predicate: Callable[[], bool], timeout_s: float = 5.0) -> None:
    """Let the app run until ``predicate()`` holds; TimeoutError after ``timeout_s``."""
    end = time.monotonic() + timeout_s
    while not predicate():
        if time.monotonic() > end:
            raise TimeoutError("condition not reached in time")
        # Plain sleep: pilot.pause() forces a full repaint each call, which would load the app.
        await asyncio.sleep(0.02)
    await pilot.pause()


def paused_app(rec: Recording, index: int) -> App[Any]:
    """The TUI replaying ``rec``, paused once ticks ``0..index-1`` are fed (:func:`frame_at` says when that
    frame is drawn)."""
    from pcie_tui.tui.app import make_app  # the app module imports most of the TUI: only when one is made

    src = ReplaySource(rec)
    src.seek_to_index(index)
    src.set_paused(True)
    return make_app(src)


def frame_at(app: Any, ticks: int) -> bool:
    """True once the app has rendered the frame for exactly ``ticks`` ticks."""
    f = app.frame
    return f is not None and f.ticks == ticks


def saturated_moment(rec: Recording, resource: str = "link", phase_contains: str = "h2d", peak: bool = False) -> int:
    """Index of the tick in the middle of the first ``resource`` saturation during a matching phase.

    Found by running the analyzer, so screenshots show a real verdict, not a staged one.
    With ``peak``, the tick of that saturation whose reading of ``resource`` is highest
    (a short saturation's middle may already be easing below the enter threshold).
    """
    an = SessionAnalyzer(rec.header, keep_series=False)
    hits: list[int] = []
    util: dict[int, float] = {}
    for i, s in enumerate(rec.samples):
        an.feed(s)
        phase = an.phase or ""  # the session's one phase rule
        sat = [tr for tr in an.trackers.values() if tr.verdict == resource]
        if sat and phase_contains in phase:
            hits.append(i)
            u = sat[0].last_util
            util[i] = float(getattr(u, resource, None) or 0.0) if u is not None else 0.0
        elif hits:
            break
    if not hits:
        raise ValueError(f"no {resource} saturation during a {phase_contains!r} phase in {rec.path}")
    # Prefer a tick whose readings are all there (a void GPM window shows n/a).
    full = [
        i for i in hits if all(g.pcie_rx_Bps is not None and g.pcie_tx_Bps is not None for g in rec.samples[i].gpus)
    ]
    pick = full or hits
    if peak:
        return max(pick, key=lambda i: util[i]) + 1
    return pick[len(pick) // 2] + 1  # replay position: ticks 0..i analysed


def scaled_gpus(rec: Recording, n_gpus: int) -> Recording:
    """``rec`` (one GPU) as an ``n_gpus``-GPU recording, for screens, tests and the bench of many GPUs:
    every tick carries n GPUs, GPU i holding the real reading of tick (k + i * len / n) mod len (the
    same session seen at n moments, so the GPUs differ as on a real machine; every value a real one)."""
    g0 = rec.header.gpus[0]
    header = replace(rec.header, gpus=tuple(replace(g0, index=i, uuid=f"{g0.uuid}-{i}") for i in range(n_gpus)))
    base = list(rec.samples)
    n = len(base)
    samples = [
        replace(s, gpus=tuple(replace(base[(k + i * n // n_gpus) % n].gpus[0], index=i) for i in range(n_gpus)))
        for k, s in enumerate(base)
    ]
    return Recording(path=rec.path, header=header, samples=samples, events=list(rec.events))


def run(coro: Any) -> Any:
    return asyncio.run(coro)


# Widgets that draw a chart: a row of them blank is the chart's own headroom (a link at 1 % of its ceiling), not
# an empty band. A MetricRow is a chart with its label beside it.
CHART_WIDGETS = ("Spark", "MetricRow")
# Widgets that stand on their own rows with text (not boxes): their ragged right edge is no band either.
TEXT_BARS = ("#header", "#headline", "#bottom")


def empty_bands(app: App[Any], most: int = 2) -> list[str]:
    """Bands of more than ``most`` rows that a user reads as empty on the monitor screen (issue 22):

    - rows blank across a box's interior (inside its border and padding: an events box with no rows, an
      engine text shorter than its box), chart areas counting as drawn;
    - rows blank across the whole screen once the borders are taken away;
    - an area at least 4 columns wide that no box, bar or chart covers (the room beside a shorter panel).

    Each is described in one line (where, which rows); none: an empty list."""
    width, height = app.size
    grid = [list(line.ljust(width)[:width]) for line in screen_text(app).splitlines()[:height]]
    grid += [[" "] * width for _ in range(height - len(grid))]
    screen = app.screen
    shown = [w for w in screen.walk_children(Widget) if w.display and w.visible and _on_screen(screen, w)]
    for w in shown:
        if type(w).__name__ in CHART_WIDGETS:
            _fill(grid, _visible(screen, w), "#")
    out: list[str] = []
    boxes = [
        w for w in shown if any(edge[0] not in ("", "none", "hidden") for edge in w.styles.border) or w.id == "headline"
    ]
    for w in boxes:
        inner = w.content_region.intersection(_visible(screen, w))
        rows = [all(grid[y][x] == " " for x in range(inner.x, inner.right)) for y in range(inner.y, inner.bottom)]
        out += [f"{_name(w)}: rows {inner.y + a}-{inner.y + b} blank inside" for a, b in _runs(rows, most)]
    frame = set("│┃║ ")  # the side borders of boxes; a box's top or bottom edge is drawn, not blank
    rows = [all(c in frame for c in line) for line in grid]
    out += [f"screen: rows {a}-{b} blank but for borders" for a, b in _runs(rows, most)]
    covered = [[False] * width for _ in range(height)]
    for w in [*boxes, *(w for w in shown if f"#{w.id}" in TEXT_BARS)]:
        _fill(covered, _visible(screen, w), True)
    out += _open_areas(grid, covered, most)
    return out


def _on_screen(screen: Any, widget: Any) -> bool:
    try:
        return bool(screen.find_widget(widget).visible_region.area)
    except Exception:  # not in the compositor's map: not shown
        return False


def _visible(screen: Any, widget: Any) -> Region:
    region: Region = screen.find_widget(widget).visible_region
    return region


def _fill(grid: list[list[Any]], region: Region, value: Any) -> None:
    for y in range(max(0, region.y), min(len(grid), region.bottom)):
        row = grid[y]
        for x in range(max(0, region.x), min(len(row), region.right)):
            row[x] = value


def _runs(flags: list[bool], most: int) -> list[tuple[int, int]]:
    """(first, last) index of each run of True longer than ``most``."""
    out, start = [], None
    for i, on in enumerate([*flags, False]):
        if on and start is None:
            start = i
        elif not on and start is not None:
            if i - start > most:
                out.append((start, i - 1))
            start = None
    return out


def _open_areas(grid: list[list[str]], covered: list[list[bool]], most: int, min_width: int = 4) -> list[str]:
    """Blank areas no box or bar covers, more than ``most`` rows tall and ``min_width`` columns wide."""
    height, width = len(grid), len(grid[0]) if grid else 0
    up = [0] * width  # blank uncovered rows ending at this row, per column
    out: list[str] = []
    for y in range(height):
        up = [up[x] + 1 if grid[y][x] == " " and not covered[y][x] else 0 for x in range(width)]
        tall = [u > most for u in up]
        for a, b in _runs(tall, min_width - 1):  # reported once, on the area's last row
            if y + 1 == height or any(grid[y + 1][x] != " " or covered[y + 1][x] for x in range(a, b + 1)):
                out.append(f"uncovered: columns {a}-{b} blank for {min(up[a : b + 1])} rows up to row {y}")
    return out


def _name(widget: Any) -> str:
    return f"#{widget.id}" if widget.id else type(widget).__name__
