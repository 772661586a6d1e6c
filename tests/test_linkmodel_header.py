"""The link budget from what was recorded (issue 21): ``report`` prices the recording's model from the
shape its header kept when the model file is not here, says which source it used, names what the header
lacks instead of guessing, and prices llama-server's host weights from its command line. The numbers are
checked against hand arithmetic (in each test's docstring) on bundled H200 sessions."""

from __future__ import annotations

import dataclasses
import json
import math
from pathlib import Path

import pytest

from pcie_tui.analyze import linkmodel_report as lmr
from pcie_tui.analyze.linkmodel_header import header_shape, missing_words
from pcie_tui.doctor.cli import render_linkmodel
from pcie_tui.recording import demos
from pcie_tui.recording.reader import read_recording

ROOT = Path(__file__).resolve().parents[1]
MLOCK = ROOT / "tests" / "fixtures" / "h200-runs" / "engine-truth-20261206" / "mlock.jsonl.gz"
GEN5_X16_Bps = 32e9 * 16 * 128 / 130 / 8  # the headers' capacity_Bps: 63.015 GB/s per direction


def _report_json(name: str, capsys: pytest.CaptureFixture[str]) -> dict:
    from pcie_tui.cli.main import main

    assert main(["report", name, "--json"]) == 0
    return json.loads(capsys.readouterr().out)


def _linkmodel(path: str | Path) -> dict:
    rec = read_recording(demos.resolve(str(path)) if not Path(path).exists() else Path(path))
    return lmr.report_linkmodel(rec.header, rec.samples)


def test_h200_llama_partial_prices_its_host_ffn_by_hand(capsys):
    """h200-llama-partial: llama-server with ``--n-cpu-ffn 12`` and, last on its command line, ``-b 128
    -ub 128``; its header's model_shape: n_embd 4096, n_ff 11008, 16 layers, f16; no GGUF here.

    FFN of one layer: 3 matrices (ffn_gate, ffn_up, ffn_down) x 4096 x 11008 = 135,266,304 weights
        x 2 B (f16) = 270,532,608 B per layer
    12 layers on the host: 12 x 270,532,608 = 3,246,391,296 B, copied once per micro-batch
    micro-batch min(-ub 128, -b 128) = 128 tokens:
        per prompt token  3,246,391,296 / 128 = 25,362,432 B (2,113,536 B per token per layer)
        a 2048-token prefill step: 2048 / 128 = 16 micro-batches x 3,246,391,296 = 51,942,260,736 B
        on the 63.015 GB/s Gen5 x16 link (theoretical: no calibration in this header): 0.8243 s
    decode: one token per step, below the op offload minimum of 32: no weight crosses; TP=1 PP=1: no
    inter-GPU bytes. So 0 B predicted per generated token.
    Measured (the report's own count): 25.9 MB per prompt token, x1.02.
    """
    lm = _report_json("h200-llama-partial", capsys)["linkmodel"]
    assert lm["available"] is True
    assert lm["source"] == "model shape from the recording's header (n_embd 4096, n_ff 11008, 16 layers, f16)"
    assert lm["model_file_reason"] == "cannot read GGUF /tmp/llb/model.gguf: no such file"
    host = lm["host_weights"]
    assert host["what"] == "FFN weights of 12 layers (--n-cpu-ffn 12)"
    assert host["arithmetic"] == "12 x 3 x 4096 x 11008 x 2 B"
    per_layer = 3 * 4096 * 11008 * 2
    assert per_layer == 270_532_608
    assert host["bytes_per_microbatch"] == 12 * per_layer == 3_246_391_296
    assert (host["ubatch"], host["ubatch_source"]) == (128, "-ub 128")
    assert host["prefill_bytes_per_token"] == 3_246_391_296 / 128 == 25_362_432 == 12 * 2_113_536
    assert (lm["layout"]["tp"], lm["layout"]["pp"], lm["tp_bytes_per_token"], lm["pp_bytes_per_token"]) == (1, 1, 0, 0)
    assert lm["prefill"]["bytes_per_step"] == 16 * 3_246_391_296 == 51_942_260_736
    assert lm["ceiling_Bps"] == pytest.approx(GEN5_X16_Bps)
    assert (
        lm["prefill"]["link_time_s"] == pytest.approx(51_942_260_736 / GEN5_X16_Bps) == pytest.approx(0.8243, abs=1e-4)
    )
    assert lm["decode"]["bytes_per_token"] == 0 and lm["decode"]["bytes_per_step"] == 0
    row = lm["comparison"]["prefill"]["0"]
    assert row["predicted_bytes_per_token"] == 25_362_432
    assert row["ratio"] == pytest.approx(row["measured_bytes_per_token"] / 25_362_432)
    assert 1.0 < row["ratio"] < 1.05  # counters include protocol overhead and each prompt's last, partial micro-batch
    assert lm["comparison"]["decode"]["0"]["ratio"] is None  # nothing predicted: no ratio against zero
    text = render_linkmodel(lm)
    assert "12 x 3 x 4096 x 11008 x 2 B = 3.25 GB per micro-batch, 25.4 MB per prompt token" in text
    assert "recording prefill GPU0: measured 25.9 MB/token vs predicted 25.4 MB/token (x1.02)" in text
    assert "no weight crosses in decode" in text


