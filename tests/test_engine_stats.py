"""Engine statistics: histogram quantiles, counter resets, the sliding-window snapshot, the report."""

from __future__ import annotations

import dataclasses
import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pcie_tui.analyze.engine import (
    QUANTILE_METHOD,
    SNAPSHOT_KEYS,
    EngineStats,
    counter_increase,
    counter_total,
    hist_delta,
    hist_quantile,
    hist_window,
)
from pcie_tui.analyze.engine_requests import per_request_summary
from pcie_tui.analyze.engine_session import engine_report
from pcie_tui.core.model import EngineSample, Sample


def make_hist(values: list[float], bounds: list[float]) -> dict:
    return {
        "le": bounds,
        "cum": [sum(1 for v in values if v <= b) for b in bounds],
        "count": len(values),
        "sum": sum(values),
    }


def test_quantile_worked_example():
    # 10 obs <= 0.1, 20 in (0.1, 0.2], 10 in (0.2, 0.5], 10 above 0.5 (the +Inf bucket)
    le, cum = [0.1, 0.2, 0.5], [10, 30, 40]
    assert hist_quantile(0.5, le, cum, 40) == pytest.approx(0.1 + 0.1 * (20 - 10) / 20)
    assert hist_quantile(0.99, le, cum, 40) == pytest.approx(0.2 + 0.3 * (39.6 - 30) / 10)
    assert hist_quantile(0.1, le, cum, 40) == pytest.approx(0.04)  # first bucket starts at 0
    assert hist_quantile(0.99, le, cum, 50) == 0.5  # in +Inf: highest finite bound, as Prometheus
    assert hist_quantile(0.5, le, [0, 0, 0], 0) is None


def test_quantile_skips_empty_buckets():
    # Nothing in (0.1, 0.2]: p50 must interpolate inside (0.2, 0.5], not return 0.2 from the empty bucket.
    assert hist_quantile(0.5, [0.1, 0.2, 0.5], [1, 1, 4], 4) == pytest.approx(0.2 + 0.3 * (2 - 1) / 3)


bounds_st = st.lists(st.floats(0.001, 50.0), min_size=1, max_size=20, unique=True).map(sorted)
values_st = st.lists(st.floats(0.0, 60.0, allow_nan=False), min_size=1, max_size=300)


@settings(max_examples=200, deadline=None)
@given(values=values_st, bounds=bounds_st, q=st.sampled_from([0.5, 0.9, 0.95, 0.99]))
def test_quantile_lies_in_the_bucket_of_the_true_order_statistic(values, bounds, q):
    h = make_hist(values, bounds)
    est = hist_quantile(q, h["le"], h["cum"], h["count"])
    k = max(1, math.ceil(q * len(values)))  # rank of the true quantile (1-based)
    true = sorted(values)[k - 1]
    if true > bounds[-1]:
        assert est == bounds[-1]
        return
    i = next(j for j, b in enumerate(bounds) if true <= b)
    lo = bounds[i - 1] if i else 0.0
    assert lo - 1e-9 <= est <= bounds[i] + 1e-9


@settings(max_examples=100, deadline=None)
@given(values=values_st, bounds=bounds_st)
def test_quantile_is_monotonic_in_q(values, bounds):
    h = make_hist(values, bounds)
    qs = [hist_quantile(q, h["le"], h["cum"], h["count"]) for q in (0.1, 0.5, 0.9, 0.95, 0.99)]
    assert all(a <= b + 1e-12 for a, b in zip(qs, qs[1:], strict=False))


def test_quantile_exact_for_uniform_data():
    values = [i / 1000 for i in range(1, 1001)]  # uniform on (0, 1]
    h = make_hist(values, [0.25, 0.5, 0.75, 1.0])
    for q in (0.5, 0.95, 0.99):
        assert hist_quantile(q, h["le"], h["cum"], h["count"]) == pytest.approx(q, abs=1e-3)


def test_counter_reset_is_a_restart_from_zero():
    assert counter_increase(100, 150) == 50
    assert counter_increase(150, 20) == 20  # restarted, counted 20 since
    assert counter_total([100, 150, None, 20, 50]) == 50 + 20 + 30
    assert counter_total([None, None]) is None


def test_hist_delta_and_reset():
    b = [0.1, 1.0]
    old = {"le": b, "cum": [5, 9], "count": 10, "sum": 4.0}
    new = {"le": b, "cum": [7, 14], "count": 16, "sum": 6.5}
    d = hist_delta(old, new)
    assert d == {"le": b, "cum": [2, 5], "count": 6, "sum": 2.5}
    restarted = {"le": b, "cum": [1, 2], "count": 2, "sum": 0.3}
    assert hist_delta(new, restarted) == restarted
    assert hist_delta(None, new) is None


def _eng(prompt, gen, up=True, hist=None, running=0.0, phase=None, kv=None):
    extra = {}
    if hist is not None:
        extra["hist"] = {"ttft_s": hist}
    if kv is not None:
        extra["kv_cache_util"] = kv
    return EngineSample(
        kind="vllm",
        up=up,
        phase=phase,
        prompt_tokens_total=prompt if up else None,
        generation_tokens_total=gen if up else None,
        requests_running=running if up else None,
        requests_waiting=0.0 if up else None,
        error=None if up else "connection refused",
        extra=extra if up else {},
    )


