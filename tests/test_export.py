"""`pcie-tui export --prometheus` as a real subprocess, scraped over HTTP on 127.0.0.1.

Replays of the bundled H200 llama-server demo and of the vLLM CPU session recording, and
the live path with the stand-in NVML (tests/fakenvml). Every server is stopped by the test
(SIGTERM, then a kill if it did not exit) and every wait is bounded.
"""

from __future__ import annotations

import math
import os
import queue
import re
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families

from pcie_tui.core.model import pcie_capacity_Bps
from pcie_tui.engines.stats import unique_requests
from pcie_tui.export.command import _is_loopback
from pcie_tui.export.prometheus import REQUEST_LE
from pcie_tui.recording import demos
from pcie_tui.recording.reader import read_recording

REPO = Path(__file__).resolve().parents[1]
VLLM_SESSION = REPO / "tests" / "fixtures" / "vllm-cpu-session.jsonl"
URL_RE = re.compile(r"serving Prometheus metrics at (http://127\.0\.0\.1:\d+/metrics)")


class Exporter:
    """One `pcie-tui export` subprocess; stderr lines are collected by a thread."""

    def __init__(self, *args: str, code: str | None = None, env: dict[str, str] | None = None) -> None:
        cmd = [sys.executable, "-c", code] if code else [sys.executable, "-m", "pcie_tui"]
        self.proc = subprocess.Popen(
            [*cmd, "export", "--prometheus", "--port", "0", *args],
            cwd=REPO,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            text=True,
            env={**os.environ, **(env or {})},
        )
        self.lines: queue.Queue[str] = queue.Queue()
        self.stderr: list[str] = []
        threading.Thread(target=self._pump, daemon=True).start()
        self.url = self.wait_line(URL_RE, 60).group(1)

    def _pump(self) -> None:
        assert self.proc.stderr is not None
        for line in self.proc.stderr:
            self.stderr.append(line)
            self.lines.put(line)

    def wait_line(self, pattern: re.Pattern[str], timeout: float) -> re.Match[str]:
        end = time.monotonic() + timeout
        while time.monotonic() < end:
            try:
                line = self.lines.get(timeout=0.2)
            except queue.Empty:
                if self.proc.poll() is not None and self.lines.empty():
                    break
                continue
            m = pattern.search(line)
            if m:
                return m
        raise AssertionError(f"no line matching {pattern.pattern!r}; stderr: {''.join(self.stderr)!r}")

    def scrape(self, query: str = "") -> dict[str, list]:
        with urllib.request.urlopen(self.url + query, timeout=5) as r:
            assert r.status == 200
            text = r.read().decode()
        assert "NaN" not in text and "Inf " not in text.replace('le="+Inf"', "")
        fams: dict[str, list] = {}
        for fam in text_string_to_metric_families(text):
            assert fam.name.startswith("pcie_"), fam.name
            for s in fam.samples:
                assert math.isfinite(s.value), s
                fams.setdefault(s.name, []).append((s.labels, s.value, fam.type))
        return fams

    def stop(self, sig: int = signal.SIGTERM) -> int:
        if self.proc.poll() is None:
            self.proc.send_signal(sig)
        try:
            return self.proc.wait(timeout=15)
        finally:
            if self.proc.poll() is None:
                self.proc.kill()
                self.proc.wait(timeout=5)


@pytest.fixture
def exporters():
    started: list[Exporter] = []

    def start(*args: str, **kw) -> Exporter:
        ex = Exporter(*args, **kw)
        started.append(ex)
        return ex

    yield start
    for ex in started:
        if ex.proc.poll() is None:
            ex.proc.kill()
            ex.proc.wait(timeout=5)


def value(fams: dict[str, list], metric: str, /, **labels: str) -> float | None:
    for lab, v, _ in fams.get(metric, ()):
        if all(lab.get(k) == w for k, w in labels.items()):
            return v
    return None