def test_h200_llama_full_every_weight_on_the_gpu_predicts_no_weight_traffic(capsys):
    """h200-llama-full: the same model (header model_shape n_embd 4096, n_ff 11008, 16 layers, f16) with
    ``-ngl 999``: 999 >= 16 repeating layers + the output layer, so no layer stays on the CPU; no
    --n-cpu-ffn, -ot or MoE flag. Host weights: 0 layers x anything = 0 B per micro-batch (-ub 512).
    One GPU (TP=1, PP=1): 2 x 16 x 2(1-1)/1 x 4096 x 4 = 0 B of all-reduce per token, no stage boundary.
    Predicted: 0 B per prompt token and per generated token, so no ratio; the measured bytes
    (41.3 kB per prompt token: embeddings in, logits out, the counters' floor) are shown as what the
    budget does not price. That is 1/600 of h200-llama-partial's 25.4 MB.
    """
    lm = _report_json("h200-llama-full", capsys)["linkmodel"]
    assert lm["available"] is True
    assert lm["source"] == "model shape from the recording's header (n_embd 4096, n_ff 11008, 16 layers, f16)"
    assert (lm["model"]["hidden_size"], lm["model"]["num_layers"], lm["model"]["dtype_bytes"]) == (4096, 16, 4)
    assert lm["host_weights"]["what"] is None and lm["host_weights"]["bytes_per_microbatch"] == 0
    assert lm["tp_bytes_per_token"] == 2 * 16 * 2 * (1 - 1) / 1 * 4096 * 4 == 0
    for ph in ("prefill", "decode"):
        assert lm[ph]["bytes_per_token"] == 0 and lm[ph]["bytes_per_step"] == 0
        assert lm["comparison"][ph]["0"]["ratio"] is None
    assert lm["comparison"]["prefill"]["0"]["measured_bytes_per_token"] == pytest.approx(41_344, rel=1e-3)
    text = render_linkmodel(lm)
    assert "host weights: none (every weight is in GPU memory)" in text
    assert "measured 41.3 kB/token over 56128 tokens (host<->GPU traffic the budget does not price" in text


def test_the_report_text_says_which_source_it_used(capsys):
    from pcie_tui.cli.main import main

    assert main(["report", "h200-llama-partial"]) == 0
    out = " ".join(capsys.readouterr().out.split())
    assert "Link budget model model shape from the recording's header (n_embd 4096, n_ff 11008, 16 layers, f16)" in out
    doc = " ".join((ROOT / "docs" / "doctor.md").read_text().split())
    quoted = (
        "model shape from the recording's header (n_embd 4096, n_ff 11008, 16 layers, f16), 4 B/activation; "
        "the model file was not read: cannot read GGUF /tmp/llb/model.gguf: no such file"
    )
    assert quoted in doc and quoted in out


@pytest.mark.parametrize(
    ("demo", "reason"),
    [
        (
            "h200-pageable",
            "the header has no n_ff and no dtype: needed to price FFN weights of 12 layers (--n-cpu-ffn 12), "
            "which cross the link once per micro-batch (-ub 128)",
        ),
        (
            "h200-llama-ngl4",
            "the header has no n_head_kv: needed to price 13 of 16 layers (-ngl 4), "
            "which cross the link once per micro-batch (-ub 512)",
        ),
        (
            "h200-ngl8",
            "the header has no n_ff, n_head, n_head_kv or dtype: needed to price 9 of 16 layers (-ngl 8), "
            "which cross the link once per micro-batch (-ub 512)",
        ),
    ],
)
def test_what_the_header_lacks_is_named_never_guessed(demo, reason):
    got = _linkmodel(demo)
    assert got == {"available": False, "reason": reason}


def test_moe_experts_in_host_memory_are_not_priced():
    got = _linkmodel("h200-moe-pinned")
    assert got["available"] is False
    assert "copied only as far as a micro-batch's tokens route to them" in got["reason"]
    assert got["reason"].endswith("(host weights: all MoE experts (--cpu-moe))")


