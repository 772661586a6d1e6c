"""vLLM's offload settings as typed facts with their sources, the advice that rests on them, and the
engine's own byte and prefix-cache counters beside NVML's PCIe bytes (flag names of vLLM 0.32)."""

from __future__ import annotations

import io

import pytest
from rich.console import Console

from pcie_tui.analyze.engine_bytes import EngineBytes, PhaseCounts, offload_check
from pcie_tui.analyze.engine_session import engine_report
from pcie_tui.analyze.session import analyze
from pcie_tui.core.model import EngineSample, GpuInfo, GpuSample, LinkInfo, Sample, SessionHeader, pcie_capacity_Bps
from pcie_tui.engines import facts_for
from pcie_tui.engines.base import FindingFacts
from pcie_tui.engines.vllm import ENGINE, advice, runtime

SERVE = ["vllm", "serve", "m"]


def fact(argv, env=None):
    return {f.name: f for f in runtime.facts(SERVE + argv, env)}


def test_weight_offload_backends_as_vllm_resolves_them():
    f = fact(["--cpu-offload-gb", "4"])["weight_offload"]
    assert (f.value, f.source) == ("uva: 4 GiB per GPU", "flag --cpu-offload-gb 4")
    f = fact(["--cpu_offload_gb=2.5"])["weight_offload"]  # vLLM takes underscores and '='
    assert f.value == "uva: 2.5 GiB per GPU"
    # auto picks prefetch when a group size is set, whatever --cpu-offload-gb says.
    f = fact(["--cpu-offload-gb", "4", "--offload-group-size", "8", "--offload-num-in-group", "2"])["weight_offload"]
    assert f.value == "prefetch: 2 of every 8 layers, 1 ahead"
    assert f.source == "flag --offload-group-size 8 --offload-num-in-group 2"
    # An explicit uva backend ignores the prefetch fields.
    f = fact(["--offload-backend", "uva", "--offload-group-size", "8", "--cpu-offload-gb", "1"])["weight_offload"]
    assert f.value == "uva: 1 GiB per GPU"
    f = fact([])["weight_offload"]
    assert (f.value, f.source) == ("none", "default: no --cpu-offload-gb, no --offload-group-size")
    assert fact(["--offload-backend", "magic"])["weight_offload"].value is None  # unknown, not assumed


def test_pinning_is_unknown_without_the_environment():
    args = ["--cpu-offload-gb", "4"]
    assert fact(args)["weights_pinned"].value is None
    assert "not read" in fact(args)["weights_pinned"].source
    assert fact(args, {})["weights_pinned"].value is True
    off = fact(args, {"VLLM_WEIGHT_OFFLOADING_DISABLE_PIN_MEMORY": "1"})["weights_pinned"]
    assert (off.value, off.source) == (False, "env VLLM_WEIGHT_OFFLOADING_DISABLE_PIN_MEMORY=1")
    assert fact(args, {"VLLM_WEIGHT_OFFLOADING_DISABLE_PIN_MEMORY": "0"})["weights_pinned"].value is True
    assert fact(args, {"VLLM_WEIGHT_OFFLOADING_DISABLE_PIN_MEMORY": "yes"})["weights_pinned"].value is None


def test_kv_offload_from_its_flags_and_the_transfer_config():
    f = fact(["--kv-offloading-size", "16"], {})["kv_offload"]
    assert (f.value, f.source) == ("16 GiB CPU (OffloadingConnector)", "flag --kv-offloading-size 16")
    f = fact(["--kv-offloading-size", "16"], {"VLLM_USE_SIMPLE_KV_OFFLOAD": "1"})["kv_offload"]
    assert f.value == "16 GiB CPU (SimpleCPUOffloadConnector)"
    assert "or" in fact(["--kv-offloading-size", "16"])["kv_offload"].value  # environment unread: both named
    f = fact(["--kv-offloading-size", "8", "--kv-offloading-backend", "lmcache"])["kv_offload"]
    assert f.value.startswith("LMCacheMPConnector")
    cfg = '{"kv_connector":"LMCacheConnectorV1","kv_role":"kv_both"}'
    f = fact(["--kv-transfer-config", cfg])["kv_offload"]
    assert (f.value, f.source) == ("LMCacheConnectorV1", "flag --kv-transfer-config kv_connector=LMCacheConnectorV1")
    f = fact(["--kv-transfer-config.kv_connector", "OffloadingConnector"])["kv_offload"]
    assert f.value == "OffloadingConnector"
    assert fact(["--kv-transfer-config", '{"kv_connector":"NixlConnector"}'])["kv_offload"].value.startswith("none")
    assert fact(["--kv-transfer-config", "{oops"])["kv_offload"].value is None
    assert fact([])["kv_offload"].value == "none"


