"""One home per engine: nothing outside pcie_tui/engines/ names one, and an engine added to the
registry at run time is discovered, attached (by pid and by URL) and polled by the generic code."""

from __future__ import annotations

import ast
import json
import os
import subprocess
import sys
import textwrap
import time
from pathlib import Path
from typing import Any

import pytest

from pcie_tui.core.errors import UserError
from pcie_tui.core.model import EngineSample
from pcie_tui.engines import registry
from pcie_tui.engines.base import Engine, EngineClient, SourceRow

PKG = Path(__file__).resolve().parents[1] / "pcie_tui"


# ---- (a) nothing outside engines/ names an engine ---------------------------------------------


def _docstrings(tree: ast.AST) -> set[int]:
    ids = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Module | ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef) and node.body:
            first = node.body[0]
            if isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant):
                ids.add(id(first.value))
    return ids


def engine_mentions(path: Path, names: set[str]) -> list[str]:
    """String literals equal to an engine's name or display name (or a ``name:`` metric prefix),
    and imports of an engine's own modules, in one source file."""
    tree = ast.parse(path.read_text(), str(path))
    docs = _docstrings(tree)
    engine_mods = {f"pcie_tui.engines.{n}" for n in names}
    out = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in docs:
            v = node.value.strip().lower()
            if v in names or any(v.startswith(n + ":") for n in names):
                out.append(f"{path.relative_to(PKG.parent)}:{node.lineno}: literal {node.value!r}")
        elif isinstance(node, ast.ImportFrom) and node.module:
            mods = {node.module} | {f"{node.module}.{a.name}" for a in node.names}
            for m in mods:
                if any(m == e or m.startswith(e + ".") for e in engine_mods):
                    out.append(f"{path.relative_to(PKG.parent)}:{node.lineno}: imports {m}")
        elif isinstance(node, ast.Import):
            for a in node.names:
                if any(a.name == e or a.name.startswith(e + ".") for e in engine_mods):
                    out.append(f"{path.relative_to(PKG.parent)}:{node.lineno}: imports {a.name}")
        elif isinstance(node, ast.Call) and getattr(node.func, "attr", getattr(node.func, "id", "")) == "import_module":
            arg = node.args[0] if node.args else None
            if isinstance(arg, ast.Constant) and isinstance(arg.value, str) and arg.value in engine_mods:
                out.append(f"{path.relative_to(PKG.parent)}:{node.lineno}: imports {arg.value}")
    return out


def _all_names() -> set[str]:
    names = set()
    for e in registry.engines():
        names.update({e.name.lower(), e.display.lower()})
    return names | {"llama-server"}


def test_nothing_outside_engines_names_an_engine():
    names = _all_names()
    assert {"vllm", "llamacpp", "llama-server"} <= names
    found = []
    for path in sorted(PKG.rglob("*.py")):
        if (PKG / "engines") in path.parents:
            continue
        found += engine_mentions(path, names)
    assert not found, "engine named outside pcie_tui/engines/:\n" + "\n".join(found)


def test_the_scan_catches_what_it_looks_for(tmp_path):
    # The scan must be able to fail: a file with each kind of mention is caught, prose and docstrings are not.
    bad = tmp_path / "pcie_tui" / "bad.py"
    bad.parent.mkdir()
    bad.write_text(
        textwrap.dedent(
            '''
            """Works with vLLM."""
            from pcie_tui.engines.vllm.client import VllmClient
            from pcie_tui.engines import llamacpp
            import pcie_tui.engines.llamacpp.log
            ok = "attach to vLLM or llama-server"
            def f(kind):
                return kind == "vllm" or "llamacpp:prompt_tokens_total" or "llama-server"
            '''
        )
    )
    global PKG
    saved, PKG = PKG, tmp_path / "pcie_tui"
    try:
        got = engine_mentions(bad, _all_names())
    finally:
        PKG = saved
    text = "\n".join(got)
    assert "imports pcie_tui.engines.vllm.client" in text
    assert "imports pcie_tui.engines.llamacpp" in text
    assert "imports pcie_tui.engines.llamacpp.log" in text
    assert "literal 'vllm'" in text and "literal 'llamacpp:prompt_tokens_total'" in text
    assert "literal 'llama-server'" in text
    assert "vLLM or llama-server" not in text and "Works with" not in text


# ---- (b) registry lookups of the built-in engines ------------------------------------------------


@pytest.mark.parametrize(
    "argv, name, want",
    [
        (
            ["/venv/bin/python3", "-m", "vllm.entrypoints.openai.api_server", "--model", "/m", "--port", "8001"],
            "python3",
            ("vllm", "root"),
        ),
        (["/venv/bin/python3", "/venv/bin/vllm", "serve", "Qwen/Qwen2.5-0.5B", "-tp", "2"], "vllm", ("vllm", "root")),
        (["VLLM::EngineCore"], "VLLM::EngineCor", ("vllm", "child")),
        (
            ["/opt/llama.cpp/build/bin/llama-server", "-m", "m.gguf", "-ngl", "99", "--port", "8081"],
            "llama-server",
            ("llamacpp", "root"),
        ),
        (["python3", "-m", "http.server", "8000"], "python3", None),
    ],
)
def test_for_process(argv, name, want):
    got = registry.for_process(argv, name)
    assert (None if got is None else (got[0].name, got[1])) == want


