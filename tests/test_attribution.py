"""Attribution rules at their thresholds, on synthetic ticks; live and report agree on real sessions."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from pcie_tui.analyze import attribution as at
from pcie_tui.analyze.answer import answer
from pcie_tui.analyze.session import analyze
from pcie_tui.core.model import EngineSample, GpuInfo, GpuSample, LinkInfo, Sample, SessionHeader, pcie_capacity_Bps
from pcie_tui.engines import EngineFacts, facts_for
from pcie_tui.engines.llamacpp.advice import parse_flags
from pcie_tui.recording.reader import read_recording

DATA = Path(__file__).parents[1] / "pcie_tui" / "data"
CAP = pcie_capacity_Bps(5, 16)


def header(measured=None, pageable=None, engine=None) -> SessionHeader:
    link = LinkInfo(5, 16, 5, 16, CAP, measured_Bps=measured, measured_pageable_Bps=pageable)
    gpu = GpuInfo(0, "GPU-x", "H200", "0000:00:06.0", link, 141 << 30, metrics_source="gpm")
    return SessionHeader("2026-12-03", "host", "t", (gpu,), engine=engine, interval_s=0.1)


def run(phase: str | None, n=30, engine=True, facts: EngineFacts | None = None, hdr=None, **g) -> dict:
    """One phase of n ticks with constant readings; returns its finding (as report --json has it)."""
    return run_finding(phase, n, engine, facts, hdr, **g).to_json()


def run_finding(phase: str | None, n=30, engine=True, facts: EngineFacts | None = None, hdr=None, **g) -> at.Finding:
    """One phase of n ticks with constant readings; returns its finding."""
    hdr = hdr or header()
    gs = {"pcie_rx_Bps": 0.0, "pcie_tx_Bps": 0.0, "dram_bw_util": 0.01, "sm_util": 0.01, **g}
    samples = [
        Sample(
            1000.0 + 0.1 * i,
            (GpuSample(0, **gs),),
            EngineSample("llamacpp", True, phase=phase) if engine else None,
        )
        for i in range(n)
    ]
    an = analyze(hdr, samples)
    (f,) = at.phase_findings(hdr, an, facts)[0]
    return f


def test_ceilings_say_where_they_came_from():
    c = at.ceilings(header().gpus[0])
    assert c.pinned_Bps == pytest.approx(0.90 * CAP) and c.pinned_source.startswith("default")
    assert c.pageable_Bps == at.DEFAULT_PAGEABLE_Bps and "calibrate" in c.pageable_source
    c = at.ceilings(header(measured=60.2e9, pageable=8.9e9).gpus[0])
    assert (c.pinned_Bps, c.pinned_source) == (60.2e9, "calibrated pinned")
    assert (c.pageable_Bps, c.pageable_source) == (8.9e9, "calibrated pageable")


def test_transfer_bound_at_the_pageable_floor():
    hdr = header(measured=60e9, pageable=9e9)
    floor = at.TRANSFER_OF_PAGEABLE * 9e9
    assert run("prefill", hdr=hdr, pcie_rx_Bps=floor * 1.02)["bound"] == "transfer"
    assert run("prefill", hdr=hdr, pcie_rx_Bps=floor * 0.98)["bound"] == "host"
    # Never below 1 GB/s, whatever the ceiling.
    tiny = header(measured=60e9, pageable=1e9)
    assert run("prefill", hdr=tiny, pcie_rx_Bps=0.9e9)["bound"] == "host"


def test_pinned_host_memory_raises_the_floor():
    hdr = header(measured=60e9, pageable=9e9)
    pinned = EngineFacts("llamacpp", host_weights="x", host_pinned=True)
    rate = 7e9  # the -ngl 4/8 sessions: weights stream at ~7 GB/s from pinned memory while the CPU works
    assert run("prefill", hdr=hdr, pcie_rx_Bps=rate)["bound"] == "transfer"
    assert run("prefill", hdr=hdr, facts=pinned, pcie_rx_Bps=rate)["bound"] == "host"
    assert run("prefill", hdr=hdr, facts=pinned, pcie_rx_Bps=0.26 * 60e9)["bound"] == "transfer"


def test_pinned_whatif_prices_work_phases_not_the_load():
    """A transfer-bound prefill on pageable memory is priced at the pinned ceiling; a transfer-bound
    load is not (on the H200, -lm none loaded slower than mmap in every recorded pair)."""
    hdr = header(measured=60e9, pageable=9e9)
    prefill = run("prefill", hdr=hdr, pcie_rx_Bps=9e9)
    assert prefill["bound"] == "transfer" and prefill["whatif_pinned"]["phase_s_at_best"] < prefill["duration_s"]
    load = run("loading", hdr=hdr, pcie_rx_Bps=9e9)
    assert load["bound"] == "transfer" and "whatif_pinned" not in load


def test_a_transfer_bound_load_says_it_was_loading_and_names_no_fix():
    from pcie_tui.analyze.answer import headline

    hdr = header(measured=60e9, pageable=9e9)
    for phase, words in (("loading", "loading weights"), ("prefill", "nothing pcie-tui read from the engine")):
        f = run_finding(phase, hdr=hdr, pcie_rx_Bps=9e9)
        f.work_basis = "engine"
        h = headline(f, False)
        assert h.bound == "transfer" and h.fix is None and words in h.text, h.text
    # A lab recording without an engine says so.
    f = run_finding("h2d", hdr=hdr, engine=False, pcie_rx_Bps=9e9)
    f.work_basis = "label"
    assert "this recording has no engine facts" in headline(f, False).text


def test_host_needs_work_in_flight_else_idle():
    assert run("decode")["bound"] == "host"
    assert run("idle")["bound"] == "idle"
    assert run(None, engine=False)["bound"] == "idle"


def test_gpu_busy_below_saturation_is_memory_or_compute():
    # Batch-1 decode of a fully offloaded model on the H200: SM 0.82, DRAM 0.51 (h200-llama-full).
    assert run("decode", sm_util=0.82, dram_bw_util=0.51)["bound"] == "memory"
    assert run("prefill", sm_util=0.60, dram_bw_util=0.20)["bound"] == "compute"
    assert run("prefill", sm_util=0.49, dram_bw_util=0.39)["bound"] == "host"


def test_saturation_verdicts_are_kept():
    assert run("prefill", pcie_rx_Bps=0.9 * CAP)["bound"] == "link"
    assert run("decode", dram_bw_util=0.88)["bound"] == "memory"
    assert run("prefill", sm_util=0.95, dram_bw_util=0.16)["bound"] == "compute"


def test_a_proxy_memory_reading_never_makes_a_gpu_busy():
    hdr = header()
    hdr = dataclasses.replace(hdr, gpus=(dataclasses.replace(hdr.gpus[0], metrics_source="nvml"),))
    f = run("decode", hdr=hdr, dram_bw_util=None, mem_busy=0.9)
    assert f["bound"] == "host" and f["dram_basis"] == "proxy"


def test_llama_flags_and_environment():
    f = parse_flags(
        ["llama-server", "-ngl", "99", "--n-cpu-moe", "4", "-ub", "256", "-ot", "exps=CPU"],
        {"LLAMA_ARG_LOAD_MODE": "none"},
    )
    assert f == {
        "n_gpu_layers": 99,
        "n_cpu_moe": 4,
        "ubatch": 256,
        "override_tensor": ["exps=CPU"],
        "load_mode": "none",
    }
    fx = facts_for(
        {"kind": "llamacpp", "cmdline": ["llama-server", "--cpu-moe"], "environ": {"LLAMA_ARG_LOAD_MODE": "none"}}
    )
    assert fx.host_pinned is True and "--cpu-moe" in fx.host_weights
    fx = facts_for({"kind": "llamacpp", "cmdline": ["llama-server", "--cpu-moe", "-lm", "none", "--no-host"]})
    assert fx.host_pinned is False and "--no-host" in fx.host_memory_why
    fx = facts_for({"kind": "llamacpp", "cmdline": ["llama-server", "-ngl", "99", "--mlock"]})
    assert fx.host_weights is None and fx.host_pinned is None  # everything on the GPU: nothing to pin
    # -ngl counts the output layer (llama-model.cpp: i_gpu_start = n_layer + 1 - ngl): -ngl 16 of 16
    # layers leaves layer 0 on the CPU, -ngl 17 none.
    fx = facts_for({"kind": "llamacpp", "cmdline": ["llama-server", "-ngl", "16"], "model_meta": {"block_count": 16}})
    assert fx.host_weights == "1 of 16 layers (-ngl 16)" and fx.host_layers == 1
    fx = facts_for({"kind": "llamacpp", "cmdline": ["llama-server", "-ngl", "17"], "model_meta": {"block_count": 16}})
    assert fx.host_weights is None


def test_vllm_cpu_offload_is_named():
    fx = facts_for({"kind": "vllm", "cmdline": ["python", "-m", "vllm", "--cpu-offload-gb", "8", "-tp", "2"]})
    assert fx.tensor_parallel == 2 and "8 GiB" in fx.host_weights
    from pcie_tui.engines import FindingFacts, advise

    (a,) = advise(fx, FindingFacts(bound="link", phase="decode"))
    assert "--cpu-offload-gb" in a.fix


def test_answer_without_work_says_so():
    hdr = header()
    an = analyze(
        hdr,
        [
            Sample(
                1.0 + 0.1 * i,
                (GpuSample(0, pcie_rx_Bps=0.0, sm_util=0.0),),
                EngineSample("llamacpp", True, phase="idle"),
            )
            for i in range(20)
        ],
    )
    h = answer(hdr, an).headline
    assert h.bound == "idle" and h.phase is None and "Nothing was in flight" in h.text


def test_report_applies_this_gpus_stored_calibration(tmp_path, monkeypatch):
    """A recording made before `calibrate` ran is compared with the calibration stored since, for that GPU."""
    import json

    from pcie_tui.report.text import build_report

    rec = read_recording(DATA / "h200-llama-partial.jsonl.gz")
    g = rec.header.gpus[0]
    assert g.link.measured_Bps is None
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path))
    entry = {
        "uuid": g.uuid,
        "gen": 5,
        "width": 16,
        "max_gen": 5,
        "max_width": 16,
        "counter_Bps": 59.4e9,
        "pageable_counter_Bps": 8.9e9,
    }
    (tmp_path / "pcie-tui").mkdir()
    (tmp_path / "pcie-tui" / "calibration.json").write_text(
        json.dumps({"format": "pcie-tui/calibration", "version": 1, "gpus": {g.uuid: entry}})
    )
    rep, _ = build_report(rec)
    f = next(f for f in rep["attribution"]["findings"]["0"] if f["phase"] == "prefill")
    assert f["ceilings"]["pinned_Bps"] == 59.4e9 and f["ceilings"]["pinned_source"] == "calibrated pinned"
    assert f["ceilings"]["pageable_Bps"] == 8.9e9
    assert "applied at report time" in rep["calibration_applied"]
    # Another GPU's calibration does not apply.
    other = read_recording(DATA / "h200-llama-full.jsonl.gz")
    rep, _ = build_report(other)
    assert rep["calibration_applied"] is None


def test_a_gpu_only_session_without_phases_still_gets_an_answer():
    """Recorded on the H200 with `record --no-engine` (scripts/device_smoke.sh): pinned host->GPU
    copies for 5 s, then a device copy for 4 s, no engine and no labels. The headline must not
    say nothing was in flight; it gives the share of each bound and says what would tie it to a phase."""
    from pcie_tui.report.text import build_report

    rec = read_recording(Path(__file__).parent / "fixtures" / "h200-runs" / "smoke-gpu-only.jsonl.gz")
    h = build_report(rec)[0]["headline"]
    assert h["phase"] == "unlabelled" and h["bound"] == "link" and 0.2 < h["share"] < 0.35
    assert "link-saturated 2" in h["text"] and "memory-bound 1" in h["text"]
    assert "Nothing was in flight" not in h["text"] and "--pid" in h["text"]
    # The same session without a GPU doing anything reads as nothing in flight.
    hdr = header()
    idle = [Sample(1.0 + 0.1 * i, (GpuSample(0, pcie_rx_Bps=0.0, sm_util=0.0),)) for i in range(40)]
    assert "Nothing was in flight" in answer(hdr, analyze(hdr, idle)).headline.text


def test_an_engine_only_recording_says_what_ran_and_that_its_bound_is_unknown():
    """A recording without GPU readings (vLLM on a CPU box): the headline names the engine's work
    phases instead of "Nothing was in flight", the text report lists the engine's phases, and no
    empty what-if section is printed."""
    import io

    from rich.console import Console

    from pcie_tui.report.text import build_report, render_text

    rec = read_recording(Path(__file__).parent / "fixtures" / "vllm-cpu-session.jsonl")
    rep = build_report(rec)[0]
    h = rep["headline"]
    assert h["phase"] == "decode" and h["bound"] == "unknown" and h["share"] is None
    assert "no GPU readings" in h["text"] and "Nothing was in flight" not in h["text"]
    assert "prefill" in h["text"] and "mixed" in h["text"]
    buf = io.StringIO()
    render_text(rep, rec, Console(file=buf, width=120, color_system=None))
    text = buf.getvalue()
    assert "engine phases: loading 73.0 s" in text and "decode 10.9 s" in text
    assert "What would another link buy" not in text


def test_whatif_small_changes_keep_their_direction_and_zero_has_no_sign():
    from pcie_tui.analyze.whatif import _signed

    assert _signed(-0.01) == "-0.01%" and _signed(0.04) == "+0.04%" and _signed(-0.0) == "±0.0%"
    assert _signed(0.004) == "±0.0%" and _signed(-0.004) == "±0.0%" and _signed(-0.051) == "-0.1%"
    assert _signed(-12.94) == "-12.9%" and _signed(2.96) == "+3.0%"


def test_tui_headline_without_phases_or_gpus():
    """GPU-only watch with no phases: the saturation line (not the unlabelled share summary, whose
    evidence is for idle ticks); engine alone in a work phase: says the bound is unknown."""
    from pcie_tui.tui.headline import headline_text
    from pcie_tui.tui.state import ViewModel

    rec = read_recording(Path(__file__).parent / "fixtures" / "h200-runs" / "smoke-gpu-only.jsonl.gz")
    vm = ViewModel(rec.header)
    samples = list(rec.samples)
    link_tick = next(i for i, s in enumerate(samples) if (s.gpus[0].pcie_rx_Bps or 0) > 50e9) + 25
    vm.rebuild(samples, link_tick)
    assert "LINK SATURATED" in (headline_text(vm) or "")
    eng = read_recording(Path(__file__).parent / "fixtures" / "vllm-cpu-session.jsonl")
    vm = ViewModel(eng.header)
    for s in eng.samples:
        vm.feed(s)
        if vm.phase == "decode":
            break
    assert headline_text(vm) == "decode · no GPU readings (engine alone): what holds it back is unknown"


def test_a_link_rate_above_the_default_ceiling_says_calibrate():
    from pcie_tui.analyze.answer import evidence_text

    f = run_finding("prefill", pcie_rx_Bps=59.9e9)  # above 0.90 x 63.0 GB/s
    assert f.bound == "link" and "`pcie-tui calibrate` measures this link's own ceiling" in evidence_text(f)
    f = run_finding("prefill", hdr=header(measured=60.1e9), pcie_rx_Bps=59.9e9)
    assert "calibrate" not in evidence_text(f).replace("calibrated", "")


def test_report_engine_section_states_placement_and_keeps_one_unit_per_line():
    import io

    from rich.console import Console

    from pcie_tui.report.text import build_report, render_text

    rec = read_recording(DATA / "h200-pageable.jsonl.gz")
    rep = build_report(rec)[0]
    buf = io.StringIO()
    render_text(rep, rec, Console(file=buf, width=200, color_system=None))
    text = buf.getvalue()
    assert "Engine llamacpp  requests 3\n" in text
    # a quantile line with a value over 1 s is in seconds throughout (was "2423.6 ms")
    assert "decode                2.42 / 2.47 / 2.47 s (p50/p95/p99)" in text
    assert "inter-token latency   38.5 / 39.1 / 39.2 ms" in text
    assert "in host memory: FFN weights of 12 layers (--n-cpu-ffn 12) (load mode auto = mmap" in text
    assert "engine said: " in text and "consider using --load-mode none" in text


def test_the_final_code_on_the_h200_matches_the_timed_copies():
    """`record --no-engine` on the H200 with this session's code (scripts/device_smoke.sh,
    2026-12-04; files in fixtures/h200-runs/smoke-20261204/): torch's pinned host->GPU copies
    (timed 55.4 GB/s of payload) read as link-saturated, the device copy (4.29 TB/s) as
    memory-bound, the idle tail as no verdict. Windows from the traffic log's start times."""
    import re

    from pcie_tui.analyze.session import SessionAnalyzer

    d = Path(__file__).parent / "fixtures" / "h200-runs" / "smoke-20261204"
    starts = {m[1]: float(m[2]) for m in re.finditer(r"traffic (\w+) ([\d.]+) ", (d / "smoke-log.txt").read_text())}
    rec = read_recording(d / "smoke.jsonl.gz")
    an = SessionAnalyzer(rec.header)
    seen: dict[str, list[tuple[str, float]]] = {"h2d": [], "d2d": []}
    for s in rec.samples:
        an.feed(s)
        g = s.gpus[0]
        # 1 s in from the start (the verdict's enter hold over NVML's averaging window), 0.5 s before the end.
        if starts["h2d_pinned"] + 1.0 <= s.t <= starts["h2d_pinned"] + 4.5:
            seen["h2d"].append((an.verdict(0), g.pcie_rx_Bps or 0.0))
        if starts["d2d_copy"] + 1.0 <= s.t <= starts["d2d_copy"] + 3.5:
            seen["d2d"].append((an.verdict(0), g.dram_bw_util or 0.0))
    assert len(seen["h2d"]) >= 30 and len(seen["d2d"]) >= 20
    assert sum(v == "link" for v, _ in seen["h2d"]) >= 0.9 * len(seen["h2d"])
    rates = sorted(r for _, r in seen["h2d"])
    assert 55e9 <= rates[len(rates) // 2] <= 61e9  # payload 55.4 GB/s, plus the link's protocol overhead
    assert sum(v == "memory" for v, _ in seen["d2d"]) >= 0.9 * len(seen["d2d"])
    assert sorted(u for _, u in seen["d2d"])[len(seen["d2d"]) // 2] >= 0.8  # 4.29 TB/s of 4.8 peak
    h = build_report_json(rec)["headline"]
    assert h["bound"] == "link" and "link-saturated" in h["text"] and "memory-bound" in h["text"]


def build_report_json(rec):
    from pcie_tui.report.text import build_report

    return build_report(rec)[0]


def test_report_headline_above_a_default_ceiling_says_to_calibrate():
    from pcie_tui.recording import demos
    from pcie_tui.report.text import build_report

    probe, _ = build_report(read_recording(demos.resolve("h200-probe")))
    line1, line2 = probe["headline"]["text"].split("\n")
    # The probe read 59.9 GB/s, above the 56.7 GB/s default: its highest reading is the ceiling
    # (nothing reads above 100 %), and the second line says so and what measures the link's own.
    assert "= 100% of 60.1 GB/s pinned (observed)" in line1 and "106%" not in probe["headline"]["text"]
    assert line2.endswith(
        "it read above the default ceiling, so its highest reading is the ceiling: "
        "`pcie-tui calibrate` measures this link's own ceiling."
    )
    # Against a calibrated ceiling the same words never appear (h200-pinned: 83 % of 60.2 GB/s calibrated).
    pinned, _ = build_report(read_recording(demos.resolve("h200-pinned")))
    assert "(calibrated)" in pinned["headline"]["text"] and "calibrate`" not in pinned["headline"]["text"]


def test_a_session_without_phases_gets_no_empty_what_held_section():
    """GPU-only (record --no-engine on the H200): the headline says there are no phases to tie a
    bound to; the report then lists no "What held each phase back" header with nothing under it."""
    import io

    from rich.console import Console

    from pcie_tui.report.text import build_report, render_text

    rec = read_recording(Path(__file__).parent / "fixtures" / "h200-runs" / "smoke-gpu-only.jsonl.gz")
    rep, _ = build_report(rec)
    buf = io.StringIO()
    render_text(rep, rec, Console(file=buf, width=160, color_system=None))
    text = buf.getvalue()
    assert text.startswith("No phases to tie it to") and "What held each phase back" not in text
    # A session with phases keeps the section.
    pageable = read_recording(Path(__file__).parents[1] / "pcie_tui" / "data" / "h200-pageable.jsonl.gz")
    rep, _ = build_report(pageable)
    buf = io.StringIO()
    render_text(rep, pageable, Console(file=buf, width=160, color_system=None))
    assert "What held each phase back" in buf.getvalue()
