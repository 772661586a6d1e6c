"""``report`` reads a recording a block at a time (issue 21: flat memory on long files): the streamed
report must say exactly what the whole-file report says, and where the blocks fall must not matter."""

from __future__ import annotations

import gzip
import json
import pickle
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from pcie_tui.recording import demos
from pcie_tui.recording.reader import RowStream, read_recording
from pcie_tui.recording.validate import finite_json
from pcie_tui.report.text import build_report, report_file

FIXTURES = Path(__file__).parent / "fixtures"
RECORDINGS = sorted(demos.available().values()) + sorted(
    p for p in FIXTURES.rglob("*.jsonl*") if p.suffix in (".jsonl", ".gz")
)


def _json(report: dict) -> str:
    return json.dumps(finite_json(report), sort_keys=True)


def _read_all(path: Path, block_bytes: int) -> tuple:
    st_ = RowStream(path, block_bytes=block_bytes)
    ticks = [d for ch in st_.chunks() for d in ch]
    return ticks, st_.events, st_.segments, st_.gaps, sorted(st_.warnings)


@pytest.mark.parametrize("path", RECORDINGS, ids=lambda p: p.name)
def test_streamed_report_says_what_the_whole_file_report_says(path: Path) -> None:
    streamed, _, _, ticks = report_file(path)
    rec = read_recording(path, warn=False)
    assert ticks == len(rec.samples)
    whole, _ = build_report(rec)
    assert _json(streamed) == _json(whole)
    # and from Samples (the live and plot path) the same again
    rec = read_recording(path, warn=False)
    rec.samples.as_list()  # type: ignore[attr-defined]
    from_samples, _ = build_report(rec)
    assert _json(from_samples) == _json(whole)


@pytest.mark.parametrize("path", RECORDINGS[::3], ids=lambda p: p.name)
def test_where_the_blocks_fall_does_not_matter(path: Path) -> None:
    whole = _read_all(path, 1 << 30)
    for size in (64, 4093):
        assert _read_all(path, size) == whole


def _tick(t: float, rx: float | None = 1e9) -> dict:
    g = {"index": 0, "pcie_tx_Bps": 1e8, "pcie_rx_Bps": rx, "sm_util": 0.5, "dram_bw_util": 0.2}
    return {"t": t, "gpus": [g], "engine": {"kind": "llamacpp", "up": True, "phase": "prefill"}}


HEADER = {
    "format": "pcie-tui/recording",
    "version": 1,
    "created": "2026-12-07T00:00:00Z",
    "host": "h",
    "interval_s": 0.1,
    "gpus": [{"index": 0, "name": "H200", "link": {"gen": 5, "width": 16}}],
}

# What a long recording's lines may be: good ticks, a hole, time going back, a second header, an event, a
# damaged line, a NaN only stdlib json reads, blank lines; a cut last line at the end.
LINE = st.sampled_from(["tick", "tick", "tick", "tick", "hole", "back", "header", "event", "junk", "nan", "blank"])


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(kinds=st.lists(LINE, min_size=1, max_size=60), cut=st.booleans(), gz=st.booleans(), size=st.integers(40, 900))
def test_damaged_recordings_read_the_same_in_any_blocks(tmp_path: Path, kinds, cut, gz, size) -> None:
    t, lines = 1000.0, [json.dumps(HEADER)]
    for k in kinds:
        t += 0.1
        if k == "tick":
            lines.append(json.dumps(_tick(t)))
        elif k == "hole":
            t += 30
            lines.append(json.dumps(_tick(t)))
        elif k == "back":
            lines.append(json.dumps(_tick(t - 5)))
        elif k == "header":
            lines.append(json.dumps(HEADER))
        elif k == "event":
            lines.append(json.dumps({"event": "engine_gap", "t": t}))
        elif k == "junk":
            lines.append('{"t": 12, "gpus": [')
        elif k == "nan":
            lines.append(json.dumps(_tick(t)).replace("1000000000.0", "NaN"))
        else:
            lines.append("")
    text = "\n".join(lines) + ("\n" if not cut else "\n" + json.dumps(_tick(t + 1))[:25])
    path = tmp_path / ("r.jsonl.gz" if gz else "r.jsonl")
    path.write_bytes(gzip.compress(text.encode()) if gz else text.encode())
    assert _read_all(path, size) == _read_all(path, 1 << 30)
    rec = read_recording(path, warn=False)
    if len(rec.samples):
        assert _json(report_file(path)[0]) == _json(build_report(rec)[0])


