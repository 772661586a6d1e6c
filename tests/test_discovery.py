"""Discovery and attach without an engine: command-line parsing, URLs, GPUs, and the error paths."""

from __future__ import annotations

import http.server
import os
import subprocess
import sys
import threading
import time

import pytest

from pcie_tui.core.errors import UserError
from pcie_tui.engines import registry
from pcie_tui.engines.argv import flag_values
from pcie_tui.engines.discover import (
    attach,
    discover,
    gpus_for_tree,
    pick_url,
)
from pcie_tui.engines.http import normalize_url
from pcie_tui.engines.llamacpp.proc import parse_layout as parse_llama_layout
from pcie_tui.engines.poller import EnginePoller
from pcie_tui.engines.vllm.client import VllmClient
from pcie_tui.engines.vllm.layout import parse_layout as parse_vllm_layout

API = ["/venv/bin/python", "-m", "vllm.entrypoints.openai.api_server", "--model", "/m"]


@pytest.mark.parametrize(
    "args",
    [
        ["-tp", "2", "-pp", "3", "-dp", "4"],
        ["-tp=2", "-pp=3", "-dp=4"],
        ["--tensor-parallel-size", "2", "--pipeline-parallel-size", "3", "--data-parallel-size", "4"],
        ["--tensor-parallel-size=2", "--pipeline-parallel-size=3", "--data-parallel-size=4"],
        ["-tp", "8", "--tensor-parallel-size=2", "--pipeline-parallel-size", "3", "-dp=4"],  # last one wins
    ],
)
def test_vllm_layout_all_flag_forms(args):
    lay = parse_vllm_layout(API + args)
    assert (lay["tensor_parallel_size"], lay["pipeline_parallel_size"], lay["data_parallel_size"]) == (2, 3, 4)
    assert lay["gpus_expected"] == 24
    assert lay["explicit"] == ["data_parallel_size", "pipeline_parallel_size", "tensor_parallel_size"]
    assert lay["model"] == "/m"


def test_vllm_layout_defaults_and_serve_positional_model():
    lay = parse_vllm_layout(["/usr/bin/vllm", "serve", "org/Model-7B", "--port", "9001", "--host=0.0.0.0"])
    assert (lay["tensor_parallel_size"], lay["pipeline_parallel_size"], lay["data_parallel_size"]) == (1, 1, 1)
    assert lay["explicit"] == [] and lay["model"] == "org/Model-7B"
    assert lay["port"] == 9001 and lay["host"] == "0.0.0.0"


@pytest.mark.parametrize(
    "argv, want",
    [
        (
            ["llama-server", "-m", "x.gguf", "-sm", "row", "-ts", "3,1", "-mg", "1", "-ngl", "99", "--metrics"],
            {"split_mode": "row", "tensor_split": [3.0, 1.0], "main_gpu": 1, "n_gpu_layers": 99, "metrics": True},
        ),
        (
            ["/opt/llama-server", "--split-mode=layer", "--tensor-split=1/1", "--main-gpu=0", "--n-gpu-layers", "all"],
            {"split_mode": "layer", "tensor_split": [1.0, 1.0], "main_gpu": 0, "n_gpu_layers": "all", "metrics": False},
        ),
        (
            ["llama-server", "--gpu-layers=-1", "-sm=none", "--tensor-split", "0.6,0.4"],
            {"split_mode": "none", "tensor_split": [0.6, 0.4], "main_gpu": None, "n_gpu_layers": -1, "metrics": False},
        ),
        (
            ["llama-server", "-m", "x.gguf"],
            {"split_mode": None, "tensor_split": None, "main_gpu": None, "n_gpu_layers": None, "metrics": False},
        ),
    ],
)
def test_llama_layout_all_flag_forms(argv, want):
    lay = parse_llama_layout(argv)
    assert {k: lay.get(k) for k in want} == want


def test_llama_layout_from_environment():
    lay = parse_llama_layout(
        ["llama-server", "-ngl", "20"], {"LLAMA_ARG_N_GPU_LAYERS": "99", "LLAMA_ARG_SPLIT_MODE": "row"}
    )
    assert lay["n_gpu_layers"] == 20 and lay["split_mode"] == "row"  # the flag wins, the variable fills in


