"""The one ceiling on a real H100 (tests/fixtures/h100-runs/smoke-20261206*: `pcie-tui record --no-engine`
through the real CLI while bench/traffic.py drove pinned host->GPU copies at 55.3 GB/s payload, then a
device copy; the log beside it is the device run's own output). The counter read 59.5 GB/s, above
the uncalibrated default (0.90 x 63.0 = 56.7 GB/s): the highest reading becomes the ceiling, so no
share on any surface exceeds 100 %, and report, the TUI and the exporter say so with the same numbers."""

from __future__ import annotations

from pathlib import Path

import pytest

from pcie_tui.core.model import pcie_capacity_Bps
from pcie_tui.export.prometheus import ExportState, PrometheusCollector
from pcie_tui.recording.reader import read_recording
from pcie_tui.report.text import build_report
from pcie_tui.tui.state import ViewModel

RUN = Path(__file__).parent / "fixtures" / "h100-runs" / "smoke-20261206.jsonl.gz"


def test_the_h100_link_reads_at_most_100_percent_of_its_observed_ceiling():
    rep, _ = build_report(read_recording(RUN))
    g = rep["gpus"][0]
    theo = pcie_capacity_Bps(5, 16)
    assert g["ceiling"]["source"] == "observed" and 0.90 * theo < g["ceiling"]["Bps"] <= theo
    assert g["link_util"]["peak"] <= 1.0 and g["link_Bps"]["peak"] == pytest.approx(g["ceiling"]["Bps"])
    assert 0.2 < g["time_in_verdict_s"]["link"] / rep["duration_s"] < 0.35  # the 5 s of pinned copies
    for e in g["events"]:
        assert e["peak_util"] <= 1.0 and e["mean_util"] <= 1.0
    h = rep["headline"]
    assert h["phase"] == "unlabelled" and h["bound"] == "link" and "link-saturated 26%" in h["text"]


def test_the_tui_and_the_exporter_take_the_same_ceiling_from_the_same_h100_ticks():
    rec = read_recording(RUN)
    rep, _ = build_report(read_recording(RUN))
    vm = ViewModel(rec.header, events=rec.events)
    ex = ExportState()
    ex.start(rec.header, "replay", RUN.name, rec.events)
    for s in rec.samples:
        vm.feed(s)
        ex.feed(s)
    frame = vm.frame(ended=True)
    ex.finish()
    assert frame.headline == rep["headline"]["text"]
    gpu = frame.gpus[0]
    assert (gpu.ceiling_kind, gpu.ceiling_Bps) == ("observed", pytest.approx(rep["gpus"][0]["ceiling"]["Bps"]))
    samples = {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for fam in PrometheusCollector(ex).collect()
        for s in fam.samples
    }
    ceiling = samples["pcie_link_ceiling_bytes_per_second", (("basis", "observed"), ("bus", "pcie"), ("gpu", "0"))]
    assert ceiling == pytest.approx(rep["gpus"][0]["ceiling"]["Bps"])
    assert all(v <= 1.0 for (name, _), v in samples.items() if name == "pcie_link_util_ratio")