def _chunk_fields(ch) -> tuple:
    return (ch.t, ch.phase, ch.engine, ch.tick_of.tolist(), ch.index.tolist(), ch.cols.tobytes(), ch.single)


@pytest.mark.parametrize("path", RECORDINGS, ids=lambda p: p.name)
def test_the_checks_sweeps_handed_on_equal_fresh_sweeps(path: Path) -> None:
    """report feeds the analysis and the engine fold the columns the reader's check swept (RowStream.columns_of):
    the chunks built from them are the chunks built from the rows alone, the engine fold the same."""
    from pcie_tui.analyze.columns import from_rows
    from pcie_tui.analyze.engine_bytes import chunk_up_fields, up_fields
    from pcie_tui.analyze.engine_session import EngineSessionFold

    st_ = RowStream(path, block_bytes=1 << 16)
    handed, fresh = EngineSessionFold(), EngineSessionFold()
    for rows in st_.chunks():
        swept = st_.columns_of(rows)
        assert swept is not None and swept.rows is rows  # a bundled recording passes every check in bulk
        for a, b in zip(from_rows(rows, 700, swept), from_rows(list(rows), 700), strict=True):
            assert _chunk_fields(a) == _chunk_fields(b)
            assert chunk_up_fields(a) == up_fields(b.engine)
        handed.feed_rows(rows, swept)
        fresh.feed_rows(rows)
    assert st_.columns_of([]) is None
    assert pickle.dumps(handed) == pickle.dumps(fresh)  # every array, counter and histogram fold alike


def test_a_block_checked_tick_by_tick_hands_on_no_columns(tmp_path: Path) -> None:
    lines = [json.dumps(HEADER), json.dumps(_tick(1000.1)), json.dumps(_tick(1000.0)), json.dumps(_tick(1000.2))]
    path = tmp_path / "back.jsonl"
    path.write_text("\n".join(lines) + "\n")
    st_ = RowStream(path)
    kept = [(rows, st_.columns_of(rows)) for rows in st_.chunks()]
    assert [len(r) for r, _ in kept] == [2] and kept[0][1] is None  # time went back: checked alone


@pytest.mark.parametrize("path", RECORDINGS[:3], ids=lambda p: p.name)
def test_session_feed_rows_takes_the_checks_sweeps(path: Path) -> None:
    """SessionAnalyzer.feed_rows given the reader's swept columns ends as it does from the rows alone."""
    from pcie_tui.analyze.session import SessionAnalyzer

    st_ = RowStream(path, block_bytes=1 << 16)
    handed, fresh = SessionAnalyzer(st_.header), SessionAnalyzer(st_.header)
    for rows in st_.chunks():
        swept = st_.columns_of(rows)
        assert swept is not None
        assert handed.feed_rows(rows, 700, swept) is handed
        fresh.feed_rows(list(rows), 700)
    handed.finish()
    fresh.finish()
    assert _json(handed.summary()) == _json(fresh.summary())
    assert [e.to_json() for e in handed.events] == [e.to_json() for e in fresh.events]


@settings(max_examples=200, deadline=None)
@given(
    st.lists(
        st.lists(st.one_of(st.none(), st.integers(0, 10**6), st.floats(0, 1e6, allow_nan=False)), max_size=12),
        max_size=6,
    )
)
def test_a_counters_fold_of_arrays_equals_its_fold_of_lists(blocks) -> None:
    """The engine fold's counter total from float arrays (NaN where not read: a checked block's columns) is
    the one its list path gives, reads of ints and floats, drops (a restart) and blocks without a read
    included."""
    import numpy as np

    from pcie_tui.analyze.engine_session import _CounterFold

    a, b = _CounterFold(), _CounterFold()
    for vals in blocks:
        a.add(list(vals))
        b.add(np.array(vals, dtype=np.float64))
        assert a.total == b.total
        assert (a.prev is None) == (b.prev is None) and (a.prev is None or float(a.prev) == b.prev)
