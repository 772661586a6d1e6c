"""Engine facts are typed: what each engine learns, what its advice reads, and one request's timings.

* Every registered engine's ``facts()`` returns :class:`EngineFacts` with typed layout, load mode,
  host-resident layers, timing basis and log warnings, from real recorded engine facts (the bundled
  demos' headers, the vLLM CPU session, the Ollama and SGLang fixtures).
* ``advise()`` gets a typed :class:`FindingFacts`, built from the analysis' finding.
* llama-server's per-request timings are read by the engine (``Engine.request_timing``): the same
  numbers the exporter computed itself before, on every request of the bundled demos.
"""

from __future__ import annotations

import dataclasses
import json
import math
import re
from pathlib import Path
from typing import Any

import pytest

from pcie_tui.analyze.analysis import Analysis
from pcie_tui.engines import (
    EngineFacts,
    FindingFacts,
    Layout,
    RequestTiming,
    TimingBasis,
    engine_info,
    facts_for,
    ollama,
    registry,
    sglang,
)
from pcie_tui.engines.stats import unique_requests
from pcie_tui.export.prometheus import REQUEST_LE, ExportState
from pcie_tui.recording import demos
from pcie_tui.recording.reader import read_recording

ROOT = Path(__file__).resolve().parent.parent
FIXTURES = ROOT / "tests" / "fixtures"
DEMOS = list(demos.available())


def recorded_info(path: str | Path) -> dict[str, Any] | None:
    rec = read_recording(path)
    return engine_info(rec.header.engine, rec.events)


def _ollama_info() -> dict[str, Any]:
    """Ollama's header facts as its client describes them: /api/ps models and the log's layer offload."""
    models = ollama.parse_ps(json.loads((FIXTURES / "engines" / "ollama-ps.json").read_text()))
    offload = ollama.offload_from_log((FIXTURES / "engines" / "ollama-serve.log").read_bytes())
    return {"kind": "ollama", "models": models, "offload": offload, "layout": {}}


def _sglang_info() -> dict[str, Any]:
    argv = ["python", "-m", "sglang.launch_server", "--model-path", "m", "--tp", "2", "--dp-size", "2"]
    argv += ["--cpu-offload-gb", "20"]
    return {"kind": "sglang", "cmdline": argv, "layout": sglang.parse_layout(argv)}


def every_engine_info() -> list[tuple[str, dict[str, Any]]]:
    out: list[tuple[str, dict[str, Any]]] = []
    for name in DEMOS:
        info = recorded_info(demos.resolve(name))
        if info is not None:
            out.append((name, info))
    out.append(("vllm-cpu-session", recorded_info(FIXTURES / "vllm-cpu-session.jsonl") or {}))
    out += [("ollama-fixture", _ollama_info()), ("sglang-argv", _sglang_info())]
    return out


INFOS = every_engine_info()


def test_every_registered_engine_has_real_facts_here() -> None:
    assert {info["kind"] for _, info in INFOS} == set(registry.names())


def _opt(v: Any, typ: type) -> bool:
    return v is None or (isinstance(v, typ) and not (typ is int and isinstance(v, bool)))


@pytest.mark.parametrize(("name", "info"), INFOS, ids=[n for n, _ in INFOS])
def test_facts_are_typed(name: str, info: dict[str, Any]) -> None:
    fx = facts_for(info)
    assert isinstance(fx, EngineFacts) and fx.kind == info["kind"]
    assert isinstance(fx.layout, Layout)
    for v in (fx.layout.tensor_parallel, fx.layout.pipeline_parallel, fx.layout.data_parallel, fx.host_layers):
        assert _opt(v, int) and (v is None or v >= 0)
    assert _opt(fx.layout.split_mode, str) and _opt(fx.load_mode, str) and _opt(fx.ubatch, int)
    assert fx.host_pinned in (True, False, None)
    assert all(isinstance(x, str) for x in (*fx.log_evidence, *fx.log_warnings))
    # The timing basis is the engine's own: histograms, per-request timings, or none.
    eng = registry.get(fx.kind)
    assert eng is not None and isinstance(fx.timing, TimingBasis)
    if fx.kind == "ollama":  # its runner's per-request timings where the runner's port was read, else none
        assert fx.timing.source == ("per-request" if isinstance(info.get("runner"), dict) else "none")
    else:
        assert fx.timing == eng.timing()
        assert fx.timing.source == ("per-request" if eng.per_request_timing else "histograms")
    json.dumps(fx.to_json())  # report --json carries it as is