def same(scraped: float | None, recorded: float | None) -> bool:
    """A scraped value is the recorded reading (exactly, up to float formatting); None = absent both ways."""
    if scraped is None or recorded is None:
        return scraped is None and recorded is None
    return math.isclose(scraped, recorded, rel_tol=1e-12, abs_tol=0.0)


def check_histograms(fams: dict[str, list]) -> set[str]:
    """Cumulative buckets never decrease, +Inf equals _count, _sum is there. Returns the histograms seen."""
    seen = set()
    for name, samples in fams.items():
        if not name.endswith("_bucket"):
            continue
        base = name.removesuffix("_bucket")
        seen.add(base)
        by_series: dict[tuple, list[tuple[float, float]]] = {}
        for lab, v, typ in samples:
            assert typ == "histogram"
            key = tuple(sorted((k, x) for k, x in lab.items() if k != "le"))
            by_series.setdefault(key, []).append((float(lab["le"]), v))
        for key, buckets in by_series.items():
            les = [le for le, _ in buckets]
            assert les == sorted(les) and les[-1] == math.inf
            counts = [c for _, c in buckets]
            assert all(a <= b for a, b in zip(counts, counts[1:], strict=False)), (base, counts)
            labels = dict(key)
            assert value(fams, base + "_count", **labels) == counts[-1]
            assert value(fams, base + "_sum", **labels) is not None
    return seen


def one_hot(fams: dict[str, list], name: str, group: str) -> dict[str, str]:
    """{group value: the label that is 1}; asserts exactly one 1 and the rest 0 per group."""
    out: dict[str, list[str]] = {}
    for lab, v, _ in fams.get(name, ()):
        assert v in (0.0, 1.0)
        out.setdefault(lab[group], [])
        if v == 1.0:
            out[lab[group]].append(lab["verdict" if name == "pcie_verdict" else "phase"])
    assert all(len(v) == 1 for v in out.values()), out
    return {k: v[0] for k, v in out.items()}


# ---- replay ----------------------------------------------------------------------


def test_replay_loop_values_verdict_histograms_and_sigterm(exporters):
    rec = read_recording(demos.resolve("h200-llama-partial"))
    ticks = [
        (g.pcie_tx_Bps, g.pcie_rx_Bps, g.sm_util, g.dram_bw_util, g.mem_busy, g.mem_used_bytes)
        for g in (s.gpus[0] for s in rec.samples)
    ]
    ex = exporters("--replay", "h200-llama-partial", "--speed", "20", "--loop")
    seen_link_in_prefill, peak_rx_link = False, 0.0
    matched = 0
    hists: set[str] = set()
    end = time.monotonic() + 60
    while time.monotonic() < end and not (seen_link_in_prefill and hists and matched >= 20):
        fams = ex.scrape()
        tx = value(fams, "pcie_link_rate_bytes_per_second", gpu="0", bus="pcie", direction="tx")
        rx = value(fams, "pcie_link_rate_bytes_per_second", gpu="0", bus="pcie", direction="rx")
        if tx is None:
            continue  # before the first tick
        # The scraped readings are one recorded tick's, all from the same tick (NVML repeats a
        # PCIe reading over a few ticks, so the tick is found by all its readings together).
        scraped = (
            tx,
            rx,
            value(fams, "pcie_sm_util_ratio", gpu="0"),
            value(fams, "pcie_dram_bandwidth_util_ratio", gpu="0"),
            value(fams, "pcie_memory_busy_duty_ratio", gpu="0"),
            value(fams, "pcie_memory_used_bytes", gpu="0"),
        )
        assert any(all(map(same, scraped, recorded)) for recorded in ticks), scraped
        matched += 1
        # No NVLink on this H200: no sample at all, never 0.
        assert "pcie_link_rate_bytes_per_second" in fams
        assert value(fams, "pcie_link_rate_bytes_per_second", bus="nvlink") is None
        assert value(fams, "pcie_link_ceiling_bytes_per_second", bus="nvlink") is None
        # The one ceiling: this recording has no calibration, so the default (0.90 x theoretical) until
        # a reading goes above it, then the highest reading (observed), never above the theoretical rate.
        default = value(fams, "pcie_link_ceiling_bytes_per_second", gpu="0", bus="pcie", basis="default")
        observed = value(fams, "pcie_link_ceiling_bytes_per_second", gpu="0", bus="pcie", basis="observed")
        assert (default or observed) is not None
        assert default is None or default == pytest.approx(0.90 * pcie_capacity_Bps(5, 16))
        assert observed is None or 0.90 * pcie_capacity_Bps(5, 16) < observed <= pcie_capacity_Bps(5, 16)
        verdict = one_hot(fams, "pcie_verdict", "gpu")["0"]
        phase = one_hot(fams, "pcie_engine_phase", "engine").get("llamacpp")
        if verdict == "link" and phase == "prefill":
            seen_link_in_prefill = True
            peak_rx_link = max(peak_rx_link, rx)
        hists |= check_histograms(fams)
        time.sleep(0.01)
    assert matched >= 20
    assert seen_link_in_prefill, "never scraped pcie_verdict link=1 during the prefill"
    # Prometheus' own filter (?name[]=...) returns those series alone, histograms by their sample names.
    some = ex.scrape("?name[]=pcie_link_rate_bytes_per_second&name[]=pcie_engine_ttft_seconds_bucket")
    assert set(some) == {"pcie_link_rate_bytes_per_second", "pcie_engine_ttft_seconds_bucket"}, set(some)
    assert value(fams, "pcie_gpu_side_available", reason="") == 1
    assert peak_rx_link > 0.7 * pcie_capacity_Bps(5, 16)  # the ~45 GB/s RX of the partial-offload prefill
    assert {"pcie_engine_ttft_seconds", "pcie_engine_prefill_seconds"} <= hists
    t0 = time.monotonic()
    assert ex.stop() == 0
    assert time.monotonic() - t0 < 5
    assert "Traceback" not in "".join(ex.stderr)


