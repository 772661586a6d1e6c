"""The examples README.md, docs/tui.md and docs/plots.md quote are what the code prints on the bundled
sessions, and the ``?`` page says what the calibrated ceiling is (documentation drift guards)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from pcie_tui.recording import demos
from pcie_tui.recording.reader import read_recording
from pcie_tui.tui.headline import headline_text
from pcie_tui.tui.sources import figure_sources
from pcie_tui.tui.state import ViewModel

ROOT = Path(__file__).resolve().parent.parent
GPU_ONLY = Path(__file__).parent / "fixtures" / "h200-runs" / "smoke-gpu-only.jsonl.gz"


def _flat(text: str) -> str:
    """Markdown wraps lines: compare with runs of whitespace as one space."""
    return re.sub(r"\s+", " ", text)


def _headline_at(path: Path, tick: int) -> str | None:
    rec = read_recording(path)
    vm = ViewModel(rec.header)
    vm.rebuild(list(rec.samples), tick)
    return headline_text(vm)


# (recording, tick, the docs that quote its headline there); ticks are 0.1 s apart in these sessions.
CASES = [
    (demos.resolve("h200-pinned"), 100, ("README.md", "docs/tui.md")),  # "10 s in"
    (demos.resolve("h200-pageable"), 120, ("docs/tui.md",)),  # "12 s in"
    (demos.resolve("h200-reference"), 20, ("docs/tui.md",)),  # "2 s in": idle before any phase of work
    (GPU_ONLY, 100, ("README.md", "docs/tui.md")),  # GPU only: the saturation line
]


@pytest.mark.parametrize(("path", "tick", "docs"), CASES, ids=lambda v: getattr(v, "name", None))
def test_quoted_headlines_are_what_the_tui_shows(path, tick, docs):
    text = _headline_at(path, tick)
    assert text
    for doc in docs:
        body = _flat((ROOT / doc).read_text())
        for line in text.split("\n"):
            assert _flat(line) in body, (doc, line)


def test_old_saturation_form_only_without_a_phase_of_work():
    pinned = _headline_at(demos.resolve("h200-pinned"), 100) or ""
    assert pinned.startswith("prefill so far (") and "LINK SATURATED" not in pinned
    assert (_headline_at(GPU_ONLY, 100) or "").startswith("GPU0 LINK SATURATED: PCIe RX")


def test_readme_report_example_is_the_report_headline():
    from pcie_tui.report.text import build_report

    rep = build_report(read_recording(demos.resolve("h200-pageable")))[0]
    assert _flat(rep["headline"]["text"]) in _flat((ROOT / "README.md").read_text())


def test_sources_page_says_the_calibrated_ceiling_is_the_counter_reading():
    rec = read_recording(demos.resolve("h200-pinned"))  # calibrated: measured_Bps in the header
    rows = {r.figure: r for r in figure_sources(rec.header, rec.header.gpus[0])}
    share = rows["% of link"].source
    assert "60.2 GB/s" in share and "PCIe counter" in share and "protocol overhead" in share
    assert "payload per direction" not in share
    head = rows["headline"]
    assert "since the phase began" not in head.window and "so far" in head.window
    theo = read_recording(demos.resolve("h200-reference"))
    rows = {r.figure: r for r in figure_sources(theo.header, theo.header.gpus[0])}
    assert "theoretical: Gen5 x16" in rows["% of link"].source


def test_plots_doc_names_the_strip_the_plot_draws():
    from pcie_tui.plot import figure as plot
    from pcie_tui.plot import strip as plotstrip

    assert plot.STRIP is plotstrip.attribution_strip
    doc = _flat((ROOT / "docs" / "plots.md").read_text())
    assert "`STRIP = attribution_strip`" in doc and "pcie_tui/plot/strip.py" in doc