def test_flag_without_value_reads_true():
    assert flag_values(["x", "--metrics", "-tp"], {"m": ("--metrics",), "tp": ("-tp",)}) == {"m": True, "tp": True}


@pytest.mark.parametrize(
    "argv, name, kind",
    [
        (API, "python3", "vllm"),
        (["/venv/bin/vllm", "serve", "m"], "vllm", "vllm"),
        (["/venv/bin/python", "/venv/bin/vllm", "serve", "m"], "python", "vllm"),
        (["python", "-m", "vllm.entrypoints.cli.main", "serve", "m"], "python", "vllm"),
        (["python", "/src/vllm/entrypoints/openai/api_server.py", "--model", "m"], "python", "vllm"),
        (["VLLM::EngineCore"], "VLLM::EngineCor", "vllm-child"),
        (["python3"], "VLLM::Worker_TP", "vllm-child"),
        (["/usr/local/bin/llama-server", "-m", "x.gguf"], "llama-server", "llamacpp"),
        (["grep", "vllm.entrypoints.openai.api_server"], "grep", None),
        (["vim", "vllm/serve.txt"], "vim", None),
        (["python", "train.py", "serve"], "python", None),
        ([], "bash", None),
    ],
)
def test_classify(argv, name, kind):
    found = registry.for_process(argv, name)
    got = None if found is None else found[0].name + ("-child" if found[1] == "child" else "")
    assert got == kind


def test_pick_url():
    assert pick_url([("0.0.0.0", 8000), ("127.0.0.1", 45678)], 8000) == "http://127.0.0.1:8000"
    assert pick_url([("127.0.0.1", 45678), ("0.0.0.0", 8000)], 45678) == "http://127.0.0.1:45678"
    assert pick_url([("::1", 9000)], 8000) == "http://[::1]:9000"
    assert pick_url([("10.1.2.3", 8000)], 8000) == "http://10.1.2.3:8000"
    assert pick_url([("::", 8080)], 8080) == "http://127.0.0.1:8080"
    assert pick_url([], 8000) is None


def test_gpus_for_tree():
    running = {0: [10, 11], 1: [20], 2: [], 3: [99]}
    assert gpus_for_tree(running, [11, 20, 30]) == [0, 1]
    assert gpus_for_tree({}, [1]) == [] and gpus_for_tree(None, [1]) == []


def test_normalize_url():
    assert normalize_url("127.0.0.1:8000/") == "http://127.0.0.1:8000"
    assert normalize_url(" http://localhost:8080 ") == "http://localhost:8080"
    for bad in ("ftp://x:1", "http://", "http://h:notaport"):
        with pytest.raises(UserError):
            normalize_url(bad)


# ---- real processes and real HTTP servers (not engines) -----------------------


class _Handler(http.server.BaseHTTPRequestHandler):
    mode = "garbage"

    def do_GET(self):  # noqa: N802 - http.server's name
        mode = type(self).mode
        if mode == "slow":
            time.sleep(2.0)
        if mode == "500":
            self.send_response(500)
            self.end_headers()
            return
        body = b"<html><body>not prometheus</body></html>" if mode in ("garbage", "slow") else b"ok 1\n"
        try:
            self.send_response(200)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)
        except OSError:
            pass  # the client gave up (the slow case): that is the point

    def log_message(self, *a):
        pass


@pytest.fixture
def http_server():
    servers = []

    def make(mode: str) -> str:
        handler = type(f"H_{mode}", (_Handler,), {"mode": mode})
        srv = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
        srv.daemon_threads = True
        threading.Thread(target=srv.serve_forever, daemon=True).start()
        servers.append(srv)
        return f"http://127.0.0.1:{srv.server_address[1]}"

    yield make
    for s in servers:
        s.shutdown()
        s.server_close()


@pytest.mark.parametrize(
    "mode, reason",
    [("garbage", "/metrics unreadable"), ("slow", "timed out"), ("500", "HTTP 500"), ("plain", "no vllm: metrics")],
)
def test_bad_endpoints_read_as_down_with_reason(http_server, mode, reason):
    client = VllmClient(http_server(mode), timeout_s=0.3)  # the default 2 s deadline would only slow this down
    t0 = time.monotonic()
    s = client.read()
    took = time.monotonic() - t0
    assert s.up is False and reason in s.error
    assert s.prompt_tokens_total is None and s.requests_running is None  # never 0
    assert took < 0.6  # 0.3 s budget, with room for a loaded 2-core machine


