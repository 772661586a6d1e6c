"""A replay seek analyses what it skips in chunks (SessionAnalyzer.feed_all); the screen's state
must be what feeding every tick would have left: verdicts, events, the live answer, the frame."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from pcie_tui.recording.reader import read_recording
from pcie_tui.tui.state import ViewModel

DATA = Path(__file__).parent.parent / "pcie_tui" / "data"
DEMOS = sorted(DATA.glob("*.jsonl.gz"))


def _state(vm: ViewModel):
    an = vm.analyzer
    return (
        vm.n,
        {i: (tr.verdict, tr.last_util) for i, tr in an.trackers.items()},
        [dataclasses.asdict(e) for e in an.events],
        vm.answer().to_json(),
        _frame(vm),
    )


def _frame(vm: ViewModel):
    # A seek starts the peaks afresh by design; built_s is the wall clock of the build.
    f = vm.frame()
    gpus = tuple(dataclasses.replace(g, peak_tx_Bps=None, peak_rx_Bps=None) for g in f.gpus)
    return dataclasses.replace(f, gpus=gpus, built_s=0.0)


@pytest.mark.parametrize("path", DEMOS, ids=lambda p: p.name)
def test_seek_equals_feeding_every_tick(path: Path) -> None:
    rec = read_recording(path, warn=False)
    samples = list(rec.samples)
    assert len(samples) > 100
    for upto in (len(samples) // 2, len(samples)):
        ticked = ViewModel(rec.header, history_ticks=40)
        for s in samples[:upto]:
            ticked.feed(s)
        seek = ViewModel(rec.header, history_ticks=40)
        seek.rebuild(samples, upto)  # >= 64 ticks before the history window: the chunked path
        assert _state(seek) == _state(ticked)
        # and forwards from there, tick by tick, stays equal
        for s in samples[upto : upto + 30]:
            seek.feed(s)
            ticked.feed(s)
        assert _state(seek) == _state(ticked)