def test_replay_end_exposes_every_request_once(exporters):
    rec = read_recording(demos.resolve("h200-llama-partial"))
    ex = exporters("--replay", "h200-llama-partial", "--speed", "50")
    ex.wait_line(re.compile("the source ended"), 30)
    fams = ex.scrape()
    assert value(fams, "pcie_export_ticks_total", source="replay") == len(rec.samples)
    last = rec.samples[-1]
    assert value(fams, "pcie_link_rate_bytes_per_second", direction="rx") == last.gpus[0].pcie_rx_Bps
    assert value(fams, "pcie_export_sample_time_seconds") == last.t
    assert one_hot(fams, "pcie_engine_phase", "engine") == {"llamacpp": last.engine.phase}
    # The engine is down at the end: its token counters are unavailable, so absent.
    assert last.engine.prompt_tokens_total is None and "pcie_engine_prompt_tokens_total" not in fams
    # TTFT = llama-server's prompt time of every finished request, each once, in our fixed bounds.
    ttft = sorted(r["prompt_ms"] / 1e3 for r in unique_requests(s.engine for s in rec.samples))
    assert len(ttft) == 6
    assert value(fams, "pcie_engine_ttft_seconds_count") == len(ttft)
    assert value(fams, "pcie_engine_ttft_seconds_sum") == pytest.approx(sum(ttft))
    for le in REQUEST_LE["ttft"]:
        want = sum(1 for v in ttft if v <= le)
        got = value(fams, "pcie_engine_ttft_seconds_bucket", le=str(le))
        assert got == want, (le, got, want)
    check_histograms(fams)
    # The metrics live at /metrics alone: / says where, any other path is a 404.
    base = ex.url.removesuffix("/metrics")
    with urllib.request.urlopen(base + "/", timeout=5) as r:
        assert r.status == 200 and b"/metrics" in r.read()
    for path in ("/other", "/metrics/x", "/favicon.ico"):
        with pytest.raises(urllib.error.HTTPError) as e:
            urllib.request.urlopen(base + path, timeout=5)
        assert e.value.code == 404, path
    # HEAD: the headers alone on the wire (urllib would hide a body sent anyway).
    host, port = base.removeprefix("http://").rsplit(":", 1)
    with socket.create_connection((host, int(port)), timeout=5) as sock:
        sock.sendall(b"HEAD / HTTP/1.0\r\nHost: x\r\n\r\n")
        raw = b""
        while chunk := sock.recv(4096):
            raw += chunk
    assert raw.startswith(b"HTTP/1.0 200") and raw.endswith(b"\r\n\r\n"), raw
    with socket.create_connection((host, int(port)), timeout=5) as sock:  # HEAD /metrics: a health check
        sock.sendall(b"HEAD /metrics HTTP/1.0\r\nHost: x\r\n\r\n")
        raw = b""
        while chunk := sock.recv(4096):
            raw += chunk
    assert raw.startswith(b"HTTP/1.0 200") and raw.endswith(b"\r\n\r\n") and b"pcie_" not in raw, raw
    with pytest.raises(urllib.error.HTTPError) as e:
        urllib.request.urlopen(urllib.request.Request(base + "/", data=b"x", method="POST"), timeout=5)
    assert e.value.code == 405
    assert ex.stop() == 0


