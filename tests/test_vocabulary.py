"""One vocabulary: every surface says what held a GPU back with the words of pcie_tui.core.vocab, and no
surface, doc or README says "link" + "-bound" (a link at its ceiling is "link-saturated")."""

from __future__ import annotations

import ast
import io
import re
from pathlib import Path

import pytest
from rich.console import Console

from pcie_tui.analyze import attribution, verdict
from pcie_tui.core import vocab
from pcie_tui.export import prometheus as export
from pcie_tui.recording import demos
from pcie_tui.recording.reader import read_recording
from pcie_tui.report.text import build_report, render_text
from pcie_tui.tui import headline

REPO = Path(__file__).parent.parent
RETIRED = "link" + "-bound"  # spelled apart so this file passes its own scan
WORDS = {*vocab.BOUND_WORDS.values(), *vocab.BOUND_SHORT.values(), *vocab.VERDICT_WORDS.values()}
# A bound or saturation word as a surface prints it: "memory-bound", "link-saturated", "host-bound".
BOUND_WORD = re.compile(r"\b(?:link|transfer|host|memory|compute)-(?:bound|saturated)\b")


def test_the_table():
    assert vocab.BOUNDS == ("link", "transfer", "host", "memory", "compute", "idle", "unknown")
    assert vocab.BOUNDS == vocab.TICK_BOUNDS  # the per-tick codes: "unknown" where a needed counter was not reported
    assert set(vocab.BOUND_WORDS) == set(vocab.BOUND_SHORT) == set(vocab.BOUNDS)
    assert vocab.BOUND_WORDS["link"] == vocab.VERDICT_WORDS["link"] == "link-saturated"
    assert vocab.BOUND_WORDS["transfer"] == "transfer-bound below link capacity"
    assert vocab.VERDICTS == ("link", "memory", "compute", "none") and set(vocab.VERDICT_WORDS) == set(vocab.VERDICTS)


def test_every_module_takes_its_names_from_the_table():
    assert attribution.BOUNDS is vocab.TICK_BOUNDS and attribution.BOUND_WORDS is vocab.BOUND_WORDS
    assert attribution.BOUND_SHORT is vocab.BOUND_SHORT
    assert export.BOUND_NAMES is vocab.TICK_BOUNDS and export.VERDICT_NAMES is vocab.VERDICTS
    assert headline.VERDICT_WORDS is vocab.VERDICT_WORDS and verdict.VERDICTS is vocab.VERDICTS


def test_no_module_spells_a_bound_word_table_of_its_own():
    """Outside vocab.py no string literal of pcie_tui/ is a bound word on its own (a table entry)."""
    own = {w for w in WORDS if w not in ("idle", "unknown")}
    found = []
    for p in sorted((REPO / "pcie_tui").rglob("*.py")):
        if p.name == "vocab.py":
            continue
        for node in ast.walk(ast.parse(p.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Constant) and node.value in own:
                found.append(f"{p.relative_to(REPO)}:{node.lineno} {node.value!r}")
    assert not found, found


def test_the_retired_word_is_nowhere():
    files = [*(REPO / "pcie_tui").rglob("*.py"), *(REPO / "docs").rglob("*.md"), REPO / "README.md"]
    files += [*(REPO / "docs").rglob("*.json")]
    hits = [str(p.relative_to(REPO)) for p in files if RETIRED in p.read_text(encoding="utf-8").lower()]
    assert len(files) > 60 and not hits, hits


@pytest.fixture(scope="module")
def reports():
    out = {}
    for name, path in sorted(demos.available().items()):
        rec = read_recording(path, warn=False)
        report, _ = build_report(rec)
        console = Console(width=160, file=io.StringIO(), force_terminal=True, color_system=None)
        render_text(report, rec, console)
        out[name] = (report, console.file.getvalue())  # type: ignore[attr-defined]
    return out


def test_report_text_and_json_use_only_the_table(reports):
    assert len(reports) >= 7
    for name, (report, text) in reports.items():
        used = set(BOUND_WORD.findall(text))
        assert used <= WORDS, (name, used - WORDS)
        assert RETIRED not in text.lower(), name
        assert report["headline"]["bound"] in (None, *vocab.BOUNDS), name
        for fs in report["attribution"]["findings"].values():
            for f in fs:
                assert f["bound"] in vocab.TICK_BOUNDS and set(f["shares"]) == set(vocab.TICK_BOUNDS), name
        for g in report["gpus"]:
            assert set(g["time_in_verdict_s"]) <= set(vocab.VERDICTS), name


def test_tui_headline_words_come_from_the_table(reports):
    """At the end of a replay the TUI shows the report's headline word for word (test_tui_report_export_say_the_same);
    its own live saturation line names other GPUs with vocab.VERDICT_WORDS."""
    for name, (report, _) in reports.items():
        used = set(BOUND_WORD.findall(report["headline"]["text"]))
        assert used <= WORDS, (name, used - WORDS)
    src = (REPO / "pcie_tui" / "tui" / "headline.py").read_text(encoding="utf-8")
    assert not BOUND_WORD.search(src) and RETIRED not in src


@pytest.mark.parametrize("name", sorted(demos.available()))
def test_export_label_values_use_only_the_table(name):
    from pcie_tui.export.prometheus import ExportState, PrometheusCollector

    rec = read_recording(demos.resolve(name), warn=False)
    st = ExportState()
    st.start(rec.header, "replay", name)
    values: dict[str, set[str]] = {"bound": set(), "verdict": set()}
    samples = list(rec.samples)
    for i, s in enumerate(samples):
        st.feed(s)
        if i % 97 == 0 or i == len(samples) - 1:
            for fam in PrometheusCollector(st).collect():
                for x in fam.samples:
                    for k in values:
                        if k in x.labels:
                            values[k].add(x.labels[k])
    assert values["bound"] and values["bound"] <= set(vocab.BOUNDS), values
    assert values["verdict"] and values["verdict"] <= set(vocab.VERDICTS), values
