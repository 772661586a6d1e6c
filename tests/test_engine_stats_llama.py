"""Engine token timing for llama-server: per-request log timings and /slots token counts.

Pinned on the sessions recorded on the project's H200 (pcie_tui/data/h200-llama-*.jsonl.gz):
each request's prompt_ms / predicted_ms as llama-server printed them, so the expected
quantiles are computed here from those printed figures, not from the code under test.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from pcie_tui.analyze.engine import (
    QUANTILE_METHOD,
    SNAPSHOT_KEYS,
    EngineStats,
)
from pcie_tui.analyze.engine_session import engine_report
from pcie_tui.analyze.session import quantile
from pcie_tui.core.model import EngineSample, Sample
from pcie_tui.engines.llamacpp.timing import request_latencies, slot_tokens_total
from pcie_tui.engines.registry import get as engine_kind
from pcie_tui.engines.stats import unique_requests
from pcie_tui.recording.reader import read_recording

DATA = Path(__file__).resolve().parents[1] / "pcie_tui" / "data"
QUANTILE_METHOD_LLAMA = engine_kind("llamacpp").quantile_method


def _samples(name: str) -> list[Sample]:
    return list(read_recording(DATA / f"h200-llama-{name}.jsonl.gz").samples)


def _q3(vals):
    v = sorted(vals)
    return {k: quantile(v, q) for k, q in (("p50", 0.5), ("p95", 0.95), ("p99", 0.99))}


def _approx(d):
    return {k: pytest.approx(v, rel=1e-9) for k, v in d.items()}


# ---- whole session (report --json) ------------------------------------------


def test_partial_session_report_has_per_request_latencies():
    rep = engine_report(_samples("partial"))
    assert rep is not None and rep["kind"] == "llamacpp"
    assert rep["requests"] == 6  # one 8000-token prefill + five 32-token prompts generating 16 tokens
    prompt_ms = [5089.63, 77.08, 71.97, 81.72, 65.92, 68.38]
    predicted_ms = [887.72, 944.93, 804.02, 710.85, 737.78]  # 16 tokens each
    assert rep["prefill_s"] == _approx(_q3([x / 1e3 for x in prompt_ms]))
    assert rep["prefill_s"]["p50"] == pytest.approx(0.074525)
    assert rep["ttft_s"] == rep["prefill_s"]  # server side: TTFT is the prompt eval time
    assert rep["decode_s"] == _approx(_q3([x / 1e3 for x in predicted_ms]))
    # 16 tokens: 15 gaps after the first token (which ends the prompt eval time).
    assert rep["itl_s"] == _approx(_q3([x / 15 / 1e3 for x in predicted_ms]))
    assert 0.047 < rep["itl_s"]["p50"] < 0.064
    assert rep["queue_s"] is None  # these requests' log showed no arrival: their queue is not known
    assert rep["quantile_method"] == QUANTILE_METHOD_LLAMA
    assert "6 requests" in rep["basis"] and "lower bound" in rep["basis"]
    pr = rep["per_request"]
    assert pr["n"] == 6
    # Per-request TTFT is the same server-side prompt eval time (it was null beside a filled ttft_s).
    assert pr["ttft_s"] == rep["ttft_s"] and pr["ttft_s"]["p50"] == pytest.approx(0.074525)
    assert pr["prompt_tokens_per_s"]["p99"] == pytest.approx(
        _q3([32e3 / x for x in prompt_ms[1:]] + [8000e3 / 5089.63])["p99"]
    )


def test_full_session_counts_each_logged_request_once():
    """That recording repeats a scrape in several ticks; each request counts once."""
    rep = engine_report(_samples("full"))
    assert rep["requests"] == 5
    assert rep["prefill_s"] == _approx(_q3([0.64208, 0.34698, 0.33625, 0.02002, 0.0055]))
    assert rep["itl_s"] == _approx(_q3([688.64 / 255 / 1e3, 681.63 / 255 / 1e3]))
    # Older recordings carry only prompt_n/prompt_ms: per-request rates still come out.
    assert rep["per_request"]["generation_tokens_per_s"]["p50"] == pytest.approx((256 / 0.68864 + 256 / 0.68163) / 2)


def test_ngl4_session_slow_prefill():
    rep = engine_report(_samples("ngl4"))
    assert rep["requests"] == 2
    assert rep["prefill_s"]["p99"] == pytest.approx(quantile([0.51355, 17.36995], 0.99))
    assert rep["itl_s"] == _approx({"p50": 1.36744 / 15, "p95": 1.36744 / 15, "p99": 1.36744 / 15})


# ---- live window --------------------------------------------------------------


def _replay(samples, window_s, stop):
    st = EngineStats(window_s)
    t0 = samples[0].t
    for s in samples:
        st.feed(s)
        if stop(s, s.t - t0):
            return st.snapshot(), s
    raise AssertionError("condition never met")


def test_snapshot_shows_the_8000_token_prompt_when_it_ends():
    samples = _samples("partial")

    def ended(s, _):
        return s.engine is not None and any(r.get("prompt_n") == 8000 for r in s.engine.extra.get("requests", []))

    snap, _ = _replay(samples, 10.0, ended)
    assert tuple(snap) == SNAPSHOT_KEYS
    assert snap["ttft_s"] == _approx({"p50": 5.08963, "p95": 5.08963, "p99": 5.08963})  # prompt eval 5089.63 ms
    assert snap["prefill_s"] == snap["ttft_s"]
    assert snap["itl_s"] is None and snap["decode_s"] is None  # 1 token: no gap, no decode
    assert snap["queue_s"] is None and snap["requests_timed"] == 1
    assert snap["quantile_method"] == QUANTILE_METHOD_LLAMA


def test_snapshot_rates_from_slots_while_decoding_and_prefilling():
    samples = _samples("partial")
    # Mid-decode of a 16-token request: the generation counter has not moved for > 1 s.
    snap, s = _replay(samples, 1.0, lambda s, _: s.engine is not None and s.engine.phase == "decode"
                      and s.engine.extra["slots"][0].get("n_decoded") == 15)  # fmt: skip
    assert "generation: /slots n_decoded" in snap["rate_source"]
    # The requests' own mean gap is 47-63 ms: 16-21 tokens/s; the scrape sees 1-2 tokens a tick.
    assert 12.0 < snap["generation_tokens_per_s"] < 22.0
    # Mid-prefill of the 8000-token prompt (server: 8000 tokens in 5.09 s = 1572 tokens/s).
    snap, _ = _replay(samples, 2.0, lambda s, t: t > 8.5 and s.engine is not None and s.engine.phase == "prefill")
    assert "prompt: /slots n_prompt_processed" in snap["rate_source"]
    assert snap["prompt_tokens_per_s"] == pytest.approx(8000 / 5.08963, rel=0.15)
    assert snap["generation_tokens_per_s"] == 0.0


def test_no_log_read_claims_no_log_timings():
    """llama-server attached with no log file found (header ``log_paths`` []): the TUI's quantile
    line says so instead of "from llama-server's log timings", and a session with no timed request
    reports no quantile method. An older header without the key keeps the engine's own words."""
    from pcie_tui.core.model import SessionHeader
    from pcie_tui.tui.state import ViewModel

    samples = [
        Sample(t=float(i), gpus=(), engine=EngineSample(kind="llamacpp", up=True, prompt_tokens_total=5.0 * i))
        for i in range(3)
    ]

    def method(engine: dict) -> str | None:
        vm = ViewModel(SessionHeader(created="x", host="h", tool_version="0", gpus=(), engine=engine, interval_s=1.0))
        for s in samples:
            vm.feed(s)
        return vm.frame().engine_stats["quantile_method"]

    assert method({"kind": "llamacpp", "log_paths": []}).startswith("none: no llama-server log was found")
    assert method({"kind": "llamacpp", "log_paths": ["/tmp/server.log"]}) == QUANTILE_METHOD_LLAMA
    assert method({"kind": "llamacpp"}) == QUANTILE_METHOD_LLAMA
    # A restarted engine the poller reattached to, whose log was found this time: its facts win.
    from pcie_tui.engines import engine_info

    ev = {"event": "engine_reattach", "engine": {"kind": "llamacpp", "log_paths": ["/tmp/new.log"]}}
    assert engine_info({"kind": "llamacpp", "log_paths": []}, [ev])["log_paths"] == ["/tmp/new.log"]
    rep = engine_report(samples)
    assert rep["quantile_method"] is None and "no per-request timings" in rep["basis"]