def test_vllm_histograms_are_reexposed_with_their_own_buckets(exporters):
    rec = read_recording(VLLM_SESSION)
    last_hist = [s.engine.extra["hist"] for s in rec.samples if s.engine and "hist" in s.engine.extra][-1]
    ex = exporters("--replay", str(VLLM_SESSION), "--speed", "1000")
    ex.wait_line(re.compile("the source ended"), 30)
    fams = ex.scrape()
    for key, name in (("ttft_s", "ttft"), ("itl_s", "itl"), ("prefill_s", "prefill"), ("decode_s", "decode")):
        h = last_hist[key]
        got = [(float(lab["le"]), v) for lab, v, _ in fams[f"pcie_engine_{name}_seconds_bucket"]]
        assert got == [*zip(h["le"], h["cum"], strict=True), (math.inf, h["count"])]
        assert value(fams, f"pcie_engine_{name}_seconds_count", engine="vllm") == h["count"]
        assert value(fams, f"pcie_engine_{name}_seconds_sum", engine="vllm") == pytest.approx(h["sum"])
    check_histograms(fams)
    e = rec.samples[-1].engine
    assert value(fams, "pcie_engine_prompt_tokens_total", engine="vllm") == e.prompt_tokens_total
    assert value(fams, "pcie_engine_generation_tokens_total", engine="vllm") == e.generation_tokens_total
    assert value(fams, "pcie_engine_kv_cache_util_ratio", engine="vllm") == e.extra["kv_cache_util"]
    # The recording has no GPU: no GPU series, no verdict (absent, not 0).
    assert not any(n.startswith(("pcie_link_", "pcie_verdict", "pcie_sm_")) for n in fams)
    assert ex.stop(signal.SIGINT) == 0  # Ctrl-C: a clean stop too
    assert "Traceback" not in "".join(ex.stderr)


# ---- live (stand-in NVML) ------------------------------------------------------------

LIVE = """
import sys, fakenvml
from pcie_tui.cli import main as cli
from pcie_tui.sources.nvml import NvmlCollector
cli.open_gpus = lambda idx: NvmlCollector(idx, nvml=fakenvml.FakeNvml(fakenvml.load_capture()))
sys.exit(cli.main(sys.argv[1:]))
"""


