"""Lines the TUI draws itself (issue 22: Textual's Content cost ~0.4 ms a line, each time a figure changed) are
the lines Textual would have drawn: the same text in the same styles, meta included (mouse selection reads the
offsets), for the charts' labels, the legends, the headline and the position bar; and the SVG snapshots
(tests/test_tui_snapshots.py) are unchanged."""

from __future__ import annotations

from pathlib import Path

import pytest
from textual.visual import Visual, visualize

from pcie_tui.recording.reader import read_recording
from pcie_tui.tui.headless import frame_at, paused_app, run, saturated_moment, wait_until
from pcie_tui.tui.widgets import PositionBar, QuickStatic

PROBE = Path(__file__).parent / "fixtures" / "h200-probe.jsonl"
LLAMA = Path(__file__).parents[1] / "pcie_tui" / "data" / "h200-llama-partial.jsonl.gz"


@pytest.mark.parametrize(
    ("path", "resource", "phase", "size"),
    [
        (PROBE, "link", "h2d", (80, 24)),
        (PROBE, "memory", "d2d", (140, 45)),
        (LLAMA, "link", "prefill", (170, 45)),
        (LLAMA, "link", "prefill", (200, 50)),
    ],
)
def test_drawn_lines_are_textuals(path, resource, phase, size):
    rec = read_recording(path)
    pos = saturated_moment(rec, resource, phase)
    app = paused_app(rec, pos)
    compared: list[str] = []

    async def go() -> None:
        async with app.run_test(size=size) as pilot:
            await wait_until(pilot, lambda: frame_at(app, pos), 20)
            await pilot.pause()
            widgets = [*app.query(QuickStatic), app.query_one(PositionBar)]
            for w in widgets:
                if not w.display or not w.size.width:
                    continue
                width, height = w.size
                content = w.render() if isinstance(w, PositionBar) else w.content
                theirs = Visual.to_strips(w, visualize(w, content, markup=False), width, height, w.visual_style)
                mine = [w.render_line(y) for y in range(len(theirs))]
                assert [list(s) for s in mine] == [list(s) for s in theirs], (type(w).__name__, str(content))
                compared.append(type(w).__name__)

    run(go())
    assert {"QuickStatic", "HistoryLegend", "HeadlineBar", "PositionBar"} <= set(compared), compared