def test_window_rates_across_a_restart():
    st_ = EngineStats(window_s=10.0)
    # 40 prompt tokens/s and 20 generated tokens/s; the engine restarts at t=12 (counters from 0).
    p = g = 0.0
    for i in range(41):
        t = i * 0.5
        if t == 12.0:
            p, g = 20.0, 10.0  # what the new process counted in its first 0.5 s
        elif i:
            p, g = p + 20.0, g + 10.0
        st_.feed(Sample(t=t, gpus=(), engine=_eng(p, g)))
    snap = st_.snapshot()
    assert snap["prompt_tokens_per_s"] == pytest.approx(40.0)
    assert snap["generation_tokens_per_s"] == pytest.approx(20.0)


def test_window_rates_use_the_time_the_counters_were_read():
    # A steady 100 generated tokens/s, ticks every 0.5 s. Over tick times a 1.5-s-old last reading
    # would read 85 tokens/s over a 10-s window.
    def rate(ages: list[float], counted_at: list[float] | None = None) -> float:
        stats = EngineStats(window_s=10.0)
        for i, age in enumerate(ages):
            t = i * 0.5
            read = counted_at[i] if counted_at else t - age
            e = dataclasses.replace(_eng(0.0, 100.0 * read), extra={"read_age_s": age})
            stats.feed(Sample(t=t, gpus=(), engine=e))
        return stats.snapshot()["generation_tokens_per_s"]

    assert rate([0.0] * 41) == pytest.approx(100.0)
    # The scrapes after t=18.5 answered late: the last three ticks hold that reading, 0.5-1.5 s old.
    assert rate([0.0] * 38 + [0.5, 1.0, 1.5]) == pytest.approx(100.0)
    # Every tick holding one reading (the first second after attaching): no rate yet, not 0.
    stats = EngineStats(window_s=10.0)
    for i, age in enumerate((0.0, 0.499, 0.999)):  # ms rounding: read at 100.000, 100.001, 100.001
        e = dataclasses.replace(_eng(0.0, 500.0), extra={"read_age_s": age})
        stats.feed(Sample(t=100.0 + 0.5 * i, gpus=(), engine=e))
    assert stats.snapshot()["generation_tokens_per_s"] is None
    # An invalid age (NaN, negative, not a number) counts as none rather than moving time.
    for bad in (float("nan"), -1.0, "1.5"):
        assert rate([0.0] * 40 + [bad], counted_at=[i * 0.5 for i in range(41)]) == pytest.approx(100.0)


def test_snapshot_keys_and_latency_window():
    b = [0.05, 0.1, 0.5, 1.0]
    st_ = EngineStats(window_s=10.0)
    # Before the window: 100 slow requests (0.5..1 s). In the window: 10 fast ones (<= 0.05 s).
    old = {"le": b, "cum": [0, 0, 0, 100], "count": 100, "sum": 75.0}
    st_.feed(Sample(t=0.0, gpus=(), engine=_eng(0, 0, hist=old)))
    st_.feed(Sample(t=20.0, gpus=(), engine=_eng(0, 0, hist=old)))
    new = {"le": b, "cum": [10, 10, 10, 110], "count": 110, "sum": 75.3}
    st_.feed(Sample(t=25.0, gpus=(), engine=_eng(100, 50, hist=new, running=3.0, kv=0.25, phase="mixed")))
    snap = st_.snapshot()
    assert tuple(snap) == SNAPSHOT_KEYS
    assert snap["ttft_s"]["p50"] == pytest.approx(0.025)  # only the window's 10 fast requests
    assert snap["ttft_s"]["p99"] == pytest.approx(0.0495)
    assert snap["itl_s"] is None and snap["queue_s"] is None  # not exposed -> None, never 0
    assert snap["requests_running"] == 3.0 and snap["kv_cache_util"] == 0.25 and snap["phase"] == "mixed"
    assert snap["quantile_method"] == QUANTILE_METHOD
    assert snap["span_s"] == 10.0  # the base tick at 20 s reaches back past the window's start
    # Engine goes down: figures it cannot give become None, the reason is kept.
    st_.feed(Sample(t=26.0, gpus=(), engine=_eng(None, None, up=False)))
    snap = st_.snapshot()
    assert snap["up"] is False and snap["error"] == "connection refused"
    assert snap["requests_running"] is None and snap["kv_cache_util"] is None


def test_empty_snapshot_has_every_key():
    snap = EngineStats().snapshot()
    assert tuple(snap) == SNAPSHOT_KEYS
    assert snap["prompt_tokens_per_s"] is None and snap["ttft_s"] is None


