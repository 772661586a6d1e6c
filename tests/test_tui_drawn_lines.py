"""Lines the TUI draws itself (issue 22: Textual's Content cost ~0.4 ms a line, each time a figure changed) are
the lines Textual would have drawn: the same text in the same styles, meta included (mouse selection reads the
offsets), for the charts' labels, the legends, the headline and the position bar; and the SVG snapshots
(tests/test_tui_snapshots.py) are unchanged. A verdict change restyles a GPU panel and its badge alone (not
all the panel holds): so no rule may style anything inside a panel by the verdict classes."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from textual.visual import Visual, visualize

from pcie_tui.recording.reader import read_recording
from pcie_tui.tui.gpu_panel import GpuPanel
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


VERDICT_CLASSES = ("-link", "-memory", "-compute", "-none")


def test_verdict_classes_style_only_the_panel_and_its_badge():
    css = (Path(__file__).parents[1] / "pcie_tui" / "tui" / "app.tcss").read_text()
    css = re.sub(r"/\*.*?\*/", "", css, flags=re.S)
    selectors = [sel.strip() for block in re.findall(r"([^{}]+)\{", css) for sel in block.split(",")]
    used = [sel for sel in selectors if any(re.search(rf"\.{c}\b", sel) for c in VERDICT_CLASSES)]
    assert used, selectors
    for sel in used:  # the class on the selector's last compound: it styles that node, not its descendants
        last = re.split(r"[\s>]+", sel)[-1]
        assert any(re.search(rf"\.{c}\b", last) for c in VERDICT_CLASSES), sel


def test_a_verdict_change_restyles_the_panel_and_its_badge():
    rec = read_recording(PROBE)
    pos = saturated_moment(rec, "link", "h2d")
    app = paused_app(rec, pos)
    seen = {}

    async def go() -> None:
        async with app.run_test(size=(100, 40)) as pilot:
            await wait_until(pilot, lambda: frame_at(app, pos), 20)
            panel = app.query_one("#gpu-0", GpuPanel)
            for _ in range(6):
                await pilot.pause()
                verdict = app.frame.gpus[0].verdict
                seen[verdict] = (panel.styles.border_top, panel.badge.styles.color, panel.badge.styles.text_style)
                before = app.frame.ticks
                await pilot.press("right" if len(seen) < 3 else "left")
                await wait_until(pilot, lambda b=before: app.frame.ticks != b, 10)

    run(go())
    assert {"link", "compute", "none"} <= set(seen), seen
    link, compute, none = seen["link"], seen["compute"], seen["none"]
    assert link[0][0] == "heavy" and compute[0][0] == none[0][0] == "round"
    assert len({link[0][1], compute[0][1], none[0][1]}) == 3  # red, purple, the panel's own
    assert link[2].reverse and compute[2].reverse and not none[2].reverse
