"""linkmodel against a recording: every missing comparison says why, layouts must match, and the report
reads a model file only when it is verifiably the one the recording ran."""

from __future__ import annotations

import argparse
import dataclasses
import json
import socket
from pathlib import Path

import pytest

from pcie_tui.analyze import linkmodel as lm
from pcie_tui.analyze import linkmodel_report as lmr
from pcie_tui.core.model import EngineSample, GpuInfo, GpuSample, LinkInfo, Sample, SessionHeader, pcie_capacity_Bps
from pcie_tui.doctor.cli import linkmodel_main

REPO = Path(__file__).resolve().parents[1]


def _cli(argv: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str, str]:
    from pcie_tui.cli.main import main

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


# ---- 4: the report's model: header facts, or a local file verifiably the same ------------------


def _gguf_engine(path: str, meta: dict | None) -> dict:
    eng = {"kind": "llamacpp", "layout": {"model": path}, "model": path}
    if meta is not None:
        eng["model_meta"] = meta
    return eng


def _tiny_gguf(path: Path, hidden: int = 256, layers: int = 2) -> dict:
    """A small GGUF file, and the ``model_meta`` llama-server's client would have kept for it."""
    gguf = pytest.importorskip("gguf")
    np = pytest.importorskip("numpy")
    w = gguf.GGUFWriter(str(path), "llama")
    w.add_embedding_length(hidden)
    w.add_block_count(layers)
    w.add_tensor("token_embd.weight", np.zeros((4, 256), dtype=np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return {"file_bytes": path.stat().st_size, "arch": "llama", "embedding_length": hidden, "block_count": layers}


def test_report_reads_a_gguf_that_matches_the_facts_the_header_kept(tmp_path):
    f = tmp_path / "model.gguf"
    meta = _tiny_gguf(f)
    # Another host, a file written after the recording: its size and metadata still prove it.
    header, samples = _session(engine=_gguf_engine(str(f), meta), host="the-recording-host")
    rep = lmr.report_linkmodel(header, samples)
    assert rep["available"] is True, rep.get("reason")
    assert (rep["model"]["hidden_size"], rep["model"]["num_layers"], rep["model"]["dtype_bytes"]) == (256, 2, 4)
    assert rep["comparison_reason"] is None


def test_report_does_not_read_a_gguf_whose_metadata_differs(tmp_path):
    f = tmp_path / "model.gguf"
    meta = _tiny_gguf(f, hidden=512)  # same size as hidden=256: only the metadata tells them apart
    header, samples = _session(engine=_gguf_engine(str(f), dict(meta, embedding_length=256)))
    rep = lmr.report_linkmodel(header, samples)
    # The file is not read; the header's own record of the model that ran prices it instead.
    assert rep["model_file_reason"] == (
        f"the model was not read: {f} here has embedding_length 512, the recording's header says 256: another model"
    )
    assert rep["available"] is True and rep["model"]["hidden_size"] == 256
    assert rep["source"] == "model shape from the recording's header (n_embd 256, 2 layers)"
    no_shape = dict(meta, embedding_length=256)
    del no_shape["block_count"]
    header, samples = _session(engine=_gguf_engine(str(f), no_shape))
    rep = lmr.report_linkmodel(header, samples)
    assert rep["available"] is False
    assert rep["reason"].startswith("the model was not read: ") and rep["reason"].endswith(
        "; the header has no n_layer"
    )


def test_report_does_not_read_a_model_file_of_another_host(tmp_path):
    f = tmp_path / "model.gguf"
    _tiny_gguf(f)  # a readable GGUF, but the header keeps nothing to tell it from the model that ran
    header, samples = _session(engine=_gguf_engine(str(f), None), host="the-recording-host")
    rep = lmr.report_linkmodel(header, samples)
    assert rep["available"] is False
    assert rep["reason"].startswith("the model was not read: the recording was made on host 'the-recording-host'")


def test_report_reads_a_same_host_model_unchanged_since_the_recording(tmp_path):
    import os

    d = tmp_path / "tiny"
    d.mkdir()
    (d / "config.json").write_text(json.dumps({"hidden_size": 256, "num_hidden_layers": 2}))
    engine = {"kind": "vllm", "layout": {"model": str(d)}}
    header, samples = _session(engine=engine, host=socket.gethostname())
    assert "config.json was modified" in lmr.report_linkmodel(header, samples)["reason"]
    os.utime(d / "config.json", (1e9, 1e9))  # 2001: before the recording began
    rep = lmr.report_linkmodel(header, samples)
    assert rep["available"] is True and rep["model"]["hidden_size"] == 256
    elsewhere = dataclasses.replace(header, host="the-recording-host")
    assert "keeps nothing about the model but its path" in lmr.report_linkmodel(elsewhere, samples)["reason"]


def test_report_does_not_read_a_model_changed_since_the_recording(tmp_path):
    f = tmp_path / "model.gguf"
    f.write_bytes(b"GGUF" + b"\0" * 64)  # written now, after the recording of 2026-12-02
    header, samples = _session(engine=_gguf_engine(str(f), None), host=socket.gethostname())
    rep = lmr.report_linkmodel(header, samples)
    assert rep["available"] is False and "after the recording began" in rep["reason"]


def test_report_does_not_read_a_gguf_of_another_size(tmp_path):
    import os

    f = tmp_path / "model.gguf"
    f.write_bytes(b"GGUF" + b"\0" * 64)
    os.utime(f, (1e9, 1e9))
    meta = {"file_bytes": 999, "arch": "llama", "embedding_length": 4096, "block_count": 16}
    for host in (socket.gethostname(), "the-recording-host"):
        header, samples = _session(engine=_gguf_engine(str(f), meta), host=host)
        rep = lmr.report_linkmodel(header, samples)
        assert "is 68 bytes, the recording's header says 999: another file" in rep["model_file_reason"]
        assert rep["available"] is True and rep["model"]["hidden_size"] == 4096  # from the header


def test_report_does_not_read_a_relative_model_path():
    header, samples = _session(engine=_gguf_engine("model.gguf", None), host=socket.gethostname())
    assert "not an absolute path" in lmr.report_linkmodel(header, samples)["reason"]


def test_report_json_documents_the_reasoned_object():
    doc = (REPO / "docs" / "report-json.md").read_text()
    row = next(ln for ln in doc.splitlines() if ln.startswith("| `linkmodel`"))
    assert "`available`" in row and "`reason`" in row and "null" not in row