def test_live_collection_with_the_stand_in_nvml(exporters, tmp_path):
    pytest.importorskip("fakenvml", reason="tests/fakenvml (replaying H200 stand-in) not present")
    env = {"PYTHONPATH": os.pathsep.join([str(REPO / "tests"), str(REPO)]), "XDG_CONFIG_HOME": str(tmp_path)}
    ex = exporters("--no-engine", "--interval", "0.1", code=LIVE, env=env)
    end, seen = time.monotonic() + 30, []
    while time.monotonic() < end and len(seen) < 5:
        fams = ex.scrape()
        if value(fams, "pcie_link_rate_bytes_per_second", direction="rx") is not None:
            seen.append(fams)
        time.sleep(0.15)
    assert len(seen) >= 5
    assert any("live GPUs" in line for line in ex.stderr), ex.stderr
    ticks = [value(f, "pcie_export_ticks_total", source="live") for f in seen]
    assert ticks == sorted(ticks) and ticks[-1] > ticks[0]
    for fams in seen:
        for d in ("tx", "rx"):
            assert value(fams, "pcie_link_rate_bytes_per_second", gpu="0", bus="pcie", direction=d) >= 0
        ceiling = value(fams, "pcie_link_ceiling_bytes_per_second", gpu="0", bus="pcie")
        assert 0.90 * pcie_capacity_Bps(5, 16) - 1 <= ceiling <= pcie_capacity_Bps(5, 16)
        assert value(fams, "pcie_link_rate_bytes_per_second", bus="nvlink") is None  # NVLink: NotSupported
        assert 0 <= value(fams, "pcie_sm_util_ratio", gpu="0") <= 1
        assert value(fams, "pcie_gpu_info", name="NVIDIA H200", metrics_source="gpm") == 1
        assert set(one_hot(fams, "pcie_verdict", "gpu")) == {"0"}
        assert not any(n.startswith("pcie_engine_") for n in fams)  # --no-engine
        assert value(fams, "pcie_gpu_side_available", reason="") == 1
    assert any(value(f, "pcie_dram_bandwidth_util_ratio", gpu="0") is not None for f in seen)
    assert ex.stop() == 0
    assert "Traceback" not in "".join(ex.stderr)


# ---- bad input -------------------------------------------------------------------------


def run_cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "pcie_tui", "export", *args], cwd=REPO, capture_output=True, text=True, timeout=60
    )


def one_line_exit_2(p: subprocess.CompletedProcess[str], words: str) -> None:
    assert p.returncode == 2, p
    lines = p.stderr.strip().splitlines()
    assert len(lines) == 1 and words in lines[0], p.stderr
    assert "Traceback" not in p.stderr


def test_port_in_use_is_one_line_and_exit_2():
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        p = run_cli("--prometheus", "--replay", "h200-llama-partial", "--port", str(port))
    one_line_exit_2(p, f"cannot serve on 127.0.0.1:{port}")


@pytest.mark.parametrize(
    ("args", "words"),
    [
        (("--host", "no-such-host.invalid"), "cannot serve on no-such-host.invalid"),
        (("--host", "192.0.2.1"), "cannot serve on 192.0.2.1"),  # TEST-NET: not an address of this machine
        (("--port", "70000"), "port must be 0..65535"),
        (("--port", "http"), "not a number"),
        (("--speed", "0"), "speed must be > 0"),
    ],
)
def test_bad_host_or_port_is_one_line_and_exit_2(args, words):
    one_line_exit_2(run_cli("--prometheus", "--replay", "h200-llama-partial", *args), words)


def test_bad_use_is_one_line_and_exit_2():
    one_line_exit_2(run_cli("--replay", "h200-llama-partial"), "--prometheus")
    one_line_exit_2(
        run_cli("--prometheus", "--replay", "no-such-demo"), "no such recording: no-such-demo (nor a bundled"
    )
    one_line_exit_2(run_cli("--prometheus", "--replay", "h200-pinnd"), "did you mean h200-pinned?")
    one_line_exit_2(run_cli("--prometheus", "--replay", str(REPO / "docs")), "is a directory, not a recording")
    one_line_exit_2(run_cli("--prometheus", "--loop"), "--replay only")


def test_loopback_detection():
    assert all(_is_loopback(h) for h in ("127.0.0.1", "127.0.0.2", "localhost", "::1", "[::1]"))
    assert not any(_is_loopback(h) for h in ("0.0.0.0", "192.168.1.5", "::", "example.com"))


# ---- docs and dashboard ----------------------------------------------------------------