def test_llama_facts_from_the_demos() -> None:
    by = {n: facts_for(i) for n, i in INFOS}
    pageable, pinned, moe = by["h200-pageable"], by["h200-pinned"], by["h200-moe-pageable"]
    assert pageable is not None and pinned is not None and moe is not None
    # -lm absent: auto = mmap, pageable; -lm none: pinned CUDA host buffers.
    assert (pageable.load_mode, pageable.host_pinned) == ("auto", False)
    assert (pinned.load_mode, pinned.host_pinned) == ("none", True)
    # --n-cpu-ffn 12 -ub 128: the FFN of 12 layers stays in host memory, streamed per 128-token micro-batch.
    assert pageable.host_layers == 12 and pageable.ubatch == 128
    assert moe.host_layers == 16  # --cpu-moe: every layer's experts (16 layers)
    hostdecode = by["h200-hostdecode"]
    # -ngl 4 of 16 layers: the output layer and 3 repeating layers on the GPU, 13 on the CPU
    assert hostdecode is not None and hostdecode.host_layers == 13
    # The loader's warning is kept as written; one GPU held: tp = pp = dp = 1.
    assert any("mmap enabled" in w for w in pageable.log_warnings)
    assert pageable.layout == Layout(tensor_parallel=1, pipeline_parallel=1, data_parallel=1)
    t = pageable.timing
    # Per request: the client's TTFT where the log showed its arrival, else prompt eval time (the basis counts).
    assert t is not None and (t.quantiles, t.ttft_includes_queue) == ("exact", None)


def test_other_engines_facts() -> None:
    by = {n: facts_for(i) for n, i in INFOS}
    vllm, sg, ol = by["vllm-cpu-session"], by["sglang-argv"], by["ollama-fixture"]
    assert vllm is not None and vllm.layout == Layout(tensor_parallel=1, pipeline_parallel=1, data_parallel=1)
    assert vllm.timing is not None and vllm.timing.ttft_includes_queue is True
    assert sg is not None and sg.layout == Layout(tensor_parallel=2, pipeline_parallel=1, data_parallel=2)
    assert sg.tensor_parallel == 2 and sg.host_weights is not None
    assert ol is not None and ol.host_layers == 15 and ol.timing is not None and ol.timing.source == "none"  # 20/35
    vllm_engine = registry.get("vllm")
    assert vllm_engine is not None
    assert vllm_engine.facts({"kind": "vllm", "cmdline": ["vllm", "--load-format", "dummy"]}).load_mode == "dummy"


def test_report_json_engine_facts_lists_every_field() -> None:
    """docs/report-json.md's ``attribution.engine_facts`` table names exactly the keys the report writes."""
    doc = (ROOT / "docs" / "report-json.md").read_text()
    section = doc[doc.index("`attribution.engine_facts`") :]
    section = section[: section.index("\n## ")]
    documented = set(re.findall(r"^\| `([a-z_]+)` \|", section, flags=re.M))
    fx = facts_for(INFOS[0][1])
    assert fx is not None and documented == set(fx.to_json())
    assert set(fx.to_json()["layout"]) == {f.name for f in dataclasses.fields(Layout)}
    assert fx.timing is not None and set(fx.to_json()["timing"]) == {f.name for f in dataclasses.fields(TimingBasis)}


def test_advise_gets_the_typed_finding(monkeypatch: pytest.MonkeyPatch) -> None:
    eng = registry.get("llamacpp")
    assert eng is not None
    seen: list[Any] = []
    real = type(eng).advise

    def spy(self: Any, facts: EngineFacts, finding: Any) -> Any:
        seen.append(finding)
        return real(self, facts, finding)

    monkeypatch.setattr(type(eng), "advise", spy)
    rec = read_recording(demos.resolve("h200-pageable"))
    a = Analysis(rec.header, rec.events)
    a.feed_all(list(rec.samples))
    a.finish()
    ans = a.answer()
    findings = [f for fs in ans.findings.values() for f in fs]
    assert seen and all(isinstance(x, FindingFacts) for x in seen)
    by_key = {(x.gpu, x.phase): x for x in seen}
    for f in findings:
        x = by_key[f.gpu, f.phase]
        ev = f.evidence_json()
        assert (x.bound, x.duration_s, x.bound_s, dict(x.shares)) == (f.bound, f.duration_s, f.bound_s, f.shares)
        assert (x.link_Bps, x.link_of_pinned, x.transfer_staged) == (f.link_Bps, f.link_of_pinned, f.transfer_staged)
        c = ev["ceilings"]
        assert (x.pinned_ceiling_Bps, x.pinned_ceiling_source) == (c["pinned_Bps"], c["pinned_source"])
        assert (x.pageable_ceiling_Bps, x.pageable_ceiling_source) == (c["pageable_Bps"], c["pageable_source"])
        assert (x.vram_used_bytes, x.vram_total_bytes) == (f.vram_used_bytes, f.vram_total_bytes)
        assert x.whatif_pinned == f.whatif_pinned
    # Pageable host weights: the fix names the pinned ceiling and its source from the typed finding.
    h = ans.headline
    assert h.fix is not None and "-lm none" in h.fix and "pinned copies on this GPU reach" in h.fix


