"""Habits users bring: Ctrl-C quits, the layout follows the terminal, a headline says what holds things back."""

from __future__ import annotations

import gzip
from pathlib import Path

import pytest

from pcie_tui.record.reader import Recording, read_recording
from pcie_tui.record.replay import ReplaySource
from pcie_tui.record.writer import RecordingWriter
from pcie_tui.tui.app import make_app
from pcie_tui.tui.headless import run, wait_until
from pcie_tui.tui.screens import SourcesScreen

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
