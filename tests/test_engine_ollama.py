"""Ollama, written from its documentation: classification of `ollama serve` and its runners across versions,
settings from the server's environment, probe recognition, and /api/ps (+ the server log's layer offload)
-> EngineSample and header facts against a local fake server serving the documented bodies
(tests/fixtures/engines/README.md). No Ollama server runs here."""

from __future__ import annotations

import http.server
import json
import threading
from pathlib import Path

import pytest
from engines.stub_http import serve

from pcie_tui.engines import FindingFacts, ollama

FIX = Path(__file__).parent / "fixtures" / "engines"


@pytest.fixture
def fake():
    """A fake `ollama serve` on 127.0.0.1 at a free port; set ``routes[path] = (status, body)``."""
    routes: dict[str, tuple[int, bytes]] = {"/": (200, b"Ollama is running")}
    hits: list[str] = []
    with serve(routes, hits=hits) as url:
        yield url, routes, hits


BLOB = "/usr/share/ollama/.ollama/models/blobs/sha256-6a0746a1ec1aef3e7ec53868f220ff6e389f6f8ef87a01d77c96807de94ca2aa"


@pytest.mark.parametrize(
    ("argv", "name", "role"),
    [
        (["/usr/local/bin/ollama", "serve"], "ollama", "root"),
        (["/bin/ollama", "serve"], "ollama", "root"),
        (["/usr/local/bin/ollama", "run", "llama3"], "ollama", None),  # the CLI client, not the server
        (["/usr/local/bin/ollama", "runner", "--ollama-engine", "--model", BLOB, "--port", "41793"], "ollama", "child"),
        (["/usr/local/bin/ollama", "runner", "--model", BLOB, "--port", "41793"], "ollama", "child"),
        (
            [
                "/tmp/ollama1234/runners/cuda_v12/ollama_llama_server",
                "--model",
                BLOB,
                "--ctx-size",
                "8192",
                "--n-gpu-layers",
                "20",
                "--port",
                "40000",
            ],
            "ollama_llama_se",
            "child",
        ),  # fmt: skip
        (
            [
                "/usr/lib/ollama/llama-server",
                "--model",
                BLOB,
                "--port",
                "40123",
                "--host",
                "127.0.0.1",
                "--no-webui",
                "--offline",
                "-c",
                "8192",
                "-np",
                "2",
                "-ngl",
                "20",
            ],
            "llama-server",
            "child",
        ),  # fmt: skip
        (["llama-server", "-m", "/models/qwen.gguf", "--port", "8080"], "llama-server", None),  # a user's own
        (["llama-server", "--model", BLOB, "--port", "8080"], "llama-server", None),  # no --offline/--no-webui
    ],
)
def test_classify(argv, name, role):
    assert ollama.ENGINE.classify(argv, name) == role


def test_runner_titles_carry_placement_flags_not_the_model_path():
    t = ollama.ENGINE.child_title(
        ["/usr/lib/ollama/llama-server", "--model", BLOB, "--port", "1", "--no-webui", "--offline", "-c", "8192",
         "-np", "2", "-ngl", "20"], "llama-server")  # fmt: skip
    assert t == "ollama runner: llama-server -ngl 20 -c 8192 -np 2"
    assert ollama.ENGINE.child_title(["ollama", "runner", "--ollama-engine", "--model", BLOB], "") == (
        "ollama runner (ollama engine)"
    )
    assert ollama.ENGINE.child_title(["ollama", "serve"], "ollama") is None


def test_layout_reads_only_the_named_variables():
    env = {"OLLAMA_HOST": "0.0.0.0:11500", "OLLAMA_NUM_PARALLEL": "4", "OLLAMA_FLASH_ATTENTION": "1",
           "OLLAMA_KV_CACHE_TYPE": "q8_0", "OLLAMA_GPU_OVERHEAD": "536870912", "HF_TOKEN": "secret",
           "OLLAMA_API_KEY": "secret"}  # fmt: skip
    lay = ollama.ENGINE.parse_layout(["ollama", "serve"], env)
    assert (lay["host"], lay["port"], lay["num_parallel"]) == ("0.0.0.0", 11500, 4)
    assert lay["kv_cache_type"] == "q8_0" and lay["gpu_overhead_bytes"] == 536870912 and lay["flash_attention"] == 1
    assert "secret" not in json.dumps(lay)
    assert ollama.ENGINE.parse_layout(["ollama", "serve"], {}) == {"host": None, "port": None}
    assert ollama.parse_host("http://10.0.0.5") == ("10.0.0.5", 80)
    assert ollama.parse_host(":12000") == (None, 12000)
    assert ollama.parse_host("[::1]:11434") == ("::1", 11434)