def test_lookup_and_attributes():
    v, ll = registry.get("vllm"), registry.get("llamacpp")
    assert v is not None and ll is not None
    names = registry.names()
    assert names[0] == "vllm" and names.index("vllm") < names.index("llamacpp")  # probe order of the tested ones
    assert (v.display, v.default_port, v.per_request_timing) == ("vLLM", 8000, False)
    assert (ll.display, ll.default_port, ll.per_request_timing) == ("llama-server", 8080, True)
    assert registry.get("nonesuch") is None and registry.get(None) is None
    assert registry.display("nonesuch") == "nonesuch" and registry.display("vllm") == "vLLM"
    assert "-tp" in v.layout_flags and "-ngl" in ll.layout_flags and "-ot" in ll.layout_repeatable
    assert ll.parse_layout(["llama-server", "-ngl", "12", "-sm", "row"], {})["n_gpu_layers"] in (12, "12")
    assert v.parse_layout(["vllm", "serve", "m", "-tp", "4"], {})["tensor_parallel_size"] == 4
    assert ll.parallelism({"split_mode": "row"}, 2) == (2, 1) and ll.parallelism({}, 2) == (1, 2)
    assert v.parallelism({"tensor_parallel_size": 2, "pipeline_parallel_size": 3}, 6) == (2, 3)
    assert v.sources("the last 10 s") and ll.sources("the last 10 s")


def test_probe_recognition():
    vllm_metrics = b"# TYPE vllm:num_requests_running gauge\nvllm:num_requests_running 0.0\n"
    llama_metrics = b"# TYPE llamacpp:prompt_tokens_total counter\nllamacpp:prompt_tokens_total 12\n"
    props = json.dumps({"default_generation_settings": {"n_ctx": 4096}, "total_slots": 1}).encode()
    assert registry.for_probe("/metrics", 200, vllm_metrics).name == "vllm"
    assert registry.for_probe("/metrics", 200, llama_metrics).name == "llamacpp"
    assert registry.for_probe("/version", 200, b'{"version": "0.32.0"}').name == "vllm"
    # Other services' /version (extra fields, or not a string) are not vLLM's.
    for other in (b'{"service": "api", "version": "0.1.0"}', b'{"version": 2}', b'{"version": "1", "timestamp": "x"}'):
        assert registry.for_probe("/version", 200, other) is None, other
    assert registry.for_probe("/props", 200, props).name == "llamacpp"
    assert registry.for_probe("/metrics", 200, b"other_metric 1\n") is None
    assert registry.for_probe("/props", 404, props) is None
    paths = registry.probe_paths()
    assert paths[:2] == ("/metrics", "/version") and "/props" in paths


# ---- (b) an engine registered at test time goes through the generic code --------------------------


class FakeClient:
    kind = "fakeeng"

    def __init__(self, url: str, pid: int | None, info: dict[str, Any]) -> None:
        self.url, self.pid, self.info = url, pid, info
        self.n = 0

    def describe(self) -> dict[str, Any]:
        return {"kind": self.kind, "url": self.url, "pid": self.pid, **self.info}

    def read(self) -> EngineSample:
        self.n += 1
        return EngineSample(kind=self.kind, up=True, prompt_tokens_total=10.0 * self.n, generation_tokens_total=0.0)


class FakeEngine(Engine):
    name = "fakeeng"
    display = "FakeEngine"
    default_port = 18999
    probe_paths = ("/fake-info",)

    def classify(self, argv, proc_name):
        return "root" if argv and os.path.basename(argv[0]) == "fake-engine-server" else None

    def parse_layout(self, argv, environ):
        return {"model": "fake-model", "tensor_parallel_size": 1}

    def recognise(self, path, status, body):
        return status == 200 and path == "/fake-info" and b'"fakeeng"' in body

    def client(self, url, pid, info, log_path) -> EngineClient:
        return FakeClient(url, pid, info)

    def sources(self, window: str) -> list[SourceRow]:
        return [("tokens", "fake counter", "tokens/s", window)]


SERVER = """
import http.server, json, sys
class H(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        body = json.dumps({"engine": "fakeeng"}).encode() if self.path == "/fake-info" else b"no"
        self.send_response(200 if self.path == "/fake-info" else 404)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)
    def log_message(self, *a):
        pass
s = http.server.HTTPServer(("127.0.0.1", 0), H)
print(s.server_address[1], flush=True)
s.serve_forever()
"""