def test_whole_host_layers_by_hand_against_a_real_ngl4_run():
    """The ``-ngl 4 -lm mlock`` run of 2026-12-06 (same model; its header's model_meta, recorded before
    n_ff was kept, has n_embd 4096 and 16 layers): add the shape the model has, n_ff 11008, n_head 32,
    n_head_kv 32 (the GGUF's size, 6480804800 B, fits MHA), f16.

    -ngl 4 counts the output layer: 3 repeating layers on the GPU, 16 - 3 = 13 on the CPU
    one layer: 3 x 4096 x 11008 (FFN) + 2 x 4096 x 4096 (q, output) + 2 x 4096 x 4096 (k, v: 4096 / 32 x 32)
        = 135,266,304 + 33,554,432 + 33,554,432 = 202,375,168 weights x 2 B = 404,750,336 B
    13 layers: 5,261,754,368 B per micro-batch of 512 (default -ub, -b 2048) = 10,276,864 B per prompt token
    measured 11.3 MB per prompt token: x1.10.
    """
    rec = read_recording(MLOCK)
    shape = {"n_ff": 11008, "n_head": 32, "n_head_kv": 32, "dtype": "f16", "n_embd": 4096, "n_layer": 16}
    header = dataclasses.replace(rec.header, extra={**rec.header.extra, "model_shape": shape})
    lm = lmr.report_linkmodel(header, rec.samples)
    assert lm["available"] is True, lm.get("reason")
    host = lm["host_weights"]
    assert host["what"] == "13 of 16 layers (-ngl 4)"
    assert host["arithmetic"] == "13 x (3 x 4096 x 11008 + 2 x 4096 x 4096 + 2 x 4096 x 4096) x 2 B"
    assert host["bytes_per_microbatch"] == 13 * 202_375_168 * 2 == 5_261_754_368
    assert host["ubatch_source"] == "default -ub 512"
    assert lm["prefill"]["bytes_per_token"] == 5_261_754_368 / 512 == 10_276_864
    assert lm["comparison"]["prefill"][0]["ratio"] == pytest.approx(1.10, abs=0.02)


def test_a_readable_gguf_wins_over_the_header(tmp_path):
    """A GGUF here that matches what the header kept is read, and its shape (n_ff, heads, type) prices the
    host layers even where the header says otherwise: n_embd 256, n_ff 768, 4 layers, n_head 8,
    n_head_kv 2 (GQA: n_embd_kv = 256 / 8 x 2 = 64), f16, ``-ngl 2`` (4 - 1 = 3 layers on the CPU),
    ``-ub 64``:
        one layer: 3 x 256 x 768 + 2 x 256 x 256 + 2 x 256 x 64 = 589,824 + 131,072 + 32,768
            = 753,664 weights x 2 B = 1,507,328 B; 3 layers: 4,521,984 B per micro-batch
        per prompt token: 4,521,984 / 64 = 70,656 B
    """
    pytest.importorskip("gguf")
    from pcie_tui.core.gguf import gguf_meta
    from tests.engines.gguf_model import write_llama_gguf

    f = tmp_path / "model.gguf"
    write_llama_gguf(f, n_embd=256, n_ff=768, n_layer=4, n_head=8, n_head_kv=2, f16=True)
    meta = gguf_meta(str(f))
    assert meta is not None
    assert (meta["feed_forward_length"], meta["head_count"], meta["head_count_kv"], meta["file_type"]) == (768, 8, 2, 1)
    rec = read_recording(demos.resolve("h200-llama-full"))
    engine = dict(rec.header.engine or {}, model=str(f), layout={"model": str(f)}, model_meta=meta)
    engine["cmdline"] = ["llama-server", "-m", str(f), "-ngl", "2", "-ub", "64"]
    wrong = {"n_embd": 256, "n_ff": 999, "n_layer": 4, "dtype": "f16"}  # disagrees with model_meta: not taken
    header = dataclasses.replace(rec.header, engine=engine, extra={**rec.header.extra, "model_shape": wrong})
    assert (
        header_shape(header)[1]
        == "the header's model_shape says n_ff 999, its engine.model_meta feed_forward_length 768: two models"
    )
    lm = lmr.report_linkmodel(header, rec.samples)
    assert lm["available"] is True, lm.get("reason")
    assert lm["source"] == f"from the llamacpp's model {f}" and lm["model_file_reason"] is None
    assert lm["host_weights"]["bytes_per_microbatch"] == 3 * 753_664 * 2 == 4_521_984
    assert lm["prefill"]["bytes_per_token"] == 4_521_984 / 64 == 70_656
    f.unlink()  # gone: the header's two records disagree, so nothing is priced
    gone = lmr.report_linkmodel(header, rec.samples)
    assert gone["available"] is False and gone["reason"].endswith(
        "n_ff 999, its engine.model_meta feed_forward_length 768: two models"
    )


