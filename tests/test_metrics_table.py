"""The metrics table drives the codec, validation, bulk columns, TUI, ``?`` page and export.

The recipe test adds one row at test time (a fake "encoder utilisation" with its own fake
collector value) and follows it through every consumer without touching any other file.
"""

from __future__ import annotations

import dataclasses
import gzip
import json
from pathlib import Path

import pytest
from fakenvml import FakeNvml, ManualClock, load_capture

from pcie_tui.analyze.session import analyze_rows
from pcie_tui.core import metrics
from pcie_tui.core.model import TYPED_METRICS, GpuSample, Sample, SessionHeader
from pcie_tui.export.prometheus import ExportState, PrometheusCollector
from pcie_tui.recording import reader, validate
from pcie_tui.recording.reader import read_recording, read_rows
from pcie_tui.recording.replay import ReplaySource
from pcie_tui.recording.writer import RecordingWriter
from pcie_tui.sources.nvml import NvmlCollector
from pcie_tui.tui import fmt
from pcie_tui.tui.app import make_app
from pcie_tui.tui.gpu_panel import GpuPanel
from pcie_tui.tui.headless import frame_at, run, screen_text, wait_until
from pcie_tui.tui.screens import SourcesScreen
from pcie_tui.tui.sources import figure_sources

NAME = "test_enc_util"
ROW = metrics.Metric(
    NAME,
    "fraction of time",
    "fraction",
    0.0,
    1.05,
    clamp=1.0,
    show=metrics.Show("ENC", "pct"),
    sources=(
        metrics.Source("ENC", "nvmlDeviceGetEncoderUtilization (test row)", "% -> fraction", "driver sample period"),
    ),
    prom=metrics.Prom("pcie_test_encoder_util_ratio", "video encoder busy, 0..1 (test row)"),
)
# What the fake collector reads, tick by tick (1.5 is junk the validation must turn into n/a).
READINGS = [0.25, 0.5, 1.5, None, 1.02, 0.75]
KEPT = [0.25, 0.5, None, None, 1.0, 0.75]


@pytest.fixture
def row():
    metrics.register(ROW)
    try:
        yield ROW
    finally:
        metrics.unregister(NAME)


class EncoderCollector(NvmlCollector):
    """The stand-in NVML collector plus the new row's reading, as a real collector would add it."""

    def __init__(self, *a, **kw) -> None:
        super().__init__(*a, **kw)
        self.enc = iter(READINGS)

    def _read_device(self, d):  # noqa: ANN001 - the parent's private type
        s = super()._read_device(d)
        v = next(self.enc)
        return s if v is None else dataclasses.replace(s, extra={NAME: v})


def record(tmp_path: Path) -> Path:
    clock = ManualClock()
    col = EncoderCollector(nvml=FakeNvml(load_capture(), clock=clock), clock=clock, link_refresh_s=0.0)
    header = SessionHeader("2025-01-01T00:00:00Z", "test", "0", col.gpu_infos(), interval_s=0.1)
    path = tmp_path / "enc.jsonl"
    with RecordingWriter(path, header) as w:
        for i in range(len(READINGS)):
            clock.advance(0.1)
            w.write(Sample(1000.0 + i * 0.1, col.read()))
    # the collector's validation: the junk reading was counted once, with the usual words
    assert col.tally.warnings() == [f"NVML: GPU 0 {NAME} out of range (first: 1.5) (1 time; read as unavailable)"]
    col.close()
    return path


def test_a_new_row_flows_from_collector_to_every_output(row, tmp_path):
    path = record(tmp_path)
    # codec: written as the row's key, read back from file with the positional fast path
    lines = [json.loads(x) for x in path.read_text().splitlines()[1:]]
    assert [ln["gpus"][0][NAME] for ln in lines] == KEPT
    assert reader._gpu_reader() is not GpuSample.from_json
    rec = read_recording(path, warn=False)
    assert rec.warnings == []
    assert [s.gpus[0].get(NAME) for s in rec.samples] == KEPT
    assert [s.gpus[0].extra.get(NAME) for s in rec.samples] == KEPT
    assert [s.to_json() for s in rec.samples] == lines  # byte-for-byte the same dicts
    # bulk columns: the reader's validation built the new column with the others
    _h, ticks, _e, _w = read_rows(path)
    flat = [g for d in ticks for g in d["gpus"]]
    cols = validate.cached_columns(flat, ("pcie_rx_Bps", NAME))
    assert cols is not None and cols.shape == (2, len(KEPT))
    assert [None if v != v else float(v) for v in cols[1]] == KEPT
    _h, again, _e, _w = read_rows(path)
    flat = [g for d in again for g in d["gpus"]]
    assert len(flat) > 2
    flat[1:-1] = flat[-2:0:-1]  # the same dicts, the middle reordered: not the columns just built
    assert validate.cached_columns(flat, ("pcie_rx_Bps",)) is None
    analyze_rows(rec.header, ticks)  # the report's analyzer takes recordings with the row
    # TUI: the panel's figures line and the ``?`` page
    info = rec.header.gpus[0]
    assert [r.source for r in figure_sources(rec.header, info) if r.figure == "ENC"] == [ROW.sources[0].what]
    pos = 2  # ticks 0 and 1 shown: ENC reads 50 %
    src = ReplaySource(rec)
    src.seek_to_index(pos)
    src.set_paused(True)
    app = make_app(src)

    async def go():
        async with app.run_test(size=(160, 60)) as pilot:
            await wait_until(pilot, lambda: frame_at(app, pos))
            misc = str(app.query_one("#gpu-0", GpuPanel).misc.render())
            assert misc.startswith("SM ") and " · power " in misc and misc.endswith(" W · ENC 50 %"), misc
            await pilot.press("question_mark")
            await wait_until(pilot, lambda: isinstance(app.screen, SourcesScreen))
            await pilot.pause()
            assert "nvmlDeviceGetEncoderUtilization (test row)" in screen_text(app)

    run(go())
    src.close()
    # Prometheus: one gauge per GPU, no sample while unavailable
    st = ExportState()
    st.start(rec.header, "replay", str(path))
    scraped = []
    for s in rec.samples:
        st.feed(s)
        fams = {f.name: f for f in PrometheusCollector(st).collect()}
        fam = fams.get("pcie_test_encoder_util_ratio")
        scraped.append(fam.samples[0].value if fam is not None else None)
        if fam is not None:
            assert fam.documentation == ROW.prom.help and fam.samples[0].labels == {"gpu": "0"}
    assert scraped == KEPT