def test_vllm_kind_keeps_histogram_method_and_counters():
    st = EngineStats(10.0)
    for i in range(3):
        st.feed(
            Sample(t=float(i), gpus=(), engine=EngineSample(kind="vllm", up=True, generation_tokens_total=10.0 * i))
        )
    snap = st.snapshot()
    assert snap["quantile_method"] == QUANTILE_METHOD
    assert snap["generation_tokens_per_s"] == pytest.approx(10.0)
    assert snap["rate_source"] == "generation: counter" and snap["requests_timed"] is None


# ---- units -------------------------------------------------------------------


def _tick(t, slots, up=True):
    return (float(t), EngineSample(kind="llamacpp", up=up, extra={"slots": slots} if slots is not None else {}))


def test_slot_counts_add_increases_and_new_requests():
    ticks = [
        _tick(0, [{"id": 0, "processing": True, "n_decoded": 0}]),
        _tick(1, [{"id": 0, "processing": True, "n_decoded": 5}]),  # +5
        _tick(2, [{"id": 0, "processing": True, "n_decoded": 12}]),  # +7
        _tick(3, None),  # busy scrape: no /slots, nothing known
        _tick(4, [{"id": 0, "processing": True, "n_decoded": 3}]),  # dropped: a new request, +3
        _tick(5, [{"id": 0, "processing": True, "n_decoded": 8}], up=False),  # down: ignored
        _tick(6, [{"id": 0, "processing": True, "n_decoded": 9}]),  # +6
    ]
    assert slot_tokens_total(ticks, "n_decoded") == (21.0, 6.0)


