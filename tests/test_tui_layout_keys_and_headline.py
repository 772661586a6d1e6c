"""Habits users bring: Ctrl-C quits, the layout follows the terminal, a headline says what holds things back."""

from __future__ import annotations

import gzip
import re
from pathlib import Path

import pytest
from textual.widgets import Static

from pcie_tui.recording import demos
from pcie_tui.recording.reader import Recording, read_recording
from pcie_tui.recording.replay import ReplaySource
from pcie_tui.recording.writer import RecordingWriter
from pcie_tui.tui.app import make_app
from pcie_tui.tui.headless import frame_at, paused_app, run, saturated_moment, wait_until
from pcie_tui.tui.headline import headline_text
from pcie_tui.tui.screens import SourcesScreen
from pcie_tui.tui.state import ViewModel
from pcie_tui.tui.widgets import HeadlineBar, headline_rows_max

PROBE = Path(__file__).parent / "fixtures" / "h200-probe.jsonl"


@pytest.fixture(scope="module")
def rec() -> Recording:
    return read_recording(PROBE)


class PacedLive:
    """Real recorded ticks handed out like a live collector, one per ``interval_s``."""

    live = True

    def __init__(self, rec: Recording, interval_s: float) -> None:
        import threading

        self.header = rec.header
        self.samples = rec.samples
        self.interval_s = interval_s
        self.i = 0
        self._closed = threading.Event()

    def read(self):
        if self._closed.wait(self.interval_s) or self.i >= len(self.samples):
            return None
        s = self.samples[self.i]
        self.i += 1
        return s

    def close(self) -> None:
        self._closed.set()


# ---- Ctrl-C quits like q ------------------------------------------------------------


@pytest.mark.parametrize("loop", [False, True], ids=["replay", "demo-loop"])
def test_ctrl_c_quits_a_replay(rec, loop):
    src = ReplaySource(rec, speed=1.0, loop=loop)
    app = make_app(src)

    async def go():
        async with app.run_test(size=(80, 24)) as pilot:
            await wait_until(pilot, lambda: app.frame is not None)
            await pilot.press("ctrl+c")
            await pilot.pause()
            assert not app.is_running
        assert app._drained.wait(2.0)

    run(go())
    assert app.return_code == 0


def test_ctrl_c_quits_from_the_sources_screen(rec):
    src = ReplaySource(rec)
    src.set_paused(True)
    app = make_app(src)

    async def go():
        async with app.run_test(size=(80, 24)) as pilot:
            await wait_until(pilot, lambda: app.frame is not None)
            await pilot.press("question_mark")
            await pilot.pause()
            assert isinstance(app.screen, SourcesScreen)
            await pilot.press("ctrl+c")
            await pilot.pause()
            assert not app.is_running

    run(go())
    assert app.return_code == 0


def test_ctrl_c_while_recording_live_closes_the_file(rec, tmp_path):
    out = tmp_path / "live.jsonl.gz"
    src = PacedLive(rec, interval_s=0.02)
    app = make_app(src, recorder_factory=lambda: RecordingWriter(out, rec.header))
    seen: list[int] = []

    async def go():
        async with app.run_test(size=(80, 24)) as pilot:
            await wait_until(pilot, lambda: app.frame is not None and app.frame.ticks >= 3)
            await pilot.press("r")
            assert app.recorder is not None
            await wait_until(pilot, lambda: app.recorded_ticks >= 10)
            await pilot.press("ctrl+c")
            await pilot.pause()
            assert not app.is_running
        assert app._drained.wait(2.0)
        seen.append(app.recorded_ticks)

    try:
        run(go())
    finally:
        src.close()
    assert app.recorder is None
    assert app.saved == [(out, seen[0])]
    # Closed cleanly: the gzip stream has its end marker (strict decompress raises otherwise)
    # and every tick written is there, with no reader warning about a cut file.
    lines = gzip.decompress(out.read_bytes()).decode().splitlines()
    assert len(lines) == 1 + seen[0]
    back = read_recording(out, warn=False)
    assert len(back.samples) == seen[0] >= 10
    assert back.warnings == []


def test_q_and_ctrl_c_are_both_bound_to_quit():
    from pcie_tui.tui.app import PcieTuiApp

    keys = {b.key: b for b in PcieTuiApp.BINDINGS if not isinstance(b, tuple)}  # type: ignore[union-attr]
    assert keys["q"].action == "quit"
    assert keys["ctrl+c"].action == "quit" and keys["ctrl+c"].priority


