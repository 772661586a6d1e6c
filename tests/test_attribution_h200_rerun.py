"""The same answers from a second day's H200 run, recorded after the engines/ refactor.

scripts/device_attrib.sh on 2026-12-04 (SESSIONS=pageable,pinned,hostdecode): a fresh CUDA
llama-server build, a fresh `calibrate`, `pcie-tui record --pid` attached at server start and
covering every request, beside a GPU-only recorder. Files in
tests/fixtures/h200-runs/rerun-20261204/ (recordings, truth files with the server's own timings,
the recorders' stderr, calibrate's output, the live TUI's screenshot mid-prefill). The bundled
demos of the first day pin the same answers in tests/test_attribution_h200.py; this checks that
they were not luck of one run and that the refactored attach still gets them.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from pcie_tui.recording.reader import read_recording
from pcie_tui.report.text import build_report

RUN = Path(__file__).parent / "fixtures" / "h200-runs" / "rerun-20261204"


def report(name: str) -> dict:
    rep, _ = build_report(read_recording(RUN / f"h200-{name}.jsonl.gz"))
    return rep


def truth(name: str) -> list[dict]:
    return json.loads((RUN / f"h200-{name}.truth.json").read_text())["truth"]


def finding(rep: dict, phase: str) -> dict:
    return next(f for f in rep["attribution"]["findings"]["0"] if f["phase"] == phase)


def advice(f: dict) -> str:
    return " ".join(f"{a['cause']} {a['fix'] or ''} {' '.join(a['evidence'])}" for a in f["advice"])


def test_pageable_prefill_is_transfer_bound_again_with_the_same_fix():
    rep = report("pageable")
    f = finding(rep, "prefill")
    assert f["bound"] == "transfer" and f["shares"]["transfer"] > 0.9
    c = f["ceilings"]
    assert (c["pinned_source"], c["pageable_source"]) == ("calibrated pinned", "calibrated pageable")
    assert f["link_of_pinned"] < 0.25 and f["sm_util"] < 0.05
    text = advice(f)
    assert "-lm none" in text and "consider using --load-mode none" in text
    assert (rep["headline"]["phase"], rep["headline"]["bound"]) == ("prefill", "transfer")


def test_the_pinned_prediction_holds_on_the_rerun():
    pred = finding(report("pageable"), "prefill")["whatif_pinned"]
    pinned = report("pinned")
    n = sum(1 for r in truth("pinned") if r["label"] == "prefill")
    real = finding(pinned, "prefill")["duration_s"] / n
    assert pred["phase_s_at_best"] <= real <= pred["phase_s_no_overlap"]
    # The server's own prompt-eval times agree with the phase the recorder saw.
    server = [r["prompt_ms"] / 1000 for r in truth("pinned") if r["label"] == "prefill"]
    assert real == pytest.approx(sum(server) / n, rel=0.15)


def test_the_load_is_not_priced_pinned_because_pinned_loads_were_slower():
    pageable, pinned = report("pageable"), report("pinned")
    load = finding(pageable, "loading")
    assert load["bound"] == "transfer" and "whatif_pinned" not in load  # 57 % transfer-bound, yet unpriced
    assert finding(pinned, "loading")["duration_s"] > load["duration_s"]  # the fact behind it
    row = next(s for s in pageable["whatif"]["gpus"][0]["scenarios"] if s["kind"] == "pinned")
    assert row["phases"]["loading"]["time_ratio"] == pytest.approx(1.0)
    assert row["phases"]["prefill"]["time_ratio"] < 0.25


def test_pinned_prefill_is_link_saturated_and_decode_host_bound():
    rep = report("pinned")
    assert finding(rep, "prefill")["bound"] == "link" and finding(rep, "prefill")["link_Bps"] > 40e9
    for name in ("pageable", "pinned"):
        assert finding(report(name), "decode")["bound"] == "host"


def test_partial_offload_decode_is_host_bound_with_the_layer_count():
    rep = report("hostdecode")
    assert (rep["headline"]["phase"], rep["headline"]["bound"]) == ("decode", "host")
    assert "13 of 16 layers (-ngl 4)" in advice(finding(rep, "decode"))  # -ngl counts the output layer


@pytest.mark.parametrize("name", ["pageable", "pinned", "hostdecode"])
def test_every_request_was_recorded_with_the_servers_token_counts(name):
    rep, t = report(name), truth(name)
    e = rep["engine"]
    assert e["requests"] == len(t)
    assert e["prompt_tokens"] == sum(r["prompt_n"] for r in t) == sum(r["sent_prompt_ids"] for r in t)
    assert e["generation_tokens"] == sum(r["predicted_n"] for r in t)
    stderr = (RUN / f"{name}-record.txt").read_text()
    assert "attached to" in stderr and "Traceback" not in stderr


def test_moe_experts_in_pageable_memory_again_transfer_bound_with_the_load_mode_fix():
    """Run 2 (another H200 host, its own calibrate: 60.2 GB/s pinned, 9.8 GB/s pageable)."""
    rep = report("moe-pageable")
    f = finding(rep, "prefill")
    assert f["bound"] == "transfer" and f["shares"]["transfer"] > 0.9 and f["link_of_pinned"] < 0.25
    text = advice(f)
    assert "--cpu-moe" in text and "-lm none" in text and "consider using --load-mode none" in text
    assert (rep["headline"]["phase"], rep["headline"]["bound"]) == ("prefill", "transfer")


def test_moe_pinned_runs_near_the_link_and_the_prediction_holds_at_the_engines_copy_rate():
    """The pinned MoE prefill moves experts at 79 % of the calibrated pinned ceiling (47.6 of 60.2
    GB/s). The what-if's at-best end (copies at the ceiling, hidden) is below every real prompt; its
    no-overlap end (copies at ENGINE_COPY_SHARE of the ceiling, not hidden) covers the phase."""
    pinned = finding(report("moe-pinned"), "prefill")
    assert pinned["bound"] in ("link", "transfer") and pinned["link_of_pinned"] > 0.7
    assert "-ub 512" in advice(pinned) and "-lm none" not in (pinned["advice"][0]["fix"] or "")
    pred = finding(report("moe-pageable"), "prefill")["whatif_pinned"]
    server = [r["prompt_ms"] / 1000 for r in truth("moe-pinned") if r["label"] == "prefill"]
    real = pinned["duration_s"] / len(server)
    assert pred["phase_s_at_best"] < min(server) and pred["phase_s_at_best"] <= real <= pred["phase_s_no_overlap"]
    # The server's slower prompt (the first, 1.87 s) is within 5 % of the no-overlap end.
    assert max(server) < 1.05 * pred["phase_s_no_overlap"]


def test_run3_pageable_on_a_third_host_gives_the_same_answer_and_counts():
    """Run 3 (a third H200 host, the final code of this stop): the same flags, the same answer."""
    rep = report("pageable-run3")
    f = finding(rep, "prefill")
    assert f["bound"] == "transfer" and f["shares"]["transfer"] > 0.9 and f["link_of_pinned"] < 0.25
    assert "-lm none" in advice(f) and "consider using --load-mode none" in advice(f)
    assert (rep["headline"]["phase"], rep["headline"]["bound"]) == ("prefill", "transfer")
    e, t = rep["engine"], truth("pageable-run3")
    assert e["requests"] == len(t) and e["prompt_tokens"] == sum(r["prompt_n"] for r in t)
    assert e["generation_tokens"] == sum(r["predicted_n"] for r in t)


def test_facts_that_came_after_the_header_reach_report_replay_live_and_export():
    """Run 3's recorder wrote its header 0.1 s into the load, before llama-server logged "consider
    using --load-mode none"; the engine_ready event 1.5 s later carries the complete load log.
    The report, the TUI (replay, and live through note_events) and the exporter all use it."""
    from pcie_tui.engines import engine_info, facts_for
    from pcie_tui.export.prometheus import ExportState
    from pcie_tui.tui.state import ViewModel

    rec = read_recording(RUN / "h200-pageable-run3.jsonl.gz")
    warn = "consider using --load-mode none"
    assert not any(warn in x for x in facts_for(rec.header.engine).log_evidence)  # the header alone
    assert any(warn in x for x in facts_for(engine_info(rec.header.engine, rec.events)).log_evidence)
    assert warn in advice(finding(report("pageable-run3"), "prefill"))
    assert any(warn in x for x in ViewModel(rec.header, events=rec.events).analysis.facts.log_evidence)
    live = ViewModel(rec.header)
    assert not any(warn in x for x in live.analysis.facts.log_evidence)
    live.note_events([e for e in rec.events if e.get("event") == "engine_ready"])
    assert any(warn in x for x in live.analysis.facts.log_evidence)
    ex = ExportState()
    ex.start(rec.header, "replay", "run3", rec.events)
    assert any(warn in x for x in ex.analysis.facts.log_evidence)


def test_engine_info_keeps_header_keys_and_ignores_another_engine():
    from pcie_tui.engines import engine_info

    head = {"kind": "llamacpp", "cmdline": ["llama-server"], "load_log": {"complete": False}}
    ready = {"event": "engine_ready", "engine": {"kind": "llamacpp", "load_log": {"complete": True}, "model": None}}
    other = {"event": "engine_ready", "engine": {"kind": "vllm", "cmdline": ["vllm"]}}
    got = engine_info(head, [ready, other, {"event": "engine_gap"}])
    assert got == {"kind": "llamacpp", "cmdline": ["llama-server"], "load_log": {"complete": True}}
    assert engine_info(None, []) is None and engine_info(head, []) == head
