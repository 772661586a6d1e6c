"""linkmodel against a recording: every missing comparison says why, layouts must match (or the comparison is refused
with the reason)."""

from __future__ import annotations

import argparse
import dataclasses
import json
from pathlib import Path

import pytest

from pcie_tui.analyze import linkmodel as lm
from pcie_tui.doctor.cli import linkmodel_main
from pcie_tui.model import EngineSample, GpuInfo, GpuSample, LinkInfo, Sample, SessionHeader, pcie_capacity_Bps

REPO = Path(__file__).resolve().parents[1]


def _cli(argv: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str, str]:
    from pcie_tui.cli import main

    try:
        rc = main(argv)
    except SystemExit as e:
        rc = int(e.code or 0)
    cap = capsys.readouterr()
    return rc, cap.out, cap.err


def _session(
    n_gpus: int = 1,
    phase: str = "decode",
    engine: dict | None = None,
    host: str = "elsewhere",
    created: str = "2026-12-02T10:00:00+00:00",
) -> tuple[SessionHeader, list[Sample]]:
    link = LinkInfo(4, 16, 4, 16, pcie_capacity_Bps(4, 16))
    gpus = tuple(GpuInfo(i, f"GPU-{i}", "g", f"0000:0{i}:00.0", link, None) for i in range(n_gpus))
    header = SessionHeader(created, host, "t", gpus, engine=engine)
    samples = [
        Sample(
            1000.0 + k * 0.1,
            tuple(GpuSample(i, pcie_tx_Bps=1e9, pcie_rx_Bps=1e9) for i in range(n_gpus)),
            EngineSample("llamacpp", True, phase=phase, prompt_tokens_total=0.0, generation_tokens_total=k * 10.0),
        )
        for k in range(20)
    ]
    return header, samples


# ---- 1: no comparison always says why ------------------------------------------------------


def test_recording_without_prefill_or_decode_ticks_says_why(capsys):
    rc, out, _ = _cli(["linkmodel", "--hidden", "2048", "--layers", "16", "--recording", "h200-reference"], capsys)
    assert rc == 0
    line = out.strip().splitlines()[-1]
    assert line.startswith("recording: no comparison: the recording has no prefill or decode ticks")
    assert "h2d_pinned" in line
    rc, out, _ = _cli(
        ["linkmodel", "--hidden", "2048", "--layers", "16", "--recording", "h200-reference", "--json"], capsys
    )
    got = json.loads(out)
    assert got["comparison"] == {} and "no prefill or decode ticks" in got["comparison_reason"]


def test_a_missing_phase_is_named_and_a_present_one_compared():
    header, samples = _session(n_gpus=2, engine=None)
    pred = lm.predict(lm.ModelShape(256, 2, 2), lm.Layout(tp=2), 25e9)
    pred["ceiling_label"] = "given"
    lm.compare_with_recording(pred, lm.Layout(tp=2), header, samples)
    assert pred["comparison_reason"] is None and list(pred["comparison"]) == ["decode"]
    from pcie_tui.doctor.cli import render_linkmodel

    text = render_linkmodel(pred)
    assert "recording prefill: no comparison: the recording has no prefill ticks" in text
    assert "recording decode GPU0:" in text


# ---- 2: a recording of another layout is not compared -----------------------------------------


def test_tp2_model_against_a_single_gpu_recording_refuses_the_ratio(capsys):
    rc, out, _ = _cli(
        ["linkmodel", "--hidden", "8192", "--layers", "80", "--tp", "2", "--recording", "h200-pinned"], capsys
    )
    assert rc == 0
    assert "(x" not in out and "vs predicted" not in out
    assert "recording: no comparison: the recording's llamacpp ran TP=1 PP=1 on 1 GPU, the model is TP=2 PP=1" in out
    # The same recording with the layout it ran still compares.
    rc, out, _ = _cli(["linkmodel", "--hidden", "4096", "--layers", "16", "--recording", "h200-pinned"], capsys)
    assert rc == 0 and "recording decode GPU0: measured" in out and "no comparison" not in out


def test_layout_mismatch_from_the_engine_flags_or_the_gpu_count():
    vllm_tp2 = {"kind": "vllm", "layout": {"tensor_parallel_size": 2}}
    header, _ = _session(n_gpus=2, engine=vllm_tp2)
    assert lm.layout_mismatch(header, lm.Layout(tp=2)) is None
    assert "ran TP=2 PP=1 on 2 GPUs, the model is TP=4 PP=1" in (lm.layout_mismatch(header, lm.Layout(tp=4)) or "")
    assert "ran TP=2 PP=1" in (lm.layout_mismatch(header, lm.Layout(tp=1, pp=2)) or "")
    # No engine layout: only the GPU count can rule a layout out.
    bare, _ = _session(n_gpus=1, engine=None)
    assert "watched 1 GPU, TP=2 PP=1 needs 2 GPUs" in (lm.layout_mismatch(bare, lm.Layout(tp=2)) or "")
    assert lm.layout_mismatch(bare, lm.Layout()) is None


def test_linkmodel_main_direct_call_keeps_the_json_keys(capsys):
    args = argparse.Namespace(
        model=None,
        gguf=None,
        hidden=64,
        layers=2,
        dtype_bytes=None,
        tp=1,
        pp=1,
        batch=1,
        prompt_tokens=16,
        link="4x16",
        ceiling_gbps=None,
        latency_us=25.0,
        recording="h200-reference",
        json=True,
    )
    assert linkmodel_main(args) == 0
    got = json.loads(capsys.readouterr().out)
    assert {"measured", "comparison", "comparison_reason"} <= got.keys()


def test_headers_without_engine_layout_do_not_claim_one():
    header, _ = _session(n_gpus=2, engine={"kind": "vllm"})
    assert lm.recorded_parallelism(header) is None
    assert lm.recorded_parallelism(dataclasses.replace(header, engine=None)) is None