def test_slot_counts_new_task_and_idle_slot_and_two_slots():
    ticks = [
        _tick(0, [{"id": 0, "processing": True, "task": 7, "n_decoded": 10}, {"id": 1, "processing": False}]),
        _tick(
            1,
            [{"id": 0, "processing": True, "task": 9, "n_decoded": 14}, {"id": 1, "processing": True, "n_decoded": 4}],
        ),  # fmt: skip
        _tick(2, [{"id": 0, "processing": False}, {"id": 1, "processing": True, "n_decoded": 6}]),
        _tick(3, [{"id": 0, "processing": True, "n_decoded": 2}, {"id": 1, "processing": True, "n_decoded": 6}]),
    ]
    # slot 0: new task +14, idle (back to 0), then +2; slot 1: idle -> 4 (+4), +2, +0
    assert slot_tokens_total(ticks, "n_decoded") == (22.0, 3.0)


def test_slot_counts_need_two_ticks():
    assert slot_tokens_total([_tick(0, [{"id": 0, "processing": True, "n_decoded": 4}])], "n_decoded") is None
    assert slot_tokens_total([_tick(0, None), _tick(1, None)], "n_decoded") is None


def test_request_latencies_and_duplicates():
    r = {"t": 1.0, "seq": 1, "prompt_n": 10, "prompt_ms": 20.0, "predicted_n": 11, "predicted_ms": 50.0}
    e = EngineSample(kind="llamacpp", up=True, extra={"requests": [r]})
    reqs = unique_requests([e, e, None])
    assert reqs == [r]
    lat = request_latencies(reqs + [{"prompt_n": 0, "prompt_ms": 0.0, "predicted_n": 1, "predicted_ms": 0.0}])
    assert lat["itl_s"] == {"p50": 0.005, "p95": 0.005, "p99": 0.005}
    assert lat["prefill_s"] == {"p50": 0.02, "p95": 0.02, "p99": 0.02}  # a fully cached prompt has no prefill
    assert request_latencies([]) == {
        "ttft_s": None,
        "itl_s": None,
        "prefill_s": None,
        "decode_s": None,
        "queue_s": None,
        "setup_s": None,
    }


def test_report_text_shows_llama_latencies_with_units_and_basis():
    from rich.console import Console

    from pcie_tui.report.text import _render_engine

    con = Console(record=True, width=400)
    _render_engine(engine_report(_samples("ngl4")), con)
    text = con.export_text()
    assert "prefill (prompt eval) 8.9 / 16.5 / 17.2 s (p50/p95/p99)" in text  # 513.55 and 17369.95 ms
    assert "inter-token latency   91.2 / 91.2 / 91.2 ms (p50/p95/p99)" in text  # 1367.44 ms / 15 gaps
    assert "queue                 n/a" in text
    assert "per request (2): prompt" in text and "generation 11.7 / 11.7 / 11.7 tok/s" in text  # 16 / 1.36744 s
    assert "latency basis: 2 requests timed by llama-server's log" in text
    assert "histogram" not in text


def test_short_requests_between_slot_polls_take_the_counter_rate():
    """Requests of ~80 ms, one per 0.5 s poll: /slots catches one in four mid-prompt, the counter
    counts them all. The live rate is the larger of the two lower bounds (a user saw 0.0 tok/s
    while the counter climbed)."""
    st = EngineStats(10.0)
    for i in range(21):
        busy = i % 4 == 0
        slot = {"id": 0, "task": i, "processing": busy, **({"n_prompt_processed": 500} if busy else {})}
        e = EngineSample(kind="llamacpp", up=True, prompt_tokens_total=500.0 * i, extra={"slots": [slot]})
        st.feed(Sample(t=0.5 * i, gpus=(), engine=e))
    snap = st.snapshot()
    assert snap["prompt_tokens_per_s"] == pytest.approx(1000.0) and "prompt: counter" in snap["rate_source"]
    # A long prefill: the counter stands still, /slots moves: the slots' rate is shown.
    st = EngineStats(10.0)
    for i in range(11):
        slot = {"id": 0, "task": 1, "processing": True, "n_prompt_processed": 300 * i}
        st.feed(
            Sample(
                t=0.5 * i,
                gpus=(),
                engine=EngineSample(kind="llamacpp", up=True, prompt_tokens_total=0.0, extra={"slots": [slot]}),
            )
        )
    snap = st.snapshot()
    assert snap["prompt_tokens_per_s"] == pytest.approx(600.0) and "/slots n_prompt_processed" in snap["rate_source"]
