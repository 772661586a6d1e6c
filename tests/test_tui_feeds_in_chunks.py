"""The screen's model takes ticks one by one but analyses them in a chunk when it is next read (issue 22:
a tick's analysis alone cost ~0.8 ms with 8 GPUs, a chunk of six ~0.3 ms a tick): every frame is the frame
the model fed and analysed tick by tick gives, history and phases included, through seeks and the end."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from pcie_tui.recording.reader import read_recording
from pcie_tui.tui.headless import scaled_gpus
from pcie_tui.tui.state import ViewModel

DATA = Path(__file__).parents[1] / "pcie_tui" / "data"
PROBE = Path(__file__).parent / "fixtures" / "h200-probe.jsonl"


def _same(a, b) -> None:
    assert dataclasses.replace(a, built_s=0.0) == dataclasses.replace(b, built_s=0.0)


@pytest.mark.parametrize(
    ("path", "gpus"),
    [(PROBE, 1), (DATA / "h200-llama-partial.jsonl.gz", 1), (DATA / "h200-llama-partial.jsonl.gz", 8),
     (DATA / "h100-heat.jsonl.gz", 1), (DATA / "h200-pageable.jsonl.gz", 1)],
)  # fmt: skip
def test_frames_equal_tick_by_tick(path, gpus):
    rec = read_recording(path, warn=False)
    if gpus > 1:
        rec = scaled_gpus(rec, gpus)
    samples = list(rec.samples)
    events = getattr(rec, "events", ()) or ()
    by_tick = ViewModel(rec.header, events=events)
    chunked = ViewModel(rec.header, events=events)
    frames = 0
    for i, s in enumerate(samples):
        by_tick.feed(s)
        assert by_tick.analysis.session.n == i + 1  # read after every tick: analysed tick by tick
        chunked.feed(s)
        if i % 5 == 4 or i == len(samples) - 1:  # a frame every 5 ticks, as the worker's 2 a second at 10 Hz
            _same(by_tick.frame(), chunked.frame())
            frames += 1
    _same(by_tick.frame(ended=True), chunked.frame(ended=True))
    for vm in (by_tick, chunked):  # a seek back, then forwards: the rebuilt history and analysis
        vm.rebuild(samples, len(samples) // 3)
    _same(by_tick.frame(), chunked.frame())
    for vm in (by_tick, chunked):
        vm.advance(samples, len(samples) // 2)
    _same(by_tick.frame(), chunked.frame())
    assert frames >= len(samples) // 5