# ---- layout: side by side when wide, events box sized to its rows -------------------------

LLAMA = Path(__file__).parents[1] / "pcie_tui" / "data" / "h200-llama-partial.jsonl.gz"


@pytest.fixture(scope="module")
def llama() -> Recording:
    return read_recording(LLAMA, warn=False)


def regions(rec: Recording, position: int, size: tuple[int, int]) -> dict:
    app = paused_app(rec, position)
    out: dict = {}

    async def go():
        async with app.run_test(size=size) as pilot:
            await wait_until(pilot, lambda: frame_at(app, position))
            await pilot.pause()
            await pilot.pause()  # the sparklines' height is fitted after a refresh
            for sel in ("#headline", "#panels", "#gpus", "#engine", "#events", "#position"):
                out[sel] = app.query_one(sel).region
            out["spark_rows"] = app.query_one("#gpu-0").tx.spark.size.height
            out["chart_rows"] = [row.spark.size.height for row in app.query_one("#gpu-0").charts]
            out["gpu_panel"] = app.query_one("#gpu-0").region
            out["events"] = len(app.frame.events)
            out["events_title"] = app.query_one("#events").border_title
            out["headline"] = app.query_one(HeadlineBar).text
            out["headline_shown"] = str(app.query_one("#headline", Static).render())
            out["headline_display"] = app.query_one(HeadlineBar).display

    run(go())
    return out


def test_headline_above_a_default_ceiling_says_to_calibrate(rec):
    # The H200 probe's pinned device->host copies read 106 % of the uncalibrated default (0.90 x
    # theoretical): the default is wrong for this link, so the highest reading is the ceiling (nothing
    # reads above 100 %), and the headline says so and what measures the link's own.
    pos = max(i for i, s in enumerate(rec.samples) if s.extra.get("label") == "d2h_pinned")
    head, hint = regions(rec, pos, (120, 40))["headline"].split("\n")
    assert head.startswith("d2h_pinned so far (") and "link-saturated" in head and "pinned (observed)" in head
    pct = int(re.search(r"= (\d+)% of ", head).group(1))
    assert pct == 100 and hint.endswith(
        "so its highest reading is the ceiling: `pcie-tui calibrate` measures this link's own ceiling."
    )


def test_wide_terminal_puts_gpus_and_engine_side_by_side(llama):
    pos = saturated_moment(llama, "link", "prefill", peak=True)
    r = regions(llama, pos, (170, 45))
    gpus, engine = r["#gpus"], r["#engine"]
    assert gpus.x == 0 and engine.x > 0 and engine.x == gpus.right  # two columns
    assert engine.y == gpus.y  # same row, top aligned
    assert gpus.width > engine.width >= 60
    assert r["#headline"].bottom == gpus.y  # the headline sits directly above the panels
    assert r["#events"].y >= max(gpus.bottom, engine.bottom)


def test_narrow_terminal_stacks_the_panels(llama):
    pos = saturated_moment(llama, "link", "prefill", peak=True)
    r = regions(llama, pos, (100, 40))
    gpus, engine = r["#gpus"], r["#engine"]
    assert engine.x == 0 and engine.y >= gpus.bottom and engine.width == gpus.width == 100
    assert r["#headline"].bottom == gpus.y


@pytest.mark.parametrize("size", [(170, 45), (100, 40)], ids=["170x45", "100x40"])
def test_events_box_fills_the_rows_left_and_keeps_its_rows(llama, size):
    """The charts take the room a tall terminal has; the events box keeps its titled border with no events,
    grows to its header and rows when one comes, and reaches the position bar (no blank band between)."""
    before = regions(llama, 10, size)  # loading: no saturation yet
    assert before["events"] == 0 and before["#events"].height >= 2  # the titled border at least
    pos = saturated_moment(llama, "link", "prefill", peak=True)
    during = regions(llama, pos, size)
    assert during["events"] == 1 and during["#events"].height >= 1 + 1 + 2  # row, header, borders
    for r in (before, during):
        assert r["#position"].y - r["#events"].bottom <= 2
    assert during["#position"].bottom == size[1] - 1  # position bar still on screen above the footer