def test_recognise():
    e = ollama.ENGINE
    assert e.recognise("/api/version", 200, (FIX / "ollama-version.json").read_bytes())
    assert not e.recognise("/api/version", 404, b"404 page not found")
    assert not e.recognise("/api/version", 200, b'{"version": "0.11.0", "commit": "x"}')
    assert e.default_port == 11434 and e.tested is False and e.docs


def test_ps_maps_vram_share_and_leaves_the_rest_none(fake, tmp_path):
    url, routes, hits = fake
    routes["/api/ps"] = (200, (FIX / "ollama-ps.json").read_bytes())
    routes["/api/version"] = (200, (FIX / "ollama-version.json").read_bytes())
    log = tmp_path / "serve.log"
    log.write_bytes((FIX / "ollama-serve.log").read_bytes())
    c = ollama.ENGINE.client(url, None, {"cmdline": None, "layout": None}, str(log))
    s = c.read()
    assert s.up and s.kind == "ollama" and s.error is None
    # Ollama exposes no token counters, request gauges or latencies: None, never 0.
    assert (s.prompt_tokens_total, s.generation_tokens_total, s.requests_running, s.requests_waiting) == (None,) * 4
    assert "hist" not in s.extra and "kv_cache_util" not in s.extra
    size, vram = 6591830464 + 5137025024, 5333539264 + 5137025024
    assert (s.extra["model_bytes"], s.extra["vram_bytes"], s.extra["host_bytes"]) == (size, vram, size - vram)
    assert s.extra["vram_frac"] == pytest.approx(vram / size) and s.extra["models_loaded"] == 2
    gemma = s.extra["models"][0]
    assert gemma["name"] == "gemma4" and gemma["vram_frac"] == pytest.approx(5333539264 / 6591830464)
    assert gemma["context_length"] == 4096 and gemma["quantization"] == "Q4_K_M"
    assert s.extra["models"][1]["context_length"] is None  # docs/api.md's example has none
    assert (s.extra["gpu_layers"], s.extra["total_layers"]) == (20, 35)  # the last load in the log
    s2 = c.read()  # within a second: /api/ps not asked again, models not repeated
    assert hits.count("/api/ps") == 1 and "models" not in s2.extra and s2.extra["vram_frac"] == s.extra["vram_frac"]
    d = c.describe()
    assert d["version"] == "0.5.1" and d["model"] == "gemma4" and d["tested"] is False
    assert d["offload"] == {"gpu_layers": 20, "total_layers": 35, "line": "offloaded 20/35 layers to GPU"}
    fx = ollama.ENGINE.facts(d)
    # size - size_vram is the model's memory not in VRAM (weights, KV and buffers); the weights on the host
    # come from the log's layer split only.
    assert fx.fact("memory_not_in_vram").value == "1.26 GB of gemma4 (19 %)"
    assert "weights, KV cache and compute buffers" in fx.fact("memory_not_in_vram").source
    assert fx.host_weights == "weights of 15 of 35 layers (log: 'offloaded 20/35 layers to GPU')"
    assert fx.fact("gpu_layers").value == "20/35" and fx.host_layers == 15
    assert fx.fact("request_timing").value is None and "private" in fx.fact("request_timing").source
    assert "Ollama placed 81 % of gemma4 in VRAM (/api/ps size_vram 5.33 GB of 6.59 GB)" in fx.log_evidence
    assert "offloaded 20/35 layers to GPU" in fx.log_evidence
    adv = ollama.ENGINE.advise(fx, FindingFacts(bound="transfer"))
    assert (
        len(adv) == 1
        and "OLLAMA_NUM_PARALLEL" in adv[0].fix
        and ollama.ENGINE.advise(fx, FindingFacts(bound="compute")) == []
    )
    assert adv[0].cause.startswith("weights of 15 of 35 layers (log: 'offloaded 20/35 layers to GPU')")
    assert "gpu_layers: 20/35 (log: 'offloaded 20/35 layers to GPU')" in adv[0].evidence