@pytest.mark.parametrize(
    ("argv", "shape", "priced", "words"),
    [
        (["--n-cpu-ffn", "2", "--no-op-offload"], {}, True, "none: op offload off (flag --no-op-offload)"),
        (
            ["--n-cpu-ffn", "2", "-ub", "16"],
            {},
            True,
            "none: a micro-batch of 16 tokens is below the op offload minimum",
        ),
        (["--n-cpu-ffn", "2"], {"dtype": "q4_k"}, False, "weights of type q4_k: only f32, f16 and bf16 are priced"),
        (["-ot", "blk\\.0\\.=CPU"], {}, False, "keeps tensors in host memory by name pattern"),
        (
            ["-ngl", "0"],
            {"n_head": 32, "n_head_kv": 8},
            False,
            "the header has no n_vocab: needed to price 16 of 16 layers",
        ),
    ],
)
def test_host_weights_that_do_not_stream_or_cannot_be_priced(argv, shape, priced, words):
    rec = read_recording(demos.resolve("h200-llama-full"))
    engine = dict(rec.header.engine or {}, cmdline=["llama-server", "-m", "/nowhere/model.gguf", *argv])
    base = {"n_embd": 4096, "n_ff": 11008, "n_layer": 16, "dtype": "f16"}
    header = dataclasses.replace(rec.header, engine=engine, extra={"model_shape": {**base, **shape}})
    lm = lmr.report_linkmodel(header, rec.samples)
    assert lm["available"] is priced
    if priced:
        assert lm["host_weights"]["arithmetic"].startswith(words) and lm["prefill"]["host_bytes_per_step"] == 0
    else:
        assert words in lm["reason"]


def test_ngl_0_puts_the_output_matrix_on_the_host_too():
    """-ngl 0: all 16 layers and the output matrix on the CPU; GQA n_head_kv 8: n_embd_kv = 4096 / 32 x 8 = 1024;
    -ub 64 -b 32: the micro-batch is min(64, 32) = 32 tokens.
        one layer: 3 x 4096 x 11008 + 2 x 4096 x 4096 + 2 x 4096 x 1024 = 135,266,304 + 33,554,432 + 8,388,608
            = 177,209,344 weights; 16 layers 2,835,349,504; output 259 x 4096 = 1,060,864
        (2,835,349,504 + 1,060,864) x 2 B = 5,672,820,736 B per micro-batch, / 32 = 177,275,648 B per prompt token
    """
    rec = read_recording(demos.resolve("h200-llama-full"))
    engine = dict(rec.header.engine or {}, cmdline=["llama-server", "-ngl", "0", "-ub", "64", "-b", "32"])
    shape = {"n_embd": 4096, "n_ff": 11008, "n_layer": 16, "dtype": "f16", "n_head": 32, "n_head_kv": 8, "n_vocab": 259}
    header = dataclasses.replace(rec.header, engine=engine, extra={"model_shape": shape})
    host = lmr.report_linkmodel(header, rec.samples)["host_weights"]
    assert host["what"] == "16 of 16 layers (-ngl 0) and the output matrix"
    assert host["bytes_per_microbatch"] == (16 * 177_209_344 + 259 * 4096) * 2 == 5_672_820_736
    assert (host["ubatch"], host["ubatch_source"]) == (32, "-b 32, below -ub 64")
    assert host["prefill_bytes_per_token"] == 5_672_820_736 / 32 == 177_275_648


def test_header_fields_that_are_not_positive_integers_are_unknown():
    rec = read_recording(demos.resolve("h200-llama-partial"))
    bad = {"n_embd": "4096", "n_ff": -1, "n_layer": True, "dtype": ""}
    header = dataclasses.replace(rec.header, extra={**rec.header.extra, "model_shape": bad})
    assert header_shape(header) == ({}, None)
    got = lmr.report_linkmodel(header, rec.samples)
    assert got == {
        "available": False,
        "reason": "cannot read GGUF /tmp/llb/model.gguf: no such file; the header has no n_embd and no n_layer",
    }
    assert missing_words(("a",)) == "the header has no a"
    assert math.isclose(GEN5_X16_Bps, rec.header.gpus[0].link.capacity_Bps)
