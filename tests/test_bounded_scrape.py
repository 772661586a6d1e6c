"""Engine scrapes are bounded in bytes and in total time: a 10 MB /metrics served slowly is one
failed scrape within about the timeout, and the GPU side keeps its pace meanwhile."""

from __future__ import annotations

import http.server
import threading
import time

import pytest

from pcie_tui.core.model import GpuInfo, GpuSample, LinkInfo
from pcie_tui.engines.http import MAX_BODY_BYTES, http_get
from pcie_tui.engines.llamacpp.client import LlamaCppClient
from pcie_tui.engines.poller import EnginePoller
from pcie_tui.engines.vllm.client import VllmClient
from pcie_tui.sources.live import LiveSource


class _Slow(http.server.BaseHTTPRequestHandler):
    """10 MB, 64 kB every 10 ms (a 1.6 s body), or a small body that trickles a byte at a time."""

    def do_GET(self):  # noqa: N802 - http.server's name
        big = self.path != "/trickle"
        size = 10 << 20 if big else 4000
        self.send_response(200)
        self.send_header("Content-Type", "text/plain")
        self.send_header("Content-Length", str(size))
        self.end_headers()
        step = 65536 if big else 1
        try:
            for i in range(0, size, step):
                self.wfile.write(b"#" * min(step, size - i))
                self.wfile.flush()
                time.sleep(0.01 if big else 0.002)
        except OSError:
            pass

    def log_message(self, *a):
        pass


@pytest.fixture(scope="module")
def slow_url():
    httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Slow)
    httpd.daemon_threads = True
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{httpd.server_address[1]}"
    httpd.shutdown()


def test_http_get_stops_at_the_byte_bound_and_the_deadline(slow_url):
    t0 = time.monotonic()
    with pytest.raises(OSError, match="larger than 2 MB"):
        http_get(slow_url + "/metrics", 5.0)  # plenty of time: the size bound ends it
    assert time.monotonic() - t0 < 2.0 and MAX_BODY_BYTES == 2 << 20
    t0 = time.monotonic()
    with pytest.raises(TimeoutError):
        http_get(slow_url + "/trickle", 0.3)  # every recv answers in time; the whole does not
    assert time.monotonic() - t0 < 0.6


@pytest.mark.parametrize("path", ["", "/trickle"])
def test_llamacpp_scrape_is_one_failure_within_the_timeout(slow_url, path):
    client = LlamaCppClient(slow_url + path)
    client.timeout_s = 0.3
    t0 = time.monotonic()
    s = client.read()
    took = time.monotonic() - t0
    assert not s.up and s.error and s.prompt_tokens_total is None
    # before: 8.4 s for the 10 MB body against a 0.3 s timeout
    assert took < 1.5, f"{took:.2f} s"


def test_vllm_scrape_is_one_failure_within_the_timeout(slow_url):
    client = VllmClient(slow_url, timeout_s=0.3)
    t0 = time.monotonic()
    s = client.read()
    assert not s.up and s.error and time.monotonic() - t0 < 1.0


class _FakeGpus:
    def gpu_infos(self):
        return (GpuInfo(0, "GPU-x", "fake", "0", LinkInfo(5, 16, 5, 16, 63e9), None),)

    def read(self):
        return (GpuSample(0, 1.0, 2.0),)

    def running_pids(self):
        return {}

    def close(self):
        pass


def test_gpu_side_keeps_its_pace_while_the_engine_answers_slowly(slow_url):
    poller = EnginePoller(LlamaCppClient(slow_url), interval_s=0.1, rediscover=False)
    poller.start()
    src = LiveSource(_FakeGpus(), poller, interval_s=0.05, calibrate=False)
    try:
        t0 = time.monotonic()
        ticks = [src.read() for _ in range(40)]
        took = time.monotonic() - t0
    finally:
        src.close()
    assert all(s is not None and s.gpus[0].pcie_rx_Bps == 2.0 for s in ticks)
    assert took < 40 * 0.05 + 0.5, f"40 ticks at 50 ms took {took:.2f} s"
    assert poller.failed_scrapes >= 1 and poller.scrapes >= poller.failed_scrapes