def test_nothing_loaded_and_unknown_shares(fake):
    url, routes, _ = fake
    routes["/api/ps"] = (200, b'{"models": []}')
    s = ollama.ENGINE.client(url, None, {}, None).read()
    assert s.up and s.extra == {"models_loaded": 0, "models": []}  # no share to state: absent, not 0
    weird = {"models": [{"name": "x", "size": 0, "size_vram": 0}, {"name": "y", "size": 10, "size_vram": 20}]}
    assert [m["vram_frac"] for m in ollama.parse_ps(weird)] == [None, None]  # `ollama ps` says "Unknown"
    assert ollama.placement(ollama.parse_ps(weird))["vram_frac"] is None
    fx = ollama.ENGINE.facts({"kind": "ollama", "models": []})
    assert fx.host_weights is None and ollama.ENGINE.advise(fx, FindingFacts(bound="link")) == []


def test_not_ollama_or_down_is_one_clear_error(fake):
    url, routes, _ = fake
    s = ollama.ENGINE.client(url, None, {}, None).read()
    assert not s.up and "HTTP 404" in s.error
    routes["/api/ps"] = (200, b'{"data": []}')
    s = ollama.ENGINE.client(url, None, {}, None).read()
    assert not s.up and "/api/ps unreadable" in s.error
    down = ollama.ENGINE.client("http://127.0.0.1:9", None, {}, None).read()
    assert not down.up and down.error


def test_record_and_report_through_the_cli(fake, tmp_path):
    """`pcie-tui record --url` attaches by probing (no GPU needed here) and `report` reads the file."""
    import gzip
    import subprocess
    import sys

    url, routes, _ = fake
    routes["/api/ps"] = (200, (FIX / "ollama-ps.json").read_bytes())
    routes["/api/version"] = (200, (FIX / "ollama-version.json").read_bytes())
    out = tmp_path / "ollama.jsonl.gz"
    cmd = [sys.executable, "-m", "pcie_tui", "record", "--url", url, "--headless", "--duration", "2", "--out", str(out)]
    rec = subprocess.run(cmd, capture_output=True, text=True, timeout=60)
    assert rec.returncode == 0 and "attached to Ollama" in rec.stderr and "Traceback" not in rec.stderr, rec.stderr
    assert "pid None" not in rec.stderr
    with gzip.open(out, "rt") as f:
        lines = f.read().splitlines()
    head = json.loads(lines[0])["engine"]
    assert head["kind"] == "ollama" and head["tested"] is False and head["placement"]["models_loaded"] == 2
    ticks = [json.loads(x)["engine"] for x in lines[1:] if '"engine"' in x]
    ticks = [e for e in ticks if e and e.get("up")]
    assert ticks and all(e["prompt_tokens_total"] is None and e["requests_running"] is None for e in ticks)
    assert all(e["vram_frac"] == pytest.approx(10470564288 / 11728855488) for e in ticks)
    rep = subprocess.run(
        [sys.executable, "-m", "pcie_tui", "report", "--json", str(out)], capture_output=True, text=True
    )
    assert rep.returncode == 0, rep.stderr
    assert json.loads(rep.stdout)["engine"]["kind"] == "ollama"
    # The exporter carries the placement as gauges (export --prometheus --replay reads the same file).
    from pcie_tui.export.prometheus import ExportState, PrometheusCollector
    from pcie_tui.recording.reader import read_recording

    r = read_recording(out)
    st = ExportState()
    st.start(r.header, "replay", str(out))
    for s in r.samples:
        st.feed(s)
    fams = {f.name: f for f in PrometheusCollector(st).collect()}
    (share,) = fams["pcie_engine_model_vram_ratio"].samples
    assert share.labels == {"engine": "ollama"} and share.value == pytest.approx(10470564288 / 11728855488)
    assert fams["pcie_engine_model_host_bytes"].samples[0].value == 11728855488 - 10470564288


# ---- issue 20: /api/ps facts without a layer split, and the v0.30+ runner's per-request timing ----