@pytest.mark.parametrize("size", [(80, 24), (100, 30), (120, 40), (170, 45), (200, 50)], ids=str)
def test_sparklines_take_the_rows_a_tall_terminal_leaves(size):
    """The GPU charts take every row the other boxes leave (issue 22), shared row by row (the first ones a
    row more where the rows do not divide evenly), so a tall terminal shows taller histories, not blank
    rows; the events box with no events keeps only its titled border, right above the position bar; from
    200x50 the shared time axis takes its TIMELINE_ROWS_MIN and more, and the charts stop at SPARK_ROWS_MAX."""
    from pcie_tui.tui.app import SPARK_ROWS_MAX, TIMELINE_AT

    rec = read_recording(LLAMA.with_name("h200-pageable.jsonl.gz"), warn=False)
    r = regions(rec, 120, size)  # mid-prefill, headline of two or three rows, no events
    rows = r["chart_rows"]  # TX, RX, DRAM
    assert len(rows) == 3 and min(rows) >= 1 and max(rows) - min(rows) <= 1 and rows == sorted(rows, reverse=True)
    assert r["events"] == 0 and r["#events"].height == 2 and r["#events"].bottom == r["#position"].y
    assert r["gpu_panel"].height == 2 + 3 + sum(rows)  # borders, badge/figures/legend, TX/RX/DRAM whole
    if size[0] >= TIMELINE_AT[0] and size[1] >= TIMELINE_AT[1]:
        assert max(rows) <= SPARK_ROWS_MAX
    else:  # nothing between the panels and the events box
        assert max(r["gpu_panel"].bottom, r["#engine"].bottom) == r["#events"].y, r
    if size[1] >= 40:
        assert min(rows) >= 2


def test_position_bar_stays_on_screen_when_the_panels_overflow():
    """80x18 replaying the pageable session with its engine: the panels need more rows than there
    are; the position bar (where the replay is) is docked above the footer, not pushed off."""
    rec = read_recording(LLAMA.with_name("h200-pageable.jsonl.gz"), warn=False)
    r = regions(rec, 120, (80, 18))  # mid-prefill
    assert r["#engine"].bottom + 2 > 18 - 2  # the panels reach the bottom rows ...
    assert r["#position"].y == 18 - 2 and r["#position"].height == 1  # ... the bar is still there


def test_a_short_terminal_keeps_the_engine_to_two_lines_and_shows_the_events():
    """80x24 (issue 22): the headline, the GPU panel, the engine's state and p50 timing on two lines, and
    the saturation events box with the newest event; the engine's full panel comes back from 30 rows."""
    rec = read_recording(LLAMA.with_name("h200-pinned.jsonl.gz"), warn=False)
    pos = saturated_moment(rec, "link", "prefill", peak=True)
    short, tall = regions(rec, pos, (80, 24)), regions(rec, pos, (80, 34))
    assert short["#engine"].height == 1 + 2  # its top rule and two lines
    assert short["events"] >= 1 and short["#events"].height >= 4 and short["#events"].bottom <= short["#position"].y
    assert tall["#engine"].height > 6


def test_many_events_are_capped_and_scroll(rec):
    """The probe's real ticks played three times in a row (times shifted): 12 events, more than the cap."""
    import dataclasses

    from pcie_tui.tui.events import EVENTS_MAX_ROWS

    span = rec.samples[-1].t - rec.samples[0].t + 1.0
    ticks = [dataclasses.replace(s, t=s.t + k * span) for k in range(3) for s in rec.samples]
    thrice = Recording(rec.path, rec.header, ticks)
    r = regions(thrice, len(ticks) - 1, (100, 40))
    assert r["events"] > EVENTS_MAX_ROWS
    # At least the capped rows, its header and borders; rows the charts above leave over (their heights
    # are whole rows) go to the box too, and hold more of the events, never a blank row.
    assert EVENTS_MAX_ROWS + 1 + 2 <= r["#events"].height <= r["events"] + 1 + 2
    assert "scroll for older" in r["events_title"]


# ---- headline -------------------------------------------------------------------------------