def test_hist_window_sums_deltas_across_restart():
    b = [1.0]
    seq = [
        _eng(0, 0, hist={"le": b, "cum": [3], "count": 3, "sum": 1.0}),
        _eng(0, 0, hist={"le": b, "cum": [5], "count": 5, "sum": 2.0}),
        _eng(0, 0, hist={"le": b, "cum": [1], "count": 1, "sum": 0.5}),  # restart
        _eng(0, 0, hist={"le": b, "cum": [4], "count": 4, "sum": 1.5}),
    ]
    h = hist_window(seq, "ttft_s")
    assert h["count"] == 2 + 1 + 3


def test_engine_report_counts_and_phases():
    samples = []
    p = g = 0.0
    for i in range(21):
        phase = "idle" if i < 5 else "decode"
        if i >= 5:
            g += 5.0
        samples.append(Sample(t=float(i), gpus=(), engine=_eng(p, g, phase=phase)))
    rep = engine_report(samples)
    assert rep["kind"] == "vllm"
    assert rep["generation_tokens"] == 80.0 and rep["generation_tokens_per_s"] == pytest.approx(4.0)
    assert rep["prompt_tokens_per_s"] == 0.0
    assert rep["ttft_s"] is None and rep["itl_s"] is None and rep["requests"] is None
    assert rep["phases"]["decode"]["ticks"] == 16 and rep["phases"]["idle"]["time_s"] == pytest.approx(5.0)
    assert engine_report([Sample(t=0.0, gpus=())]) is None


def test_engine_report_rate_leaves_a_gap_out_of_both_tokens_and_time():
    # 5 tok/s for 10 s, an unwatched 4 s gap in which 100 tokens were made, then 5 tok/s
    # again. The gap is out of the rate's time and tokens alike (the totals keep them).
    from pcie_tui.analyze.session import SessionAnalyzer
    from pcie_tui.core.model import SessionHeader

    samples, g = [], 0.0
    for t in [float(i) for i in range(11)] + [14.0 + i for i in range(11)]:
        if t == 14.0:
            g += 100.0
        elif t > 0:
            g += 5.0
        samples.append(Sample(t=t, gpus=(), engine=_eng(0.0, g, phase="decode")))
    an = SessionAnalyzer(SessionHeader("2026-12-03", "host", "t", (), interval_s=1.0))
    for x in samples:
        an.feed(x)
    an.gaps = [(10.0, 14.0)]  # as report.py sets them from the reader's gap list
    rep = engine_report(samples, an)
    assert rep["up_s"] == pytest.approx(20.0)
    assert rep["generation_tokens_per_s"] == pytest.approx(5.0)
    assert rep["generation_tokens"] == pytest.approx(200.0)


def test_per_request_hook():
    reqs = [
        {"prompt_tokens": 100, "prompt_s": 0.5, "generation_tokens": 50, "generation_s": 1.0},
        {"prompt_tokens": 300, "prompt_s": 1.0, "generation_tokens": 10, "generation_s": 0.5},
    ]
    s = per_request_summary(reqs)
    assert s["n"] == 2
    assert s["prompt_tokens_per_s"]["p50"] == pytest.approx(250.0)
    assert s["generation_tokens_per_s"]["p99"] == pytest.approx(20 + 30 * 0.99)
    assert s["ttft_s"] is None
    assert per_request_summary([]) is None


def test_window_base_when_ticks_omit_unchanged_histograms():
    # The poller hands out "hist" only when it changed. 100 slow requests long ago, then
    # 60 s without change (no hist on those ticks), then 10 fast ones: the window must see
    # exactly the 10 fast ones, using the last histogram from before the window as base.
    b = [0.05, 0.1, 0.5, 1.0]
    old = {"le": b, "cum": [0, 0, 0, 100], "count": 100, "sum": 75.0}
    new = {"le": b, "cum": [10, 10, 10, 110], "count": 110, "sum": 75.3}
    st_ = EngineStats(window_s=10.0)
    st_.feed(Sample(t=0.0, gpus=(), engine=_eng(0, 0, hist=old)))
    for i in range(1, 121):
        st_.feed(Sample(t=i * 0.5, gpus=(), engine=_eng(0, 0)))
    st_.feed(Sample(t=61.0, gpus=(), engine=_eng(0, 0, hist=new)))
    assert st_.snapshot()["ttft_s"]["p50"] == pytest.approx(0.025)
    # Nothing new in the next 10 s: no latency figure (not a stale one).
    for i in range(1, 25):
        st_.feed(Sample(t=61.0 + i * 0.5, gpus=(), engine=_eng(0, 0)))
    assert st_.snapshot()["ttft_s"] is None


def test_span_says_how_much_of_the_window_the_rates_cover():
    """In its first seconds the window holds less than 10 s: the TUI says "over the last 4.8 s"."""
    st_ = EngineStats(window_s=10.0)
    assert st_.snapshot()["span_s"] is None
    st_.feed(Sample(t=100.0, gpus=(), engine=_eng(0, 0)))
    st_.feed(Sample(t=104.8, gpus=(), engine=_eng(143, 100)))
    snap = st_.snapshot()
    assert snap["span_s"] == pytest.approx(4.8) and snap["prompt_tokens_per_s"] == pytest.approx(143 / 4.8)
