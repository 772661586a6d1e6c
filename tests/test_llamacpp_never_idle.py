"""No "idle" while a client waits (issue 24), against a real llama-server with its host prompt cache on (the
default) and off (--cache-ram 0), under sequential and concurrent streaming clients.

pcie-tui's own poller (EnginePoller + LlamaCppClient at 10 Hz, in its thread) reads the server while a tick
loop asks it for each tick's phase, as `pcie-tui record` does. Checked:

* every tick while some client had a request outstanding is not idle, except within one scrape interval
  plus a margin of a request's send (the server may not have it yet) and of its last byte (the server is
  done; the client is reading): on 2 shared cores, 0.25 s each;
* each request's parts (slot wait + slot setup + batch wait + prefill) sum to its TTFT as the tool reports
  it, and that TTFT's median is the clients' within 25 % (see the assertion).
"""

from __future__ import annotations

import statistics
import threading
import time

import pytest
from engines.gguf_model import write_llama_gguf
from engines.llama_server import LlamaServer, closed_loop, llama_available

from pcie_tui.engines.llamacpp.client import LlamaCppClient
from pcie_tui.engines.poller import EnginePoller

_why = llama_available()
pytestmark = [pytest.mark.engine] + ([pytest.mark.skip(reason=_why)] if _why else [])
MARGIN_S = 0.25


@pytest.fixture(scope="module")
def model(tmp_path_factory):
    path = tmp_path_factory.mktemp("gguf") / "tiny-llama.gguf"
    write_llama_gguf(path, n_embd=256, n_ff=768, n_layer=4, n_head=8)
    return path


def _session(server: LlamaServer, concurrency: int, n_requests: int, n_predict: int):
    """Closed-loop streaming clients while the poller and a 10 Hz tick loop run; returns the clients'
    (send, first, end) on the wall clock, the ticks' (time, phase) and the finished requests' timelines."""
    poller = EnginePoller(
        LlamaCppClient(server.url, pid=server.pid, log_path=str(server.log_path)), interval_s=0.1, rediscover=False
    )
    poller.start()
    ticks: list[tuple[float, str | None]] = []
    done: list[dict] = []
    stop = threading.Event()

    def tick_loop() -> None:
        while not stop.is_set():
            t = time.time()
            s = poller.sample_for_tick(t, ())
            if s is not None:
                ticks.append((t, s.phase))
                done.extend(s.extra.get("requests") or ())
            stop.wait(0.1)

    ticker = threading.Thread(target=tick_loop, daemon=True)
    ticker.start()
    time.sleep(0.5)
    wall = time.time() - time.monotonic()
    results = closed_loop(server.url, concurrency, n_requests, n_predict, seed=3)
    assert all(r.error is None and r.t_first is not None for r in results), [r.error for r in results]
    spans = [(r.t_send + wall, r.t_first + wall, r.t_end + wall) for r in results]
    end = time.monotonic() + 5
    while len(done) < n_requests and time.monotonic() < end:
        time.sleep(0.1)
    stop.set()
    ticker.join()
    poller.stop()
    return spans, ticks, done


