"""The TUI's pure parts without a terminal: formatting, sparkline cells, the replay/seek bookkeeping."""

from __future__ import annotations

from pathlib import Path

import pytest

from pcie_tui.analyze.session import SessionAnalyzer
from pcie_tui.analyze.verdict import Thresholds
from pcie_tui.recording.reader import read_recording
from pcie_tui.recording.replay import ReplaySource
from pcie_tui.tui import fmt, spark
from pcie_tui.tui.app import make_app
from pcie_tui.tui.state import ViewModel

PROBE = Path(__file__).parent / "fixtures" / "h200-probe.jsonl"


@pytest.fixture(scope="module")
def rec():
    return read_recording(PROBE)


def test_formatting_units_and_missing():
    assert fmt.rate(None) == fmt.pct(None) == fmt.gib(None) == fmt.watts(None) == fmt.seconds(None) == "n/a"
    assert fmt.rate(0.0) == "0 B/s"  # a zero reading is a reading, with its unit
    assert fmt.rate(58.02e9) == "58.0 GB/s"
    assert fmt.rate(5.163e9) == "5.16 GB/s"
    assert fmt.rate(835584.0) == "836 kB/s"
    assert fmt.rate(4.22e12) == "4.22 TB/s"
    assert fmt.gbps(63.015e9) == "63.0 GB/s"
    assert fmt.pct(0.877) == "88 %"
    assert fmt.gib(150754820096) == "140.4 GiB"
    assert fmt.seconds(0.0921) == "92 ms" and fmt.seconds(0.0052) == "5.2 ms" and fmt.seconds(2.34) == "2.34 s"
    assert fmt.link(5, 16) == "Gen5 x16" and fmt.link(None, 16) == "Gen? x16"


def test_sparkline_cells_keep_the_peak_and_show_missing_as_a_dot():
    values = [1.0, 9.0, 2.0, None, None, None, 4.0, 0.0]
    phases = ["a", "a", "a", "b", "b", "b", "c", "c"]
    cells = spark.buckets(values, phases, start=0, width=3, per_cell=3)
    assert cells == [(9.0, "a", True), (None, "b", True), (4.0, "c", True)]
    # absolute alignment: the same tick always lands in the same cell as history scrolls
    shifted = spark.buckets(values[1:], phases[1:], start=1, width=3, per_cell=3)
    assert shifted[1:] == cells[1:] and shifted[0] == (9.0, "a", True)
    row = spark.render(values, phases, 0, width=8, height=1, scale=9.0, history_ticks=8).plain
    assert row == "▁█▂···▄▁"  # zero is the lowest bar, missing is a dot
    empty = spark.render([], [], 0, width=4, height=1, scale=1.0, history_ticks=8).plain
    assert empty == "    "
    two = spark.render([9.0, 4.5], [None, None], 0, width=2, height=2, scale=9.0, history_ticks=2).plain
    assert two.split("\n") == ["█ ", "██"]  # half scale fills the bottom row only


def test_phase_colours_are_stable():
    assert spark.phase_bg("idle") is None and spark.phase_bg(None) is None
    assert spark.phase_bg("h2d_pinned") == spark.phase_bg("h2d_pinned")
    assert spark.phase_bg("decode") != spark.phase_bg("prefill")


def test_seek_landing_before_or_after_a_read(rec):
    """The reader thread cannot know whether a seek came before or after the tick it just read."""
    src = ReplaySource(rec, speed=1000.0)
    m = ViewModel(rec.header)
    for _ in range(50):
        assert m.sync_replay(src, src.read()) is False
    assert m.n == 50
    # seek back, then the read: the tick read is the seek target's, and is fed
    src.seek_to_index(10)
    s = src.read()
    assert s is rec.samples[10]
    assert m.sync_replay(src, s) is True and m.n == 11
    # a read, then a seek back before the reader reconciles: the stale tick is dropped
    s = src.read()
    assert s is rec.samples[11]
    src.seek_to_index(5)
    assert m.sync_replay(src, s) is True and m.n == 5
    an = SessionAnalyzer(rec.header, keep_series=False).feed_all(rec.samples[:5])
    assert m.analyzer.n == an.n == 5
    # a seek forward analyses the skipped ticks (events across the gap are kept)
    src.seek_to_index(100)
    assert m.sync_replay(src, None) is True and m.n == 100
    full = SessionAnalyzer(rec.header, keep_series=False).feed_all(rec.samples[:100])
    assert [(e.resource, e.start, e.end) for e in m.analyzer.events] == [
        (e.resource, e.start, e.end) for e in full.events
    ]
    # history holds exactly the last ticks before the position
    f = m.frame(m.replay_view(src))
    assert f.gpus[0].hist_rx == tuple(s.gpus[0].pcie_rx_Bps for s in rec.samples[:100])
    assert f.replay.position == 100 and f.replay.current_t == rec.samples[99].t


def test_thresholds_reach_the_analysis(rec):
    strict = Thresholds(link_enter=0.999, link_exit=0.99)  # above any reading in the probe
    for th, want in ((None, "link"), (strict, "none")):
        app = make_app(ReplaySource(rec), thresholds=th)
        app.model.rebuild(rec.samples, 25)  # inside the pinned H2D copy
        assert app.model.frame().gpus[0].verdict == want