def test_ps_alone_never_claims_weights_on_the_host():
    """Without the log's layer split, size - size_vram is model memory not in VRAM, not weights."""
    models = ollama.parse_ps(json.loads((FIX / "ollama-ps.json").read_bytes()))
    fx = ollama.ENGINE.facts({"kind": "ollama", "models": models, "runner_note": "per-request timing unknown: x"})
    assert fx.host_weights is None and fx.host_layers is None
    assert fx.fact("gpu_layers").value is None and fx.fact("gpu_layers").source.startswith("unknown:")
    (adv,) = ollama.ENGINE.advise(fx, FindingFacts(bound="link"))
    assert adv.cause.startswith("1.26 GB of gemma4 (19 %) of the model's memory is not in VRAM (/api/ps size")
    assert "how much of it is weights is unknown" in adv.cause and "weights of" not in adv.cause
    assert any(e.startswith("gpu_layers: unknown (unknown:") for e in adv.evidence)
    assert fx.timing.source == "none" and fx.timing.note == "per-request timing unknown: x"
    assert ollama.ENGINE.timings_unavailable({"kind": "ollama", "runner_note": "per-request timing unknown: x"})
    whole = [m for m in models if m["name"] != "gemma4"]  # all in VRAM: nothing to attribute to the host
    fx = ollama.ENGINE.facts({"kind": "ollama", "models": whole})
    assert fx.fact("memory_not_in_vram").value == "none" and ollama.ENGINE.advise(fx, FindingFacts(bound="link")) == []


def test_runner_port_only_from_a_llama_server_runner_command_line():
    assert ollama.runner_of(["/usr/lib/ollama/llama-server", "--model", BLOB, "--port", "40123", "--host",
                             "127.0.0.1", "--no-webui", "--offline"]) == (40123, "runner's command line: --port 40123")  # fmt: skip
    port, why = ollama.runner_of(["/usr/local/bin/ollama", "runner", "--model", BLOB, "--port", "41793"])
    assert port is None and "Ollama's own runner" in why
    assert ollama.runner_of(["llama-server", "-m", "/models/x.gguf", "--port", "8080"]) == (
        None,
        "not an Ollama runner",
    )
    assert ollama.find_runner(None)[1] == (
        "per-request timing unknown: the runner's port is private (attached by URL, no process)"
    )


def test_v030_runner_slots_and_log_timings_through_the_llama_cpp_client(fake, tmp_path, monkeypatch):
    """A stand-in runner (a fake llama-server with /slots, no --metrics) under a fake `ollama serve`: the
    Ollama client finds it by its command line, reads its slots and the timing lines it wrote into ollama
    serve's log, and the report's timing comes from them."""

    slots = [{"id": 0, "is_processing": True, "n_decoded": 12, "n_prompt_tokens_processed": 300, "id_task": 7},
             {"id": 1, "is_processing": False}]  # fmt: skip

    class Runner(http.server.BaseHTTPRequestHandler):
        def do_GET(self):  # noqa: N802 - http.server's name
            status, body = {"/slots": (200, json.dumps(slots).encode()), "/health": (200, b"{}")}.get(
                self.path, (501, b'{"error": "This server does not support metrics endpoint."}')
            )
            self.send_response(status)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *a):
            pass

    srv = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Runner)
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    port = srv.server_address[1]
    runner = {"pid": 4242, "port": port, "argv": ["llama-server", "--port", str(port)], "source": f"runner's command line: --port {port}"}  # fmt: skip
    monkeypatch.setattr(ollama, "find_runner", lambda pid: ({**runner, "runners": 1}, runner["source"]))
    url, routes, _ = fake
    routes["/api/ps"] = (200, (FIX / "ollama-ps.json").read_bytes())
    log = tmp_path / "serve.log"
    log.write_bytes((FIX / "ollama-serve.log").read_bytes())
    try:
        c = ollama.ENGINE.client(url, 1, {}, str(log))
        d = c.describe()
        assert d["runner"] == {"pid": 4242, "port": port, "source": runner["source"], "runners": 1,
                               "url": f"http://127.0.0.1:{port}"}  # fmt: skip
        with log.open("ab") as f:  # the runner finishes a request (b11434 lines, --no-log-timestamps --no-log-prefix)
            f.write(b"slot print_timing: id  0 | task 7 | prompt eval time =     250.00 ms /   300 tokens\n"
                    b"slot print_timing: id  0 | task 7 |        eval time =     110.00 ms /    12 tokens\n"
                    b"slot print_timing: id  0 | task 7 |       total time =     360.00 ms /   312 tokens\n")  # fmt: skip
        s = c.read()
    finally:
        srv.shutdown()
        srv.server_close()
    assert s.up and s.requests_running == 1.0 and (s.extra["slots_prefill"], s.extra["slots_decode"]) == (0, 1)
    assert s.prompt_tokens_total is None  # the runner runs without --metrics: no counters, not 0
    (req,) = s.extra["requests"]
    assert (req["prompt_n"], req["prompt_ms"], req["predicted_n"]) == (300, 250.0, 12)
    t = ollama.ENGINE.request_timing(req)
    assert t is not None and t.ttft_s == pytest.approx(0.25) and t.itl_mean_s == pytest.approx(0.01)
    fx = ollama.ENGINE.facts(d)
    assert fx.fact("request_timing").value == f"llama-server runner on 127.0.0.1:{port}"
    assert fx.timing.source == "per-request" and ollama.ENGINE.timings_unavailable(d) is None
    assert ollama.ENGINE.timing_basis(1).startswith("Ollama's runner: 1 requests timed by llama-server's log")