def test_headline_says_what_holds_the_phase_back(llama):
    pos = saturated_moment(llama, "link", "prefill", peak=True)
    r = regions(llama, pos, (100, 40))
    head, fix = r["headline"].split("\n")
    # The phase, what bound it so far, and the numbers against the ceiling it was compared with.
    assert head.startswith("prefill so far (") and ": link-saturated " in head  # live: the figures so far
    assert " of 56.7 GB/s pinned (default)" in head  # this older recording has no calibration
    # Then the change the engine's own flags point to (llama-server --n-cpu-ffn 12 -ub 128).
    assert fix.startswith("Fix: keep more of those weights in VRAM") and "--n-cpu-ffn" in fix
    assert r["headline_display"] and head[:40] in r["headline_shown"]
    # 100 columns (98 inside the padding): one row per line that fits, two where it wraps.
    assert r["#headline"].height == -(-len(head) // 98) + -(-len(fix) // 98)
    assert regions(llama, pos, (80, 30))["#headline"].height == 4  # at 80 both wrap


def test_headline_hidden_before_any_reading(llama):
    r = regions(llama, 0, (100, 40))
    assert r["headline"] is None and not r["headline_display"]
    assert r["#panels"].y == 1  # the panels move up under the header


def test_headline_text_follows_the_verdict(rec):
    vm = ViewModel(rec.header)
    assert headline_text(vm) is None
    seen = {}
    for s in rec.samples:
        vm.feed(s)
        seen[vm.phase] = headline_text(vm)  # as the phase ends
    # Each labelled phase of the H200 probe, named by what bound it.
    assert seen["h2d_pinned"].startswith("h2d_pinned so far (") and ": link-saturated" in seen["h2d_pinned"]
    assert seen["d2d_copy"].startswith("d2d_copy so far (") and ": memory-bound" in seen["d2d_copy"]
    assert seen["matmul"].startswith("matmul so far (") and ": compute-bound" in seen["matmul"]
    # 1.3 GB/s trickle copies with the GPU idle: below the pageable floor, and no engine says work was in flight.
    assert seen["h2d_trickle"].startswith("h2d_trickle so far (") and ": host-bound" in seen["h2d_trickle"]
    # Between phases of work (the probe's "gap"): the longest phase of work so far stays the answer, and the
    # headline says the phase now first, so it never disagrees with the GPU panel's phase (issue 22).
    assert seen["gap"].startswith("gap now · so far the longest work: d2h_pinned so far (")
    assert ": link-saturated" in seen["gap"]


def test_headline_takes_the_rows_its_lines_need_a_quarter_of_the_screen_at_most(llama):
    """The fix line must stay on screen in a narrow terminal: the bar grows to fit (four rows at most, or a
    quarter of the screen's where that is more)."""
    pos = saturated_moment(llama, "link", "prefill", peak=True)
    head, fix = regions(llama, pos, (170, 45))["headline"].split("\n")
    wide = regions(llama, pos, (170, 45))["#headline"].height
    assert len(head) <= 168 and len(fix) <= 168 and wide == 2  # one row each
    narrow = regions(llama, pos, (100, 30))
    assert narrow["#headline"].height == min(7, -(-len(head) // 98) + -(-len(fix) // 98))
    assert regions(llama, pos, (40, 30))["#headline"].height == headline_rows_max(30) == 7
    assert headline_rows_max(16) == 4


def test_the_default_demo_shows_its_whole_fix_at_80x24():
    """The pageable demo's headline in prefill takes six rows at 80 columns: all of them are shown (four cut
    it off before what -lm none saves, while the events box below stood empty)."""
    rec = read_recording(demos.resolve("h200-pageable"), warn=False)
    pos = len(rec.samples) // 2  # in the prefill
    r = regions(rec, pos, (80, 24))
    assert r["headline"].startswith("prefill so far (") and r["headline"].endswith("prefill 12.2 s -> 1.7-2.1 s.")
    assert r["headline_shown"].replace("\n", " ").split() == r["headline"].split()
    assert r["#headline"].height == len(r["headline_shown"].split("\n")) == 6


@pytest.mark.parametrize("width", [50, 80, 100, 130])
def test_headline_bar_never_parts_a_number_from_its_unit(llama, width):
    """The bar wraps its lines itself (pcie_tui.core.units.wrap): at any width a number and its unit
    share a row, and the text shown is the headline's, word for word."""
    from pcie_tui.core import units

    pos = saturated_moment(llama, "link", "prefill", peak=True)
    r = regions(llama, pos, (width, 40))
    shown = r["headline_shown"].split("\n")
    assert shown == [part for ln in r["headline"].split("\n") for part in units.wrap(ln, width - 2)]
    unit = re.compile("(?:" + "|".join(re.escape(u) for u in units.UNITS) + r")(?![\w/])")
    for a, b in zip(shown, shown[1:], strict=False):
        assert not (re.search(r"\d$", a.rstrip()) and unit.match(b.lstrip())), (a, b)