def exposed_names() -> set[str]:
    from pcie_tui.export.prometheus import COUNTERS, HELP

    return {f"{n}_total" if n in COUNTERS else n for n in HELP}


def test_docs_describe_every_metric():
    doc = (REPO / "docs" / "export.md").read_text()
    for name in exposed_names():
        assert f"`{name}`" in doc, name


def test_grafana_dashboard_is_importable_and_uses_exposed_metrics():
    import json

    dash = json.loads((REPO / "docs" / "grafana-pcie-tui.json").read_text())
    assert dash["schemaVersion"] >= 36 and dash["title"] and dash["uid"]
    (ds,) = [v for v in dash["templating"]["list"] if v["type"] == "datasource"]
    assert ds["query"] == "prometheus"
    ids = [p["id"] for p in dash["panels"]]
    assert len(ids) == len(set(ids))
    histos = {n for n in exposed_names() if n.endswith("_seconds") and n.startswith("pcie_engine_")}
    known = exposed_names() | {f"{h}_bucket" for h in histos}
    used: set[str] = set()
    kinds = set()
    for p in dash["panels"]:
        assert {"x", "y", "w", "h"} <= set(p["gridPos"])
        if p["type"] == "row":
            continue
        kinds.add(p["type"])
        assert p["datasource"]["uid"] == "${" + ds["name"] + "}"
        for t in p["targets"]:
            assert t["datasource"]["uid"] == "${" + ds["name"] + "}"
            assert t["expr"].count("(") == t["expr"].count(")")
            used |= set(re.findall(r"\bpcie_[a-z_]+", t["expr"]))
    assert used <= known, used - known
    for want in ("pcie_link_rate_bytes_per_second", "pcie_link_ceiling_bytes_per_second", "pcie_verdict"):
        assert want in used
    assert {"pcie_engine_ttft_seconds_bucket", "pcie_engine_generation_tokens_total"} <= used
    assert {"timeseries", "state-timeline"} <= kinds


def test_status_line_says_when_the_gpu_side_is_absent():
    from types import SimpleNamespace

    from pcie_tui.export.command import _open_source

    args = SimpleNamespace(replay=None)
    alone = SimpleNamespace(gpus=None, engine=object())
    both = SimpleNamespace(gpus=object(), engine=object())
    assert _open_source(args, lambda a, interactive: (alone, "engine: sglang at x"))[1].startswith(
        "engine alone (no GPU side); "
    )
    assert _open_source(args, lambda a, interactive: (both, "engine: none"))[1].startswith("live GPUs; ")


def test_pcie_bound_carries_the_answer_tick_by_tick():
    """The pageable H200 session: its prefill is transfer-bound below link capacity (no saturation
    verdict ever says so); pcie_bound says it while pcie_verdict says none, as the report does."""
    from pcie_tui.export.prometheus import BOUND_NAMES, ExportState, PrometheusCollector

    rec = read_recording(demos.resolve("h200-pageable"))
    st = ExportState()
    st.start(rec.header, "replay", "h200-pageable")
    seen: dict[tuple[str | None, str, str], int] = {}
    for s in rec.samples:
        st.feed(s)
        fams = {f.name: f for f in PrometheusCollector(st).collect()}
        if "pcie_bound" not in fams:
            continue
        ones = [x.labels["bound"] for x in fams["pcie_bound"].samples if x.value == 1.0]
        assert len(ones) == 1 and {x.labels["bound"] for x in fams["pcie_bound"].samples} == set(BOUND_NAMES)
        verdict = next(x.labels["verdict"] for x in fams["pcie_verdict"].samples if x.value == 1.0)
        phase = s.engine.phase if s.engine is not None else None
        seen[phase, verdict, ones[0]] = seen.get((phase, verdict, ones[0]), 0) + 1
    prefill = {k: n for k, n in seen.items() if k[0] == "prefill"}
    top = max(prefill, key=prefill.__getitem__)
    assert top == ("prefill", "none", "transfer") and prefill[top] > 0.9 * sum(prefill.values())
