"""One analysis, one answer: the TUI, report (text and --json) and the exporter say the same of a recording.

Every bundled demo is replayed through the real TUI (Textual pilot, 160x45) to its end: the headline it
shows is the report's, word for word. The view model's and the exporter's findings (bound, shares, median
rates, ceilings) equal ``report --json``'s for every GPU and phase, and feeding a recording tick by tick
or in chunks of any size gives an identical answer.
"""

from __future__ import annotations

import asyncio
import json
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from pcie_tui.analyze.analysis import Analysis
from pcie_tui.export.prometheus import ExportState, PrometheusCollector
from pcie_tui.recording import demos
from pcie_tui.recording.reader import Recording, read_recording
from pcie_tui.recording.replay import ReplaySource
from pcie_tui.report.text import build_report
from pcie_tui.tui.app import make_app
from pcie_tui.tui.headless import wait_until
from pcie_tui.tui.state import ViewModel

DEMOS = list(demos.available())
_reports: dict[str, dict[str, Any]] = {}


def report_json(name: str) -> dict[str, Any]:
    """``report --json`` of a demo, as the CLI prints it (through JSON and back)."""
    if name not in _reports:
        rep, _ = build_report(read_recording(demos.resolve(name)))
        _reports[name] = json.loads(json.dumps(rep, default=str))
    return _reports[name]


def load(name: str) -> Recording:
    return read_recording(demos.resolve(name))


def same_findings(got: dict[str, list[dict[str, Any]]], want: dict[str, list[dict[str, Any]]]) -> None:
    """Per GPU and phase: the same bound, shares within a point, the same rates and ceilings."""
    assert set(got) == set(want)
    for gpu in want:
        g = {f["phase"]: f for f in got[gpu]}
        w = {f["phase"]: f for f in want[gpu]}
        assert list(g) == list(w), gpu
        for phase, wf in w.items():
            gf = g[phase]
            assert gf["bound"] == wf["bound"], (gpu, phase)
            for b, share in wf["shares"].items():
                assert gf["shares"][b] == pytest.approx(share, abs=0.01), (gpu, phase, b)
            for k in ("link_Bps", "sm_util", "dram_util", "duration_s", "transfer_Bps"):
                assert gf[k] == pytest.approx(wf[k], rel=1e-9, abs=1e-12), (gpu, phase, k)
            assert gf["ceilings"] == wf["ceilings"] and gf["stat"] == wf["stat"] == "median"
            assert gf["evidence"] == wf["evidence"]


@pytest.mark.parametrize("name", DEMOS)
def test_view_model_at_the_end_says_what_report_says(name: str) -> None:
    rec = load(name)
    vm = ViewModel(rec.header, events=rec.events)
    for s in rec.samples:
        vm.feed(s)
    frame = vm.frame(ended=True)
    rep = report_json(name)
    assert frame.headline == rep["headline"]["text"]
    ans = vm.answer()
    assert ans.headline.to_json() == rep["headline"]
    same_findings(ans.to_json()["findings"], rep["attribution"]["findings"])


@pytest.mark.parametrize("name", DEMOS)
def test_the_tui_replayed_to_its_end_shows_the_report_headline(name: str) -> None:
    """The real app at 160x45, replaying at 1000x to the last tick: its headline bar is the report's, and
    the findings it renders (per GPU and phase: bound, shares, median rates, ceilings, the lines of
    its answer screen) are report --json's."""
    from pcie_tui.analyze.answer import finding_lines

    rec = load(name)
    src = ReplaySource(rec, speed=1000.0)
    app = make_app(src)
    rep = report_json(name)
    want = rep["headline"]["text"]
    total = len(rec.samples)

    async def go() -> None:
        async with app.run_test(size=(160, 45)) as pilot:
            await wait_until(pilot, lambda: app.frame is not None and app.frame.ticks == total, timeout_s=60)
            await wait_until(pilot, lambda: app._headline_w.text == want, timeout_s=10)
            assert app.frame.headline == want and app.frame.answer_final
            assert app.frame.findings == tuple(finding_lines(rep["attribution"]["findings"]))
            same_findings(app.model.answer().to_json()["findings"], rep["attribution"]["findings"])

    try:
        asyncio.run(go())
    finally:
        src.close()


def gauges(state: ExportState) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    out = {}
    for fam in PrometheusCollector(state).collect():
        for s in fam.samples:
            out[s.name, tuple(sorted(s.labels.items()))] = s.value
    return out