def test_refused_port_reads_as_down():
    with __import__("socket").socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    s = VllmClient(f"http://127.0.0.1:{port}").read()
    assert s.up is False and s.error == "connection refused"


def test_poller_never_blocks_the_tick_on_a_slow_endpoint(http_server):
    poller = EnginePoller(VllmClient(http_server("slow"), timeout_s=0.3), interval_s=0.2, rediscover=False)
    poller.start()
    try:
        deadline = time.monotonic() + 3
        while poller.latest() is None and time.monotonic() < deadline:
            time.sleep(0.05)
        worst = 0.0
        for _ in range(20):
            t0 = time.perf_counter()
            e = poller.sample_for_tick(time.time(), (), ())
            worst = max(worst, time.perf_counter() - t0)
            time.sleep(0.02)
        assert e is not None and e.up is False and e.error == "timed out" and e.phase == "down"
        # A tick that waited on the endpoint would take its whole 0.3-s timeout; a descheduled thread on
        # a loaded CI machine can take tens of milliseconds, so the line sits between the two.
        assert worst < 0.2, worst
    finally:
        poller.stop()


def test_attach_errors_on_real_processes(http_server):
    # A live process that is not an engine.
    proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        with pytest.raises(
            UserError, match=rf"pid {proc.pid} .* is not a vLLM, llama-server(, [A-Za-z]+)*( or [A-Za-z]+)? process"
        ):
            attach(pid=proc.pid)
    finally:
        proc.kill()
        proc.wait()
    with pytest.raises(UserError, match="no process with pid"):
        attach(pid=proc.pid)  # reaped: gone
    with pytest.raises(UserError, match="is neither vLLM, llama-server"):
        attach(url=http_server("plain"))
    with __import__("socket").socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    with pytest.raises(UserError, match="nothing answers"):
        attach(url=f"127.0.0.1:{port}")
    with pytest.raises(UserError):
        attach()


def test_discover_ignores_non_engines():
    proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)", "vllm.entrypoints.openai.api_server"])
    try:
        assert proc.pid not in {c.pid for c in discover()}
    finally:
        proc.kill()
        proc.wait()


def test_pid_of_a_launcher_attaches_but_pid_1_never_does(monkeypatch):
    """`--pid N` takes N's engine, or the one engine N started (its child or grandchild); pid 1 is above
    every process, so it never picks some other user's engine."""
    import subprocess as sp

    from pcie_tui.core.errors import UserError as UErr
    from pcie_tui.engines import discover as pr

    child = sp.Popen(["sleep", "30"])
    try:
        fake = pr.EngineCandidate(pid=child.pid, kind="llamacpp", url=None, cmdline=("llama-server",))
        monkeypatch.setattr(pr, "discover", lambda *a, **k: [fake])
        assert pr.candidate_for_pid(os.getpid()) is fake  # the launcher of exactly one engine
        with pytest.raises(UErr, match="pid 1 .* is not a vLLM, llama-server(, [A-Za-z]+)*( or [A-Za-z]+)? process"):
            pr.candidate_for_pid(1)
    finally:
        child.kill()
        child.wait()


def test_a_hand_started_llama_server_with_ollama_runner_flags_stays_a_llama_server():
    """Ollama's runner is a llama-server with --offline --no-webui and an Ollama blob; one started the
    same way by hand (no `ollama serve` above it) is a llama-server, not an Ollama engine rooted at
    whatever process started it."""
    from pcie_tui.engines.discover import candidate_for_pid

    argv = ["--offline", "--no-webui", "-m", "/home/u/.ollama/models/blobs/sha256-0123abcd", "--port", "18089"]
    proc = subprocess.Popen(
        ["bash", "-c", 'exec -a llama-server "$0" -c "import time; time.sleep(60)" "$@"', sys.executable, *argv]
    )
    try:
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            try:
                if __import__("psutil").Process(proc.pid).cmdline()[:1] == ["llama-server"]:
                    break
            except Exception:
                pass
            time.sleep(0.05)
        c = candidate_for_pid(proc.pid)
        assert (c.pid, c.kind) == (proc.pid, "llamacpp")
        assert c.layout.get("port") == 18089
    finally:
        proc.kill()
        proc.wait()