def test_a_new_row_out_of_range_in_a_file_reads_as_unavailable_with_the_usual_message(row, tmp_path):
    path = record(tmp_path)
    lines = path.read_text().splitlines()
    bad = json.loads(lines[2])
    bad["gpus"][0].update({NAME: 7.0, "power_W": -5.0})
    lines[2] = json.dumps(bad)
    wrong = json.loads(lines[3])
    wrong["gpus"][0][NAME] = "high"
    lines[3] = json.dumps(wrong)
    path.write_text("\n".join(lines) + "\n")
    rec = read_recording(path, warn=False)
    assert rec.warnings == [
        f"{path} line 3: power_W out of range (first: -5.0) (1 time; read as unavailable)",  # table order
        f"{path} line 3: {NAME} out of range (first: 7.0) (1 time; read as unavailable)",
        f"{path} line 4: {NAME} wrong type (first: 'high') (1 time; read as unavailable)",
    ]
    assert [s.gpus[0].get(NAME) for s in rec.samples] == [0.25, None, None, None, 1.0, 0.75]
    assert rec.samples[1].gpus[0].power_W is None


def test_recordings_with_and_without_the_row_read_both_ways(row, tmp_path):
    path = record(tmp_path)
    metrics.unregister(NAME)
    try:  # a build without the row ignores its key, as any reader ignores keys it does not know
        old = read_recording(path, warn=False)
        assert all(s.gpus[0].extra == {} for s in old.samples) and old.warnings == []
    finally:
        metrics.register(ROW)
    bundled = Path(__file__).parent.parent / "pcie_tui" / "data" / "h200-reference.jsonl.gz"
    rec = read_recording(bundled, warn=False)  # a recording from before the row: the row reads n/a
    assert all(s.gpus[0].get(NAME) is None for s in rec.samples)
    raw = [d for x in gzip.decompress(bundled.read_bytes()).splitlines()[1:] if "gpus" in (d := json.loads(x))]
    for d in raw:  # this build writes the row's key in every tick, null when unavailable
        d["gpus"] = [{**g, NAME: None} for g in d["gpus"]]
    assert [s.to_json() for s in rec.samples] == raw


# ---- the table itself ---------------------------------------------------------------------


def test_the_table_matches_gpu_sample_and_the_formatters():
    names = metrics.names()
    assert tuple(n for n in names if n in TYPED_METRICS) == TYPED_METRICS  # the positional codec's order
    for m in metrics.table():
        assert m.kind in metrics.KINDS and m.lo <= m.hi, m.name
        if m.show is not None and m.show.panel != "title":
            assert m.show.fmt in fmt.FORMATS, m.name
        for s in m.sources:
            assert s.backend in (None, *metrics.BACKENDS), m.name
    assert validate.check_value("mem_busy", 1.04) == (1.0, None)  # jitter is clamped silently
    assert validate.check_value("link_width", 3) == (None, "out of range")
    assert validate.check_value("mem_used_bytes", 2.5) == (None, "wrong type")


def test_register_refuses_bad_rows():
    with pytest.raises(ValueError, match="already in the table"):
        metrics.register(metrics.metric("power_W"))
    with pytest.raises(ValueError, match="kind"):
        metrics.register(dataclasses.replace(ROW, kind="speed"))
    with pytest.raises(ValueError, match="built in"):
        metrics.unregister("power_W")
    assert NAME not in metrics.names()


def test_docs_list_every_row():
    doc = (Path(__file__).parent.parent / "docs" / "recording-format.md").read_text()
    for name in metrics.names():
        assert f"`{name}`" in doc, name
