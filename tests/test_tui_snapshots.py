"""Snapshot tests: the screen at fixed replay positions of the real H200 probe, at explicit sizes.

Deterministic: the replay is paused at a fixed tick before the first frame, the
screen has no clock and no focused input (no cursor blink). Update with
``pytest tests/test_tui_snapshots.py --snapshot-update`` after checking the
report's diff by eye.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from pcie_tui.recording.reader import read_recording
from pcie_tui.tui.headless import frame_at, saturated_moment, scaled_gpus, wait_until
from pcie_tui.tui.headless import paused_app as paused_at

PROBE = Path(__file__).parent / "fixtures" / "h200-probe.jsonl"
LLAMA = Path(__file__).parents[1] / "pcie_tui" / "data" / "h200-llama-partial.jsonl.gz"


def paused_app(position: int | None = None, resource: str = "link", phase: str = "h2d", path: Path = PROBE):
    rec = read_recording(path)
    pos = position if position is not None else saturated_moment(rec, resource, phase)
    app = paused_at(rec, pos)

    async def ready(pilot):
        await wait_until(pilot, lambda: frame_at(app, pos))

    return app, ready


@pytest.mark.parametrize("size", [(80, 24), (140, 45)], ids=["80x24", "140x45"])
def test_link_saturated_during_h2d(snap_compare, size):
    app, ready = paused_app()
    assert snap_compare(app, terminal_size=size, run_before=ready)


@pytest.mark.parametrize("size", [(80, 24), (140, 45)], ids=["80x24", "140x45"])
def test_dram_saturated_during_device_copy(snap_compare, size):
    app, ready = paused_app(resource="memory", phase="d2d")
    assert snap_compare(app, terminal_size=size, run_before=ready)


def test_sources_screen_80x24(snap_compare):
    app, ready = paused_app()

    async def open_sources(pilot):
        await ready(pilot)
        await pilot.press("question_mark")
        await pilot.pause()

    assert snap_compare(app, terminal_size=(80, 24), run_before=open_sources)


def test_llama_prefill_side_by_side_170x45(snap_compare):
    """Wide: the GPU panel and the engine panel in two columns, the headline above them."""
    app, ready = paused_app(phase="prefill", path=LLAMA)
    assert snap_compare(app, terminal_size=(170, 45), run_before=ready)


def test_llama_prefill_one_time_axis_200x50(snap_compare):
    """200x50: link TX/RX, DRAM and tokens/s stacked on one time axis beside the events."""
    app, ready = paused_app(phase="prefill", path=LLAMA)
    assert snap_compare(app, terminal_size=(200, 50), run_before=ready)


@pytest.mark.parametrize("size", [(80, 24), (160, 45)], ids=["80x24", "160x45"])
def test_eight_gpus_one_line_each(snap_compare, size):
    """The llama-server session scaled to 8 GPUs (GPU i: the reading i/8 of the session later)."""
    rec = scaled_gpus(read_recording(LLAMA), 8)
    pos = saturated_moment(read_recording(LLAMA), "link", "prefill")
    app = paused_at(rec, pos)

    async def ready(pilot):
        await wait_until(pilot, lambda: frame_at(app, pos), 20)

    assert snap_compare(app, terminal_size=size, run_before=ready)