def test_prefix_caching_flag_or_unknown():
    assert fact(["--enable-prefix-caching"])["prefix_caching"].value is True
    assert fact(["--no-enable-prefix-caching"])["prefix_caching"].value is False
    assert fact([])["prefix_caching"].value is None


def test_engine_facts_carry_them_with_sources():
    info = {"cmdline": SERVE + ["--cpu-offload-gb", "4", "--kv-offloading-size", "16"], "layout": {"env": {}}}
    fx = facts_for({"kind": "vllm", **info})
    assert fx.host_weights == "uva: 4 GiB per GPU (flag --cpu-offload-gb 4)"
    assert fx.host_pinned is True and "VLLM_WEIGHT_OFFLOADING_DISABLE_PIN_MEMORY unset" in fx.host_memory_why
    assert fx.kv_on_host.startswith("KV cache blocks in host memory: 16 GiB CPU (OffloadingConnector)")
    assert [f.name for f in fx.runtime] == ["weight_offload", "weights_pinned", "kv_offload", "prefix_caching"]
    # Discovery keeps the offload variables of the server's environment, and nothing else.
    lay = ENGINE.parse_layout(SERVE, {"PATH": "/bin", "VLLM_USE_SIMPLE_KV_OFFLOAD": "1"})
    assert lay["env"] == {"VLLM_USE_SIMPLE_KV_OFFLOAD": "1"}
    assert "env" not in ENGINE.parse_layout(SERVE, {})


def _fx(*argv, env=None):
    return advice.facts({"cmdline": [*SERVE, *argv], "layout": {"env": env if env is not None else {}}})


def test_each_cause_shows_its_fact_and_source():
    (a,) = advice.advise(_fx("--cpu-offload-gb", "4"), FindingFacts(bound="link", phase="decode", link_Bps=50e9))
    assert "flag --cpu-offload-gb 4" in a.cause and "lower --cpu-offload-gb (now 4)" in a.fix
    assert a.evidence[0] == "weight offload: uva: 4 GiB per GPU (flag --cpu-offload-gb 4)"
    fx = _fx("--cpu-offload-gb", "4", env={"VLLM_WEIGHT_OFFLOADING_DISABLE_PIN_MEMORY": "1"})
    (a,) = advice.advise(fx, FindingFacts(bound="transfer", phase="decode"))
    assert "pageable" in a.cause and "unset VLLM_WEIGHT_OFFLOADING_DISABLE_PIN_MEMORY" in a.fix
    (a,) = advice.advise(_fx("--offload-group-size", "8"), FindingFacts(bound="link", phase="prefill"))
    assert "1 of every 8 layers" in a.cause and "--offload-num-in-group" in a.fix
    # Environment unread: pinning unknown, and no pageable cause rests on it.
    fx = advice.facts({"cmdline": [*SERVE, "--cpu-offload-gb", "4"], "layout": {}})
    assert fx.host_pinned is None
    (a,) = advice.advise(fx, FindingFacts(bound="transfer", phase="decode"))
    assert "pageable" not in a.cause


def test_kv_offload_advice_rests_on_the_engines_bytes():
    fx = _fx("--kv-offloading-size", "16")
    busy = FindingFacts(bound="link", phase="prefill", link_Bps=40e9, engine_offload_Bps=30e9, nvml_pcie_Bps=41e9)
    (a,) = advice.advise(fx, busy)
    assert "flag --kv-offloading-size 16" in a.cause
    assert any("vllm:kv_offload_load_bytes" in e and "30.0 GB/s" in e and "41.0 GB/s" in e for e in a.evidence)
    # The engine says its KV offload moved little of what crossed the link: not the cause.
    quiet = FindingFacts(bound="link", phase="prefill", link_Bps=40e9, engine_offload_Bps=1e9)
    assert advice.advise(fx, quiet) == []
    # Its bytes unknown (an older vLLM without the counters): the flag alone still names it.
    assert len(advice.advise(fx, FindingFacts(bound="link", phase="prefill", link_Bps=40e9))) == 1
    # No KV offload on the command line: no KV cause, whatever else.
    assert advice.advise(_fx(), busy) == []


