"""The live screen at every terminal size (issue 22): bundled demos replayed at 80x24, 120x40, 160x45,
200x50 and 240x67, each at three moments (a quarter, half and nine tenths of the recording), checked as a
user reads the screen: no band of blank rows above 2 (the 160x45 screen had 19-22), the panels the size
promises present, the headline's phase the GPU panel's, no bound named before the evidence threshold."""

from __future__ import annotations

import re

import pytest

from pcie_tui.recording import demos
from pcie_tui.recording.reader import read_recording
from pcie_tui.recording.replay import ReplaySource
from pcie_tui.tui.app import make_app
from pcie_tui.tui.headless import frame_at, run, screen_text, wait_until
from pcie_tui.tui.widgets import HeadlineBar

SIZES = [(80, 24), (120, 40), (160, 45), (200, 50), (240, 67)]
MOMENTS = (0.25, 0.5, 0.9)
DEMOS = ("h200-pinned", "h200-prompt-cache")


@pytest.fixture(scope="module", params=DEMOS)
def rec(request):
    return read_recording(demos.resolve(request.param), warn=False)


def _look(rec, position: int, size: tuple[int, int]) -> dict:
    src = ReplaySource(rec)
    src.seek_to_index(position)
    src.set_paused(True)
    app = make_app(src)
    out: dict = {}

    async def go() -> None:
        async with app.run_test(size=size) as pilot:
            await wait_until(pilot, lambda: frame_at(app, position), 20)
            await pilot.pause()
            await pilot.pause()  # the sparklines are fitted after a refresh
            out["text"] = screen_text(app)
            out["headline"] = app.query_one(HeadlineBar).text
            out["frame"] = app.frame
            out["shown"] = {
                sel: app.query_one(sel).display and app.query_one(sel).region.height > 0
                for sel in ("#headline", "#gpu-0", "#engine", "#events", "#position")
            }

    run(go())
    return out


def _longest_blank_run(text: str) -> int:
    best = cur = 0
    for line in text.splitlines():
        cur = cur + 1 if not line.strip() else 0
        best = max(best, cur)
    return best


@pytest.mark.parametrize("size", SIZES, ids=lambda s: f"{s[0]}x{s[1]}")
def test_every_size_uses_its_rows(rec, size):
    n = len(rec.samples)
    for m in MOMENTS:
        pos = int(m * (n - 1))
        got = _look(rec, pos, size)
        text = got["text"]
        assert len(text.splitlines()) >= size[1] - 1
        assert _longest_blank_run(text) <= 2, f"{size} at {m:.0%}:\n{text}"
        shown = got["shown"]
        assert shown["#headline"] and shown["#gpu-0"] and shown["#engine"] and shown["#position"], shown
        assert shown["#events"], f"{size}: no events box"  # at 80x24 too: the engine panel is two lines there
        # The headline's phase is the GPU panel's (the engine's phase of the tick), and a phase still being
        # measured names no bound (the rule over every tick: test_tui_layout_keys_and_headline.py).
        phase, head = got["frame"].phase, got["headline"] or ""
        if phase and phase not in ("idle", "down"):
            assert head.startswith(phase), (phase, head)
        if "measuring" in head.split("\n")[0]:
            assert not re.search(r"-bound|link-saturated", head.split("\n")[0]), head
