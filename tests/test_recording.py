"""Recording format v1: round trips, flush-per-line durability, tolerant reading."""

from __future__ import annotations

import gzip
import json
import math
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pcie_tui.core.errors import UserError
from pcie_tui.core.model import EngineSample, GpuSample, Sample
from pcie_tui.recording.reader import read_recording
from pcie_tui.recording.writer import RecordingWriter

REPO = Path(__file__).parent.parent


def _probe(path):
    return read_recording(path, warn=False)


@pytest.mark.parametrize("suffix", [".jsonl", ".jsonl.gz"])
def test_round_trip_keeps_every_value(tmp_path, probe_recording_path, suffix):
    rec = _probe(probe_recording_path)
    out = tmp_path / f"copy{suffix}"
    with RecordingWriter(out, rec.header) as w:
        for s in rec.samples:
            w.write(s)
    back = _probe(out)
    assert back.header == rec.header
    assert back.samples == rec.samples
    assert back.warnings == []


def test_contract_keys_present(tmp_path, probe_recording_path):
    lines = probe_recording_path.read_text().splitlines()
    head = json.loads(lines[0])
    for k in ("format", "version", "created", "host", "tool_version", "gpus", "engine"):
        assert k in head
    assert head["format"] == "pcie-tui/recording" and head["version"] == 1
    g = head["gpus"][0]
    for k in ("index", "uuid", "name", "pci_bus_id", "link", "memory_total_bytes"):
        assert k in g
    for k in ("gen", "width", "max_gen", "max_width", "capacity_Bps"):
        assert k in g["link"]
    tick = json.loads(lines[1])
    assert set(tick) >= {"t", "gpus", "engine"}
    for k in (
        "index",
        "pcie_tx_Bps",
        "pcie_rx_Bps",
        "nvlink_tx_Bps",
        "nvlink_rx_Bps",
        "dram_bw_util",
        "mem_busy",
        "sm_util",
        "mem_used_bytes",
        "power_W",
    ):
        assert k in tick["gpus"][0]


def test_nan_and_inf_become_null(tmp_path, probe_recording_path):
    rec = _probe(probe_recording_path)
    out = tmp_path / "nan.jsonl"
    with RecordingWriter(out, rec.header) as w:
        w.write(Sample(t=1.0, gpus=(GpuSample(0, pcie_tx_Bps=math.nan, dram_bw_util=math.inf, sm_util=0.5),)))
    tick = json.loads(out.read_text().splitlines()[1])["gpus"][0]
    assert tick["pcie_tx_Bps"] is None and tick["dram_bw_util"] is None and tick["sm_util"] == 0.5


def test_truncated_last_line_is_skipped_with_a_warning(tmp_path, probe_recording_path, capsys):
    data = probe_recording_path.read_bytes()
    cut = tmp_path / "cut.jsonl"
    cut.write_bytes(data[: len(data) - 40])
    rec = read_recording(cut)
    full = _probe(probe_recording_path)
    assert len(rec.samples) == len(full.samples) - 1
    assert rec.samples == full.samples[:-1]
    assert "truncated last line" in capsys.readouterr().err


def test_garbage_and_foreign_files_are_one_line_errors(tmp_path):
    for content, needle in [(b"", "empty"), (b"hello\n", "not JSON"), (b'{"a": 1}\n', "not a pcie-tui recording")]:
        p = tmp_path / "x.jsonl"
        p.write_bytes(content)
        with pytest.raises(UserError, match=needle):
            read_recording(p)
    p = tmp_path / "v9.jsonl"
    p.write_text('{"format": "pcie-tui/recording", "version": 9}\n')
    with pytest.raises(UserError, match="version 9"):
        read_recording(p)
    with pytest.raises(UserError, match="no such recording"):
        read_recording(tmp_path / "missing.jsonl")


_WRITER = """
import sys, time
from pcie_tui.recording.reader import read_recording
from pcie_tui.recording.writer import RecordingWriter
rec = read_recording(sys.argv[1], warn=False)
w = RecordingWriter(sys.argv[2], rec.header)
for i, s in enumerate(rec.samples):
    w.write(s)
    if i == 49:
        print("50", flush=True)
        time.sleep(60)
"""


@pytest.mark.parametrize("suffix", [".jsonl", ".jsonl.gz"])
def test_sigkill_loses_nothing_already_written(tmp_path, probe_recording_path, suffix):
    out = tmp_path / f"killed{suffix}"
    proc = subprocess.Popen(
        [sys.executable, "-c", _WRITER, str(probe_recording_path), str(out)], stdout=subprocess.PIPE, text=True
    )
    try:
        assert proc.stdout is not None and proc.stdout.readline().strip() == "50"
    finally:
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait()
    rec = read_recording(out, warn=False)
    assert rec.samples == _probe(probe_recording_path).samples[:50]
    if suffix == ".jsonl.gz":
        assert any("ends early" in w for w in rec.warnings)


def test_gz_file_is_real_gzip(tmp_path, probe_recording_path):
    rec = _probe(probe_recording_path)
    out = tmp_path / "r.jsonl.gz"
    with RecordingWriter(out, rec.header) as w:
        for s in rec.samples:
            w.write(s)
    with gzip.open(out, "rt") as f:
        assert json.loads(f.readline())["format"] == "pcie-tui/recording"
        assert sum(1 for _ in f) == len(rec.samples)


_finite = st.one_of(st.none(), st.floats(min_value=0, max_value=1e12, allow_nan=False))
_fraction = st.one_of(st.none(), st.floats(min_value=0, max_value=1, allow_nan=False))  # utils are checked 0..1


@settings(max_examples=60, deadline=None)
@given(
    st.lists(
        st.tuples(_finite, _finite, _fraction, st.one_of(st.none(), st.integers(0, 1 << 40)), st.booleans()),
        min_size=1,
        max_size=20,
    )
)
def test_round_trip_property(tmp_path_factory, rows):
    rec = read_recording(REPO / "tests/fixtures/h200-probe.jsonl", warn=False)
    out = tmp_path_factory.mktemp("rt") / "p.jsonl.gz"
    samples = []
    for i, (tx, rx, dram, used, up) in enumerate(rows):
        eng = EngineSample("vllm", up, "decode", 10.0 * i, 3.0 * i, 1.0, 0.0, extra={"hist": {"ttft_s": [[0.1, i]]}})
        samples.append(Sample(time.time() + i, (GpuSample(0, tx, rx, None, None, dram, None, dram, used, None),), eng))
    with RecordingWriter(out, rec.header) as w:
        for s in samples:
            w.write(s)
    assert read_recording(out, warn=False).samples == samples
