"""``replay`` of a long recording (issue 21): the first frame comes from the first block while the rest is read
in the background, the screen says how far the reading is, and what plays is every tick the file holds."""

from __future__ import annotations

import gzip
import json
import time
from pathlib import Path

import pytest

from pcie_tui.recording import demos
from pcie_tui.recording.reader import open_progressively, read_recording
from pcie_tui.recording.replay import ReplaySource
from pcie_tui.tui.state import ViewModel
from pcie_tui.tui.widgets import position_text


def _long(tmp_path: Path, copies: int = 30, gz: bool = False) -> Path:
    """h200-pageable repeated end to end (times shifted), with a damaged line and a hole in the middle."""
    with gzip.open(demos.resolve("h200-pageable")) as f:
        lines = [json.loads(x) for x in f]
    header, ticks = lines[0], [d for d in lines[1:] if "gpus" in d]
    span = ticks[-1]["t"] - ticks[0]["t"] + 0.1
    out = [json.dumps(header)]
    for k in range(copies):
        shift = k * span + (60.0 if k >= copies // 2 else 0.0)  # a one-minute hole halfway
        out += [json.dumps(dict(d, t=d["t"] + shift)) for d in ticks]
        if k == 3:
            out.append('{"t": 1, "gpus": [')  # damage mid-file
    text = ("\n".join(out) + "\n").encode()
    path = tmp_path / ("long.jsonl.gz" if gz else "long.jsonl")
    path.write_bytes(gzip.compress(text) if gz else text)
    return path


def _wait_loaded(rec, timeout: float = 60.0) -> None:
    rec.loading.go.set()
    end = time.monotonic() + timeout
    while not rec.loading.done and time.monotonic() < end:
        time.sleep(0.01)
    assert rec.loading.done


@pytest.mark.parametrize("gz", [False, True])
def test_progressive_reading_ends_with_exactly_what_a_whole_read_gives(tmp_path: Path, gz: bool) -> None:
    path = _long(tmp_path, gz=gz)
    whole = read_recording(path, warn=False)
    rec = open_progressively(path)
    assert rec.loading is not None and not rec.loading.done
    assert 0 < len(rec.samples) < len(whole.samples)  # the first block only, until the replay is under way
    assert rec.loading.text().startswith("loading ") and rec.loading.text().endswith(" MB")
    _wait_loaded(rec)
    assert rec.samples == whole.samples.as_list()
    assert rec.warnings == whole.warnings and any("unreadable line" in w for w in rec.warnings)
    assert rec.gaps == whole.gaps and len(rec.gaps) == 1
    assert rec.events == whole.events and rec.segments == whole.segments
    assert rec.loading.text() is None


def test_a_small_recording_is_read_whole_at_once() -> None:
    rec = open_progressively(demos.resolve("h200-pinned"))
    assert rec.loading is not None and rec.loading.done
    assert rec.samples == read_recording(demos.resolve("h200-pinned"), warn=False).samples.as_list()


def test_the_replay_plays_every_tick_while_the_rest_is_read(tmp_path: Path) -> None:
    path = _long(tmp_path, copies=20)
    total = len(read_recording(path, warn=False).samples)
    rec = open_progressively(path)
    src = ReplaySource(rec, speed=1000.0)
    first = src.read()
    model = ViewModel(rec.header, events=rec.events)
    model.feed(first)
    view = model.replay_view(src)
    assert view.loading is not None and view.loading.startswith("loading")
    assert "loading" in position_text(_frame(view), 160, False, None).plain
    n, last_t = 1, first.t
    src._hole_ends = set()  # play the hole at 1000x too: this test is about ticks, not pacing
    src._gaps = []
    while (s := src.read()) is not None:  # the end of what is read so far is not the end of the replay
        assert s.t > last_t
        n, last_t = n + 1, s.t
    assert n == total and rec.loading.done
    assert model.replay_view(src).loading is None


def _frame(view):
    class F:
        replay = view

    return F()