# ---- captured from real servers (tests/fixtures/engines/README.md, "Captured from real servers") ----


def test_real_ps_of_a_model_all_in_vram(fake):
    """`curl -Ssf localhost:11434/api/ps | jq .` pasted in nirmato/nirmato-ollama#13 (2025-08-07), verbatim.
    Hand reading: gemma3:latest, size 5964735424 = size_vram 5964735424, so share 1.0, host bytes 0;
    no context_length field (older than Ollama's PR #11331) -> None; Q4_K_M, 4.3B."""
    url, routes, _ = fake
    routes["/api/ps"] = (200, (FIX / "ollama-ps-real-2025-08-07.json").read_bytes())
    c = ollama.ENGINE.client(url, None, {}, None)
    s = c.read()
    assert s.up and s.extra["models_loaded"] == 1
    assert (s.extra["model_bytes"], s.extra["vram_bytes"], s.extra["host_bytes"]) == (5964735424, 5964735424, 0)
    assert s.extra["vram_frac"] == 1.0 and "gpu_layers" not in s.extra
    (m,) = s.extra["models"]
    assert (m["name"], m["context_length"]) == ("gemma3:latest", None)
    assert (m["quantization"], m["parameter_size"]) == ("Q4_K_M", "4.3B")
    fx = ollama.ENGINE.facts(c.describe())
    assert fx.fact("memory_not_in_vram").value == "none" and fx.host_weights is None
    assert "Ollama placed 100 % of gemma3:latest in VRAM (/api/ps size_vram 5.96 GB of 5.96 GB)" in fx.log_evidence
    assert ollama.ENGINE.advise(fx, FindingFacts(bound="link")) == []


@pytest.mark.parametrize(
    ("name", "gpu", "total"),
    [
        # Ollama 0.13.1, its own engine (ggml.go), journald prefix: 'msg="offloaded 0/25 layers to GPU"'.
        ("ollama-serve-real-0.13.1.log", 0, 25),
        # llama.cpp runner, journald prefix: 'load_tensors: offloaded 5/37 layers to GPU'.
        ("ollama-serve-real-2025-05-24.log", 5, 37),
    ],
)
def test_real_serve_logs_give_the_layer_split(fake, tmp_path, name, gpu, total):
    """Server logs pasted in ollama/ollama#13320 (0.13.1, all 25 layers on the CPU) and #10833 (5 of 37 on the
    GPU), cut to the model load. Hand reading: one 'offloaded N/M layers to GPU' line each, inside a
    journalctl line; layers left in host memory = M - N: 25 - 0 = 25, 37 - 5 = 32."""
    url, routes, _ = fake
    routes["/api/ps"] = (200, b'{"models": []}')  # these logs come without their /api/ps
    log = tmp_path / "serve.log"
    log.write_bytes((FIX / name).read_bytes())
    c = ollama.ENGINE.client(url, None, {}, str(log))
    s = c.read()
    assert s.up and (s.extra["gpu_layers"], s.extra["total_layers"]) == (gpu, total)
    line = f"offloaded {gpu}/{total} layers to GPU"
    fx = ollama.ENGINE.facts(c.describe())
    assert fx.fact("gpu_layers").value == f"{gpu}/{total}" and fx.host_layers == total - gpu
    assert fx.host_weights == f"weights of {total - gpu} of {total} layers (log: '{line}')"
    (adv,) = ollama.ENGINE.advise(fx, FindingFacts(bound="link"))
    assert adv.cause.startswith(f"weights of {total - gpu} of {total} layers") and line in adv.evidence