# ---- per-request timings -------------------------------------------------------------------


def _num(v: Any) -> float | None:
    ok = isinstance(v, int | float) and not isinstance(v, bool) and math.isfinite(v)
    return float(v) if ok else None


def old_export_observations(r: dict[str, Any]) -> list[tuple[str, float]]:
    """What pcie_tui/export/prometheus.py observed for one request before the engine read its own timings."""
    out: list[tuple[str, float]] = []
    pn, pms = _num(r.get("prompt_n")), _num(r.get("prompt_ms"))
    gn, gms = _num(r.get("predicted_n")), _num(r.get("predicted_ms"))
    if pms is not None and pms >= 0 and (pn is None or pn > 0):
        # Since issue 20: a request whose arrival the log showed is observed at the client's TTFT.
        client = _num(r.get("client_ttft_s"))
        out += [("ttft", client if client is not None else pms / 1e3), ("prefill", pms / 1e3)]
    if gn is not None and gms is not None and gn >= 2 and gms >= 0:
        out += [("decode", gms / 1e3), ("request_itl_mean", gms / (gn - 1) / 1e3)]
    return out


def new_observations(t: RequestTiming | None) -> list[tuple[str, float]]:
    if t is None:
        return []
    pairs = (("ttft", t.ttft_s), ("prefill", t.prefill_s), ("decode", t.decode_s), ("request_itl_mean", t.itl_mean_s))
    return [(k, v) for k, v in pairs if v is not None]


def demo_requests() -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    for name in DEMOS:
        rec = read_recording(demos.resolve(name))
        out += unique_requests(s.engine for s in rec.samples)
    return out


def test_llama_request_timing_gives_the_old_export_numbers() -> None:
    eng = registry.get("llamacpp")
    assert eng is not None
    reqs = demo_requests()
    assert len(reqs) >= 20
    edge = [
        {"prompt_n": 0, "prompt_ms": 0.0, "predicted_n": 1, "predicted_ms": 0.0},
        {"prompt_ms": 12.5, "predicted_n": 2, "predicted_ms": 30.0},
        {"prompt_n": 3, "prompt_ms": -1.0, "predicted_n": True, "predicted_ms": 5.0},
        {"prompt_n": "7", "prompt_ms": "9"},
        {},
    ]
    for r in reqs + edge:
        assert new_observations(eng.request_timing(r)) == old_export_observations(r), r
    assert eng.request_timing({}) is None
    # Engines without per-request timings read none.
    assert all(e.request_timing(reqs[0]) is None for e in registry.engines() if not e.per_request_timing)


def test_exported_request_histograms_are_unchanged() -> None:
    rec = read_recording(demos.resolve("h200-llama-partial"))
    state = ExportState()
    state.start(rec.header, "replay", "h200-llama-partial", rec.events)
    for s in rec.samples:
        state.feed(s)
    want: dict[str, list[float]] = {}
    for r in unique_requests(s.engine for s in rec.samples):
        for k, v in old_export_observations(r):
            want.setdefault(k, []).append(v)
    # This recording's log showed no request's arrival: no queue observations, the rest as before.
    assert set(state.per_request) == set(want) == set(REQUEST_LE) - {"queue", "setup"}
    for k, vals in want.items():
        h = state.per_request[k]
        assert h["count"] == len(vals) and h["sum"] == pytest.approx(sum(vals))
        assert h["cum"] == [sum(1 for v in vals if v <= le) for le in REQUEST_LE[k]]