@pytest.mark.parametrize("cache", ["on", "off"])
@pytest.mark.parametrize(("slots", "concurrency", "n_requests", "n_predict"), [(1, 1, 6, 150), (1, 4, 12, 16)])
def test_no_idle_tick_while_a_client_waits(model, tmp_path, cache, slots, concurrency, n_requests, n_predict):
    extra = ("-t", "1", *(("--cache-ram", "0") if cache == "off" else ()))
    server = LlamaServer(model, tmp_path / "server.log", metrics=True, parallel=slots, extra=extra).start()
    try:
        spans, ticks, done = _session(server, concurrency, n_requests, n_predict)
    finally:
        server.stop()
    assert len(spans) == n_requests and len(done) == n_requests

    def outstanding(t: float) -> bool:
        return any(s + MARGIN_S <= t <= e - MARGIN_S for s, _, e in spans)

    busy = [(t, p) for t, p in ticks if outstanding(t)]
    idle = [round(t - spans[0][0], 2) for t, p in busy if p in ("idle", None)]
    phases = sorted({str(p) for _, p in busy})
    print(f"\ncache {cache}, {slots} slot(s), {concurrency} client(s): {len(busy)} ticks outstanding, phases {phases}")
    assert busy and not idle, f"idle while a client waited at {idle} s (of {len(busy)} ticks)"

    for r in done:  # the parts sum to the TTFT the tool reports
        parts = r["queue_s"] + r["slot_setup_s"] + r["batch_wait_s"] + r["prompt_ms"] / 1e3
        assert parts == pytest.approx(r["client_ttft_s"], abs=2e-3), r
    want = statistics.median(f - s for s, f, _ in spans)
    got = statistics.median(r["client_ttft_s"] for r in done)
    # Here within 25 %: the tick thread shares the 2 cores with 4 clients, the server and the poller, and the
    # server's HTTP thread tokenises a text prompt before anything it exposes sees the request (±15 % is
    # asserted in test_llamacpp_client_ttft.py, without the tick thread).
    assert got == pytest.approx(want, rel=0.25), (got, want)


def test_a_request_still_arriving_is_not_idle(model, tmp_path):
    """Between a client's connection and the request's slot the server is receiving and tokenising it (the
    H200 prompt-cache run read idle there for 0.2-0.3 s, issue 24): its loop, gauges and log say nothing
    yet, the kernel's connection table does. A client that sends its request over 1.5 s: no tick of that
    is idle once the table has been read (at most 1 % of a core: every 0.1 s where a read is cheap)."""
    import json
    import socket

    server = LlamaServer(model, tmp_path / "server.log", metrics=True, parallel=1, extra=("-t", "1")).start()
    client = LlamaCppClient(server.url, pid=server.pid, log_path=str(server.log_path))
    poller = EnginePoller(client, interval_s=0.1, rediscover=False)
    poller.start()
    ticks: list[tuple[float, str | None]] = []
    stop = threading.Event()

    def tick_loop() -> None:
        while not stop.is_set():
            s = poller.sample_for_tick(time.time(), ())
            if s is not None:
                ticks.append((time.time(), s.phase))
            stop.wait(0.1)

    ticker = threading.Thread(target=tick_loop, daemon=True)
    try:
        ticker.start()
        time.sleep(1.0)
        body = json.dumps({"prompt": "the " * 200, "n_predict": 4, "stream": False}).encode()
        head = (
            f"POST /completion HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
            f"Content-Length: {len(body)}\r\nConnection: close\r\n\r\n"
        ).encode()
        with socket.create_connection(("127.0.0.1", server.port)) as sock:
            t_conn = time.time()
            sock.sendall(head)
            for i in range(0, len(body), len(body) // 15 + 1):  # the body over about 1.5 s
                sock.sendall(body[i : i + len(body) // 15 + 1])
                time.sleep(0.1)
            reply = sock.recv(65536)
            t_reply = time.time()  # the answer came (its request done: 4 tokens)
            while chunk := sock.recv(65536):
                reply += chunk
        assert b" 200 " in reply.split(b"\r\n", 1)[0], reply[:200]
        time.sleep(0.5)
    finally:
        stop.set()
        ticker.join()
        poller.stop()
        server.stop()
    every = client._idle_conns.every_s
    waiting = [(round(t - t_conn, 2), p) for t, p in ticks if t_conn + every + 0.25 <= t <= t_reply - 0.25]
    assert len(waiting) >= 5, (every, waiting)
    assert all(p not in ("idle", None) for _, p in waiting), (every, [w for w in waiting if w[1] in ("idle", None)])
    # receiving it, the server's own work (its last piece may already be in prefill by the client's clock)
    assert all(p == "housekeeping" for _, p in waiting[:-2]), (every, [w for w in waiting if w[1] != "housekeeping"])
    before = [p for t, p in ticks if t < t_conn - 0.2]
    assert before and all(p == "idle" for p in before), before  # nothing outstanding: idle