def test_prefix_cache_hits_explain_a_quiet_prefill():
    fx = _fx()
    quiet = FindingFacts(
        bound="compute", phase="prefill", shares={"compute": 0.9, "link": 0.0}, prefix_cache_hit_rate=0.6
    )
    (a,) = advice.advise(fx, quiet)
    assert a.fix is None and "60% of the prompt tokens" in a.cause and "vllm:prefix_cache_hits" in a.cause
    assert advice.advise(fx, FindingFacts(bound="compute", phase="prefill", prefix_cache_hit_rate=None)) == []
    assert advice.advise(fx, FindingFacts(bound="compute", phase="decode", prefix_cache_hit_rate=0.6)) == []
    assert advice.advise(fx, FindingFacts(bound="compute", phase="prefill", prefix_cache_hit_rate=0.02)) == []


CAP = pcie_capacity_Bps(5, 16)


def _header(engine):
    gpu = GpuInfo(0, "GPU-x", "H200", "0000:00:06.0", LinkInfo(5, 16, 5, 16, CAP), 141 << 30, metrics_source="gpm")
    return SessionHeader("2026-12-06", "host", "t", (gpu,), engine=engine, interval_s=0.5)


def _session(engine_Bps: float, nvml_Bps: float, n=21, hit_every=0.5):
    """n ticks 0.5 s apart: the engine's KV offload counters grow at engine_Bps (3:1 host->device),
    NVML reads nvml_Bps of PCIe RX + TX; half the prompt tokens looked up are prefix-cache hits."""
    out = []
    for i in range(n):
        extra = {
            "kv_offload_h2d_bytes_total": 0.75 * engine_Bps * 0.5 * i,
            "kv_offload_d2h_bytes_total": 0.25 * engine_Bps * 0.5 * i,
            "prefix_cache_queries_total": 100.0 * i,
            "prefix_cache_hits_total": 100.0 * hit_every * i,
        }
        eng = EngineSample("vllm", True, phase="prefill", prompt_tokens_total=100.0 * i, extra=extra)
        gpu = GpuSample(0, pcie_rx_Bps=0.75 * nvml_Bps, pcie_tx_Bps=0.25 * nvml_Bps, dram_bw_util=0.1, sm_util=0.5)
        out.append(Sample(1000.0 + 0.5 * i, (gpu,), eng))
    return out


def test_engine_bytes_beside_nvml_and_the_check_line():
    hdr = _header({"kind": "vllm", "cmdline": [*SERVE, "--kv-offloading-size", "16"]})
    agree = _session(10e9, 11e9)
    an = analyze(hdr, agree)
    pc = an.engine_bytes.phases["prefill"]
    assert pc.span_s == pytest.approx(10.0)
    assert pc.rate("engine_bytes") == pytest.approx(10e9) and pc.rate("nvml_bytes") == pytest.approx(11e9)
    assert pc.rate("h2d_bytes") == pytest.approx(7.5e9) and pc.hit_rate == pytest.approx(0.5)
    rep = engine_report(agree, an)
    assert rep["bytes"]["check"] is None and rep["bytes"]["session"]["prefix_cache_hit_rate"] == pytest.approx(0.5)
    # The engine says it moved twice what NVML saw on the link: the report says so and whom it trusts.
    wrong = _session(20e9, 10e9)
    an = analyze(hdr, wrong)
    rep = engine_report(wrong, an)
    check = rep["bytes"]["check"]
    assert "vLLM says its KV offloading moved 20.0 GB/s" in check and "NVML saw 10.0 GB/s" in check
    assert "trusts NVML" in check
    # The text report prints the counters and the check.
    from pcie_tui.report.text import _render_engine_bytes

    buf = io.StringIO()
    _render_engine_bytes(rep["bytes"], Console(file=buf, width=200))
    text = buf.getvalue()
    assert "prefix cache: 50 % of" in text and "15.0 GB/s host->device" in text and "check: vLLM says" in text


def test_no_counters_no_bytes_and_restarts_count_from_zero():
    plain = [Sample(s.t, s.gpus, EngineSample("vllm", True, phase="prefill")) for s in _session(1e9, 1e9)]
    an = analyze(_header({"kind": "vllm"}), plain)
    assert engine_report(plain, an)["bytes"] is None
    eb = EngineBytes()
    pc = PhaseCounts(span_s=2.0, engine_bytes=10e6, nvml_bytes=1e6)
    assert offload_check(pc) is not None
    assert offload_check(PhaseCounts(span_s=2.0, engine_bytes=1.05e9, nvml_bytes=1e9)) is None  # within 10 %
    assert offload_check(PhaseCounts(span_s=2.0, engine_bytes=1e9, nvml_bytes=None)) is None  # no NVML reading
    assert eb.total().engine_bytes is None
