"""SGLang /metrics captured from real servers (tests/fixtures/real-payloads/sglang/README.md), served from a
local fake server and read through SGLangClient: what the tool reads from each, by hand arithmetic. No SGLang
runs here; these bodies are real output pasted by SGLang's maintainers and users."""

from __future__ import annotations

import http.server
import threading
from pathlib import Path

import pytest

from pcie_tui.analyze.engine import hist_quantiles
from pcie_tui.engines import sglang

REAL = Path(__file__).parent / "fixtures" / "real-payloads" / "sglang"


@pytest.fixture
def serve():
    """Serve one real /metrics body on 127.0.0.1; returns a function body-file -> base URL."""
    routes: dict[str, bytes] = {}

    class H(http.server.BaseHTTPRequestHandler):
        def do_GET(self):  # noqa: N802 - http.server's name
            body = routes.get(self.path)
            self.send_response(200 if body is not None else 404)
            self.send_header("Content-Length", str(len(body or b"")))
            self.end_headers()
            self.wfile.write(body or b"")

        def log_message(self, *a):
            pass

    srv = http.server.ThreadingHTTPServer(("127.0.0.1", 0), H)
    threading.Thread(target=srv.serve_forever, daemon=True).start()

    def with_metrics(name: str) -> str:
        routes["/metrics"] = (REAL / name).read_bytes()
        return f"http://127.0.0.1:{srv.server_address[1]}"

    yield with_metrics
    srv.shutdown()
    srv.server_close()


def test_docs_capture_counters_gauges_and_old_itl_name(serve):
    """The `curl http://localhost:30000/metrics` of SGLang's production-metrics page (sgl-project/sglang
    docs/references/production_metrics.md at 00b08c49), verbatim: one label set (model_name), no tp_rank, no
    realtime counter. Hand reading: prompt 8.128902e+06, generation 7.557572e+06, running 162, waiting 2826,
    token_usage 0.28, used tokens 123859; ITL under the older name time_per_output_token_seconds."""
    c = sglang.ENGINE.client(serve("docs-production-metrics-00b08c49.txt"), None, {}, None)
    s = c.read()
    assert s.up and s.error is None
    assert (s.prompt_tokens_total, s.generation_tokens_total) == (8128902.0, 7557572.0)
    assert (s.requests_running, s.requests_waiting) == (162.0, 2826.0)
    assert s.extra["kv_cache_util"] == 0.28 and s.extra["kv_tokens_used"] == 123859.0
    assert s.extra["gen_throughput_tps"] == 86.50814177726902 and s.extra["dp_ranks"] == 1
    assert sorted(s.extra["hist"]) == ["e2e_s", "itl_s", "ttft_s"]  # no queue_time_seconds in that build
    assert "live_generation_tokens_total" not in s.extra and "hicache" not in s.extra
    assert "requests_finished_total" not in s.extra  # no sglang:num_requests_total in that build
    d = c.describe()
    assert d["realtime_tokens"] is False and d["hicache"] is None
    fx = sglang.ENGINE.facts(d)
    assert fx.fact("token_source").value == "at request end"  # so phases come from request-end counters


def test_docs_capture_quantiles_by_hand(serve):
    """Hand reading of the same capture. ITL (count 7400757): p50 rank 3700378.5 lies in (0.075, 0.1] between
    cum 433413 and 4950195: 0.075 + 0.025 * (3700378.5 - 433413) / 4516782 = 0.09308; p95 rank 7030719.15 in
    (0.1, 0.15]: 0.1 + 0.05 * 2080524.15 / 2089240 = 0.14979. TTFT (count 11008): only 2513 are <= 30 s, the
    highest finite bucket, so p50/p95/p99 all fall in +Inf and read 30.0 s, the highest bound (a floor, as
    Prometheus reads it: 8495 of 11008 first tokens took longer than 30 s)."""
    s = sglang.ENGINE.client(serve("docs-production-metrics-00b08c49.txt"), None, {}, None).read()
    h = s.extra["hist"]
    itl = hist_quantiles(h["itl_s"])
    assert itl is not None
    assert itl["p50"] == pytest.approx(0.075 + 0.025 * (3700378.5 - 433413) / (4950195 - 433413))
    assert itl["p95"] == pytest.approx(0.1 + 0.05 * (7030719.15 - 4950195) / (7039435 - 4950195))
    assert h["ttft_s"]["count"] == 11008.0 and h["ttft_s"]["cum"][-1] == 2513.0 and h["ttft_s"]["le"][-1] == 30.0
    assert hist_quantiles(h["ttft_s"]) == {"p50": 30.0, "p95": 30.0, "p99": 30.0}
    assert h["ttft_s"]["sum"] == pytest.approx(2.3518979474117756e06)  # mean 213.7 s: far above the last bucket


def test_pr4412_capture_engine_type_label_without_ranks(serve):
    """`sglang:` gauges of a March 2025 build (sgl-project/sglang#4412, the first four families): labels
    engine_type + model_name, no tp_rank/dp_rank (one DP rank), all 0.0; no num_queue_reqs in the cut."""
    s = sglang.ENGINE.client(serve("pr4412-metrics-2025-03.txt"), None, {}, None).read()
    assert s.up and (s.requests_running, s.requests_waiting) == (0.0, None)
    assert s.extra["kv_cache_util"] == 0.0 and s.extra["gen_throughput_tps"] == 0.0 and s.extra["dp_ranks"] == 1
    assert (s.prompt_tokens_total, s.generation_tokens_total) == (None, None)


def test_pr7944_capture_finished_requests_and_cached_tokens(serve):
    """A prefill-decode deployment's /metrics (sgl-project/sglang#7944): sglang:num_requests_total 217 and
    sglang:cached_tokens_total 2688 read as finished requests and cached prompt tokens; the aborted-request
    counter (157) is none of ours; running 0."""
    s = sglang.ENGINE.client(serve("pr7944-metrics-pd.txt"), None, {}, None).read()
    assert s.up and s.requests_running == 0.0
    assert s.extra["requests_finished_total"] == 217.0 and s.extra["cached_tokens_total"] == 2688.0
    assert not any("aborted" in k for k in s.extra)