@pytest.fixture
def fake_engine():
    registry.register(FakeEngine())
    # A real process whose argv[0] is the fake engine's server name, answering its probe path.
    proc = subprocess.Popen(
        ["bash", "-c", 'exec -a fake-engine-server "$0" -c "$1"', sys.executable, SERVER],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        port = int(proc.stdout.readline())
        yield proc.pid, port
    finally:
        proc.kill()
        proc.wait()
        registry.unregister("fakeeng")


def test_a_registered_engine_is_discovered_attached_and_polled(fake_engine):
    from pcie_tui.engines import discover
    from pcie_tui.engines.poller import EnginePoller
    from pcie_tui.tui.sources import engine_sources

    pid, port = fake_engine
    deadline = time.monotonic() + 10
    found = []
    while time.monotonic() < deadline:
        found = [c for c in discover.discover() if c.kind == "fakeeng"]
        if found and found[0].url:
            break
        time.sleep(0.1)
    assert [c.pid for c in found] == [pid]
    assert found[0].url == f"http://127.0.0.1:{port}" and found[0].layout["model"] == "fake-model"

    by_pid = discover.attach(pid=pid)
    assert isinstance(by_pid, FakeClient) and by_pid.pid == pid and by_pid.url == f"http://127.0.0.1:{port}"
    assert discover.probe_kind(f"http://127.0.0.1:{port}") == "fakeeng"
    by_url = discover.attach(url=f"127.0.0.1:{port}")
    assert isinstance(by_url, FakeClient) and by_url.pid == pid  # the local process behind the port

    poller = EnginePoller(by_url, rediscover=False)
    poller.poll_once()
    poller.poll_once()
    tick = poller.sample_for_tick(time.time(), [])
    assert tick is not None and tick.up and tick.kind == "fakeeng" and tick.phase == "prefill"
    assert poller.describe()["kind"] == "fakeeng"
    rows = engine_sources("fakeeng", {}, 10.0)
    assert rows[0].source == "fake counter"
    assert registry.display("fakeeng") == "FakeEngine"


def test_an_unknown_url_names_every_engine(fake_engine):
    from pcie_tui.engines import discover

    _pid, port = fake_engine
    # The fake engine's server answers, but no engine (the fake one neither) recognises the answer.
    registry.register(type("Deaf", (FakeEngine,), {"recognise": lambda self, p, s, b: False})())
    with pytest.raises(UserError) as e:
        discover.probe_kind(f"http://127.0.0.1:{port}")
    assert "is neither vLLM, llama-server, " in str(e.value) and " nor " in str(e.value)
    assert all(x.display in str(e.value) for x in registry.engines())


def test_a_reattach_keeps_the_log_the_user_named(monkeypatch):
    """After an engine restart the poller attaches a new client; a --log file goes with it."""
    from pcie_tui.engines import discover
    from pcie_tui.engines.poller import EnginePoller

    class Old:
        kind, url, pid, info, user_log_path = "llamacpp", "http://127.0.0.1:8080", 11, {}, "/var/log/llama.log"

        def describe(self):
            return {"kind": self.kind}

        def read(self):
            raise AssertionError("not polled here")

    cand = discover.EngineCandidate(pid=12, kind="llamacpp", url="http://127.0.0.1:8080", cmdline=("llama-server",))
    got = {}

    def client_for(c, url=None, log_path=None, running_pids=None):
        got["log_path"] = log_path
        return Old()

    monkeypatch.setattr(discover, "discover", lambda: [cand])
    monkeypatch.setattr(discover, "client_for", client_for)
    poller = EnginePoller(Old(), rediscover=False)
    poller._last_reattach_try = -1e9
    events: list = []
    assert poller._maybe_reattach(1.0, events)
    assert got["log_path"] == "/var/log/llama.log"
    assert events and events[0]["event"] == "engine_reattach"


def test_a_process_replaced_faster_than_the_scrapes_notice_is_said_once(monkeypatch):
    """The engine's process died and a new one took its port before a scrape failed: the URL still answers,
    but the process attached to is gone: one engine_down (pid_alive false); reattaching is tested on a real
    llama-server in tests/test_session_faults.py."""
    from pcie_tui.engines import poller as poller_mod
    from pcie_tui.engines.poller import EnginePoller

    class Client:
        kind, url, pid = "llamacpp", "http://127.0.0.1:8080", 111

        def read(self):
            return EngineSample(kind="llamacpp", up=True, phase="idle")

        def describe(self):
            return {"pid": self.pid}

    alive = {111: True}
    monkeypatch.setattr(poller_mod, "pid_alive", lambda pid: alive.get(pid, False))
    p = EnginePoller(Client(), interval_s=0.1, rediscover=False)
    p.poll_once()  # attached while it answers
    alive[111] = False  # killed; a new process answers on the same port at once
    events = p.drain_events()
    for _ in range(3):
        p.poll_once()
        events += p.drain_events()
    downs = [e for e in events if e["event"] == "engine_down"]
    assert len(downs) == 1 and downs[0]["pid_alive"] is False and "another answers" in downs[0]["reason"]