@pytest.mark.parametrize("name", DEMOS)
def test_exporter_gauges_are_the_report_findings(name: str) -> None:
    rec = load(name)
    state = ExportState()
    state.start(rec.header, "replay", name, rec.events)
    for s in rec.samples:
        state.feed(s)
    state.finish()
    got = gauges(state)
    rep = report_json(name)
    for gpu, fs in rep["attribution"]["findings"].items():
        for f in fs:
            lab = (("gpu", gpu), ("phase", f["phase"]))
            assert got["pcie_phase_bound", tuple(sorted((*lab, ("bound", f["bound"]))))] == 1
            for b, share in f["shares"].items():
                key = ("pcie_phase_bound_share_ratio", tuple(sorted((*lab, ("bound", b)))))
                assert got[key] == pytest.approx(share, abs=1e-12)
            rate = got.get(("pcie_phase_link_bytes_per_second", tuple(sorted((*lab, ("stat", "median"))))))
            assert rate == (pytest.approx(f["link_Bps"]) if f["link_Bps"] is not None else None)
    h = rep["headline"]
    if h["phase"] is not None:
        gpu = "" if h["gpu"] is None else str(h["gpu"])
        lab = tuple(sorted({"phase": h["phase"], "bound": h["bound"], "gpu": gpu, "final": "1"}.items()))
        assert got["pcie_headline_info", lab] == 1


def answer_of(rec: Recording, chunks: list[int] | None) -> dict[str, Any]:
    """The answer after feeding ``rec`` tick by tick (None) or in chunks of these sizes (cycled)."""
    a = Analysis(rec.header, rec.events)
    samples = list(rec.samples)
    if chunks is None:
        for s in samples:
            a.feed(s)
    else:
        i = k = 0
        while i < len(samples):
            n = chunks[k % len(chunks)]
            a.feed_all(samples[i : i + n], chunk=n)
            i, k = i + n, k + 1
    a.finish()
    return a.answer().to_json()


_ticked: dict[str, dict[str, Any]] = {}


@settings(max_examples=12, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(name=st.sampled_from(DEMOS), chunks=st.lists(st.integers(1, 400), min_size=1, max_size=4))
def test_ticks_or_chunks_give_the_same_answer(name: str, chunks: list[int]) -> None:
    rec = load(name)
    if name not in _ticked:
        _ticked[name] = answer_of(rec, None)
    assert answer_of(rec, chunks) == _ticked[name]


@pytest.mark.parametrize("name", ["h200-pageable", "h200-llama-partial", "h200-probe"])
def test_the_answer_screen_shows_the_report_findings(name: str) -> None:
    """`a` at the end of a replay: every line of the report's "What held each phase back" is on screen."""
    import re

    from pcie_tui.analyze.answer import finding_lines
    from pcie_tui.tui.headless import screen_text
    from pcie_tui.tui.screens import AnswerScreen

    rec = load(name)
    src = ReplaySource(rec, speed=1000.0)
    app = make_app(src)
    want = finding_lines(report_json(name)["attribution"]["findings"])
    assert want
    total = len(rec.samples)

    def flat(s: str) -> str:
        return re.sub(r"\s+", " ", s).strip()

    async def go() -> None:
        async with app.run_test(size=(200, 60)) as pilot:
            await wait_until(pilot, lambda: app.frame is not None and app.frame.ticks == total, timeout_s=60)
            await wait_until(pilot, lambda: app.frame.answer_final, timeout_s=10)
            await pilot.press("a")
            await wait_until(pilot, lambda: isinstance(app.screen, AnswerScreen))
            assert app.frame.findings == tuple(want)
            text = flat(screen_text(app))
            assert "What held each phase back" in text and "(so far)" not in text
            for line in want:
                assert flat(line)[:60] in text, line
            await pilot.press("a")
            assert not isinstance(app.screen, AnswerScreen)

    try:
        asyncio.run(go())
    finally:
        src.close()


def test_no_bound_is_named_before_a_second_of_the_phase() -> None:
    """Live (issue 22): one tick into the prefill the headline says it is measuring, not a guess; a second in,
    it names the bound; at the end it is the report's."""
    rec = load("h200-pinned")
    vm = ViewModel(rec.header, events=rec.events)
    first = next(i for i, s in enumerate(rec.samples) if s.engine is not None and s.engine.phase == "prefill")
    for s in rec.samples[: first + 2]:
        vm.feed(s)
    early = vm.frame().headline or ""
    assert early.startswith("prefill · measuring (") and "named after 1 s of the phase" in early
    assert vm.answer().headline.bound == "unknown" and vm.answer().headline.fix is None
    t_first = rec.samples[first].t
    rest = [s for s in rec.samples[first + 2 :] if s.t - t_first < 3.0]
    for s in rest:
        vm.feed(s)
    later = vm.frame().headline or ""
    assert later.startswith("prefill so far (") and "measuring" not in later


@pytest.mark.parametrize("name", ["h200-pinned", "h200-prompt-cache", "h200-reference"])
def test_the_headline_and_the_gpu_panel_never_disagree_on_the_phase(name: str) -> None:
    """Every tick of a replay (issue 22): the headline starts with the phase the GPU panel shows."""
    rec = load(name)
    vm = ViewModel(rec.header, events=rec.events)
    checked = 0
    for s in rec.samples:
        vm.feed(s)
        text = vm.frame().headline
        if text and vm.phase:
            assert text.startswith(f"{vm.phase} "), (vm.phase, text[:80])
            checked += 1
    assert checked > len(rec.samples) // 2
