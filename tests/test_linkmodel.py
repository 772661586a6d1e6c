"""Link budget model: bytes per token for TP/PP, alpha-beta link time, config readers, recording comparison."""

from __future__ import annotations

import argparse
import json
import os
import socket
from pathlib import Path

import pytest

from pcie_tui.analyze import linkmodel as lm
from pcie_tui.analyze import linkmodel_report as lmr
from pcie_tui.core import units
from pcie_tui.core.errors import UserError
from pcie_tui.core.model import EngineSample, GpuSample, Sample, SessionHeader, pcie_capacity_Bps
from pcie_tui.doctor.cli import linkmodel_main

LLAMA70B = lm.ModelShape(hidden_size=8192, num_layers=80, dtype_bytes=2, name="llama-70b")
REFERENCE_SESSION = Path(__file__).parent.parent / "pcie_tui" / "data" / "h200-reference.jsonl.gz"


def test_tp_bytes_per_token_matches_the_ring_allreduce_formula():
    # Ring all-reduce arithmetic: Llama-70B, TP=2, bf16: ~2.6 MB per GPU per token.
    assert lm.tp_bytes_per_token(LLAMA70B, 2) == 2 * 80 * 2 * (1 / 2) * 8192 * 2 == 2_621_440
    assert lm.tp_bytes_per_token(LLAMA70B, 4) == pytest.approx(2_621_440 * 1.5)  # 2(N-1)/N: 1 -> 1.5
    assert lm.tp_bytes_per_token(LLAMA70B, 8) == pytest.approx(2_621_440 * 1.75)
    assert lm.tp_bytes_per_token(LLAMA70B, 1) == 0.0
    assert lm.pp_bytes_per_token(LLAMA70B, 2) == 8192 * 2
    assert lm.pp_bytes_per_token(LLAMA70B, 1) == 0.0
    assert lm.allreduces_per_step(LLAMA70B, 2) == 160


def test_decode_at_batch_1_is_latency_bound_and_prefill_bandwidth_bound():
    x16 = pcie_capacity_Bps(4, 16)
    p = lm.predict(LLAMA70B, lm.Layout(tp=2, batch=1, prompt_tokens=2048), x16)
    d = p["decode"]
    assert d["latency_floor_s"] == pytest.approx(160 * 25e-6)  # 4 ms per token
    assert d["bandwidth_time_s"] == pytest.approx(2_621_440 / x16)  # ~0.08 ms
    assert d["latency_bound"] and not p["prefill"]["latency_bound"]
    assert p["prefill"]["bytes_per_step"] == pytest.approx(2048 * 2_621_440)
    # Twice the width halves the wire time of prefill but not decode's latency floor.
    q = lm.predict(LLAMA70B, lm.Layout(tp=2, batch=1, prompt_tokens=2048), pcie_capacity_Bps(4, 8))
    assert q["prefill"]["bandwidth_time_s"] == pytest.approx(2 * p["prefill"]["bandwidth_time_s"])
    assert q["decode"]["latency_floor_s"] == d["latency_floor_s"]


def test_pipeline_stages_split_the_layers():
    p = lm.predict(LLAMA70B, lm.Layout(tp=2, pp=2, batch=8), 25e9)
    assert p["allreduces_per_step"] == 80  # 40 layers per stage x 2
    assert p["tp_bytes_per_token"] == pytest.approx(2_621_440 / 2)
    assert p["pp_bytes_per_token"] == 16384
    assert p["decode"]["bytes_per_step"] == pytest.approx(8 * (2_621_440 / 2 + 16384))


def test_reads_vllm_model_dirs(tmp_path):
    d = tmp_path / "Llama-3-70B"
    d.mkdir()
    (d / "config.json").write_text(
        json.dumps({"hidden_size": 8192, "num_hidden_layers": 80, "torch_dtype": "bfloat16"})
    )
    s = lm.from_hf_config(d)
    assert (s.hidden_size, s.num_layers, s.dtype_bytes, s.name) == (8192, 80, 2, "Llama-3-70B")
    mm = tmp_path / "vlm"
    mm.mkdir()
    (mm / "config.json").write_text(
        json.dumps({"text_config": {"hidden_size": 4096, "num_hidden_layers": 32, "dtype": "float32"}})
    )
    assert (lm.from_hf_config(mm).hidden_size, lm.from_hf_config(mm).dtype_bytes) == (4096, 4)
    bad = tmp_path / "bad"
    bad.mkdir()
    (bad / "config.json").write_text("{}")
    with pytest.raises(UserError, match="no hidden_size"):
        lm.from_hf_config(bad)
    with pytest.raises(UserError, match="cannot read model config"):
        lm.from_hf_config(tmp_path / "missing")


def test_reads_gguf_metadata(tmp_path):
    gguf = pytest.importorskip("gguf")
    np = pytest.importorskip("numpy")
    p = tmp_path / "tiny.gguf"
    w = gguf.GGUFWriter(str(p), "llama")
    w.add_name("tiny-llama")
    w.add_embedding_length(256)
    w.add_block_count(2)
    w.add_tensor("token_embd.weight", np.zeros((4, 256), dtype=np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    s = lm.from_gguf(p)
    assert (s.hidden_size, s.num_layers, s.dtype_bytes, s.name) == (256, 2, 4, "tiny-llama")


def _two_gpu_session(pred_bytes_per_token: float, tokens_per_s: float, seconds: int = 10):
    """A TP=2 decode whose link moves exactly the modelled bytes (a consistency check of the arithmetic)."""
    from pcie_tui.core.model import GpuInfo, LinkInfo

    link = LinkInfo(4, 16, 4, 16, pcie_capacity_Bps(4, 16))
    header = SessionHeader(
        "2026-12-02", "h", "t", tuple(GpuInfo(i, f"GPU-{i}", "g", f"0000:0{i}:00.0", link, None) for i in (0, 1))
    )
    rate = pred_bytes_per_token * tokens_per_s
    samples = []
    for k in range(seconds * 10 + 1):
        t = 1000.0 + k * 0.1
        gpus = tuple(GpuSample(i, pcie_tx_Bps=rate, pcie_rx_Bps=rate) for i in (0, 1))
        eng = EngineSample(
            "vllm", True, phase="decode", prompt_tokens_total=0.0, generation_tokens_total=k * 0.1 * tokens_per_s
        )
        samples.append(Sample(t, gpus, eng))
    return header, samples


def test_comparison_with_a_recording():
    pred = lm.predict(LLAMA70B, lm.Layout(tp=2, batch=4), 25e9)
    header, samples = _two_gpu_session(pred["tp_bytes_per_token"], tokens_per_s=40.0)
    m = lm.measured_bytes_per_token(header, samples)
    assert m["decode"]["tokens"] == pytest.approx(400.0)
    assert m["decode"]["gpus"][0]["bytes_per_token"] == pytest.approx(2_621_440)
    c = lm.compare(pred, m)
    assert c["decode"][1]["ratio"] == pytest.approx(1.0)


def test_real_recording_without_engine_has_no_token_counts():
    from pcie_tui.recording.reader import read_recording

    rec = read_recording(REFERENCE_SESSION)
    m = lm.measured_bytes_per_token(rec.header, rec.samples)
    assert m["h2d_pinned"]["tokens"] is None
    # ~55 GB/s payload for ~7 s: the counter saw ~390 GB (+ protocol overhead), never 0.
    assert 3.5e11 < m["h2d_pinned"]["gpus"][0]["bytes"] < 4.8e11


def _args(**kw):
    base = dict(
        model=None,
        gguf=None,
        hidden=None,
        layers=None,
        dtype_bytes=None,
        tp=1,
        pp=1,
        batch=1,
        prompt_tokens=2048,
        link="4x16",
        ceiling_gbps=None,
        latency_us=25.0,
        recording=None,
        json=False,
    )
    base.update(kw)
    return argparse.Namespace(**base)


def test_cli(capsys):
    assert linkmodel_main(_args(hidden=8192, layers=80, tp=2)) == 0
    out = capsys.readouterr().out
    assert "2.62 MB each way" in out and "latency-bound" in out and "Gen4 x16 theoretical = 31.5 GB/s" in out
    assert linkmodel_main(_args(hidden=8192, layers=80, tp=2, json=True, recording=str(REFERENCE_SESSION))) == 0
    got = json.loads(capsys.readouterr().out)
    assert got["tp_bytes_per_token"] == 2_621_440 and "measured" in got
    for bad, msg in (
        (_args(), "give --model"),
        (_args(hidden=1, layers=1, tp=0), "--tp must be"),
        (_args(hidden=1, layers=1, link="7x16"), "--link '7x16': there is no PCIe Gen7"),
        (_args(hidden=1, layers=1, link="x16"), "GENxWIDTH"),
    ):
        with pytest.raises(UserError, match=msg):
            linkmodel_main(bad)


def test_report_linkmodel_reads_the_engine_facts(tmp_path):
    d = tmp_path / "tiny"
    d.mkdir()
    (d / "config.json").write_text(json.dumps({"hidden_size": 256, "num_hidden_layers": 2, "torch_dtype": "float32"}))
    header, samples = _two_gpu_session(2 * 2 * 1 * 256 * 4, tokens_per_s=100.0)
    import dataclasses

    # Recorded on this host, before the config was last written: the config here is the one that ran.
    os.utime(d / "config.json", (1e9, 1e9))
    header = dataclasses.replace(
        header,
        host=socket.gethostname(),
        engine={"kind": "vllm", "layout": {"model": str(d), "tensor_parallel_size": 2}},
    )
    rep = lmr.report_linkmodel(header, samples)
    assert rep["available"] and rep["layout"]["tp"] == 2 and rep["tp_bytes_per_token"] == 2 * 2 * 1 * 256 * 4
    assert rep["comparison"]["decode"][0]["ratio"] == pytest.approx(1.0)
    assert rep["ceiling_label"] == "theoretical"
    missing = dataclasses.replace(header, engine={"kind": "vllm", "layout": {"model": "org/name-on-a-hub"}})
    got = lmr.report_linkmodel(missing, samples)
    assert got == {"available": False, "reason": got["reason"]} and "not an absolute path" in got["reason"]
    gone = dataclasses.replace(header, engine={"kind": "vllm", "layout": {"model": str(tmp_path / "gone")}})
    assert "cannot read model config" in lmr.report_linkmodel(gone, samples)["reason"]
    assert lmr.report_linkmodel(dataclasses.replace(header, engine=None), samples)["available"] is False


LLAMA_PARTIAL = Path(__file__).parent.parent / "pcie_tui" / "data" / "h200-llama-partial.jsonl.gz"


def _cli(argv, capsys):
    from pcie_tui.cli.main import main

    try:
        rc = main(argv)
    except SystemExit as e:
        rc = e.code
    cap = capsys.readouterr()
    return rc, cap.out, cap.err


@pytest.mark.parametrize(
    "flag,value",
    [
        ("--hidden", "-5"),
        ("--latency-us", "-3"),
        ("--dtype-bytes", "0"),
        ("--layers", "0"),
        ("--tp", "0"),
        ("--pp", "-1"),
        ("--batch", "0"),
        ("--prompt-tokens", "0"),
        ("--ceiling-gbps", "0"),
        ("--hidden", "abc"),
    ],
)
def test_cli_rejects_bad_numbers_in_one_line_naming_the_flag(flag, value, capsys):
    argv = ["linkmodel", "--hidden", "64", "--layers", "2", flag, value]
    rc, out, err = _cli(argv, capsys)
    assert rc != 0 and out == ""
    assert len(err.strip().splitlines()) == 1 and flag in err and "Traceback" not in err


def test_cli_direct_call_does_not_silently_replace_zero(capsys):
    # Without argparse's types (a direct call), 0 is still refused, not read as "unset".
    with pytest.raises(UserError, match="--dtype-bytes must be >= 1"):
        linkmodel_main(_args(hidden=64, layers=2, dtype_bytes=0))
    with pytest.raises(UserError, match="--layers must be >= 1"):
        linkmodel_main(_args(hidden=64, layers=0))


def test_every_linkmodel_option_has_help():
    from pcie_tui.cli.main import build_parser

    sub = next(a for a in build_parser()._actions if isinstance(a, argparse._SubParsersAction))
    for cmd in ("linkmodel", "doctor", "calibrate"):
        for a in sub.choices[cmd]._actions:
            if a.help is not argparse.SUPPRESS:
                assert a.help, (cmd, a.option_strings)


def test_single_gpu_layout_says_there_is_no_inter_gpu_traffic(capsys):
    rc, out, _ = _cli(["linkmodel", "--hidden", "4096", "--layers", "32"], capsys)
    assert rc == 0
    assert "no inter-GPU traffic per token" in out
    assert "bandwidth-bound" not in out and "0.00 ms" not in out


def test_small_rates_and_singulars_are_formatted(capsys):
    assert units.rate_sig(0.000249e9) == "249 kB/s" and units.rate_sig(63e9) == "63.0 GB/s"
    assert units.rate(0.000249e9) == "249 kB/s" and units.rate(53.84e9) == "53.8 GB/s"
    assert units.size(2_621_440) == "2.62 MB" and lm.count(1, "token") == "1 token" and lm.count(2, "tick") == "2 ticks"
    rc, out, _ = _cli(
        ["linkmodel", "--hidden", "8192", "--layers", "80", "--tp", "2", "--ceiling-gbps", "0.000249"], capsys
    )
    assert rc == 0
    assert "249 kB/s per direction" in out and "0.000249" not in out and "0.0 GB/s" not in out
    assert "(1 token)" in out and "1 tokens" not in out and "e+" not in out


def test_llama_server_recording_counts_tokens_per_finished_request(capsys):
    """llama-server's counters move at request end; the finished requests carry prompt_n / predicted_n."""
    from pcie_tui.recording.reader import read_recording

    rec = read_recording(LLAMA_PARTIAL)
    reqs = {r["seq"]: r for s in rec.samples if s.engine for r in s.engine.extra.get("requests", [])}
    assert len(reqs) == 6
    m = lm.measured_bytes_per_token(rec.header, rec.samples)
    assert m["prefill"]["tokens"] == sum(r["prompt_n"] for r in reqs.values()) == 8160
    assert m["decode"]["tokens"] == sum(r["predicted_n"] for r in reqs.values()) == 81
    assert m["decode"]["gpus"][0]["bytes_per_token"] == pytest.approx(m["decode"]["gpus"][0]["bytes"] / 81)
    assert "6 finished requests" in m["decode"]["tokens_basis"]
    rc, out, _ = _cli(["linkmodel", "--recording", str(LLAMA_PARTIAL), "--hidden", "4096", "--layers", "32"], capsys)
    assert rc == 0 and "no engine attached" not in out
    assert "recording prefill GPU0: measured" in out and "over 8160 tokens" in out and "over 81 tokens" in out
    # A demo's name works as it does for report and replay.
    rc, by_name, _ = _cli(
        ["linkmodel", "--recording", "h200-llama-partial", "--hidden", "4096", "--layers", "32"], capsys
    )
    assert rc == 0 and by_name == out


def test_missing_tokens_give_the_real_reason():
    import dataclasses

    header, samples = _two_gpu_session(1e6, tokens_per_s=10.0)
    no_engine = [dataclasses.replace(s, engine=None, extra={"label": "decode"}) for s in samples]
    assert "no engine attached" in lm.measured_bytes_per_token(header, no_engine)["decode"]["tokens_reason"]
    no_counters = [dataclasses.replace(s, engine=EngineSample("vllm", True, phase="decode")) for s in samples]
    m = lm.measured_bytes_per_token(header, no_counters)
    assert m["decode"]["tokens"] is None and "no token counters" in m["decode"]["tokens_reason"]
    still = [dataclasses.replace(s, engine=dataclasses.replace(s.engine, generation_tokens_total=5.0)) for s in samples]
    assert "did not move during decode" in lm.measured_bytes_per_token(header, still)["decode"]["tokens_reason"]
    pred = lm.predict(LLAMA70B, lm.Layout(tp=2), 25e9)
    pred["ceiling_label"] = "given"
    pred["measured"] = lm.measured_bytes_per_token(header, no_counters)
    pred["comparison"] = lm.compare(pred, pred["measured"])
    from pcie_tui.doctor.cli import render_linkmodel

    text = render_linkmodel(pred)
    assert "bytes per token n/a (the engine reported no token counters)" in text and "no engine attached" not in text


def test_a_corrupt_gguf_is_refused_from_its_header_alone(tmp_path):
    """A file with GGUF's magic and garbage after it, sparse at a model's size (6.5 GB): one line,
    at once, without indexing tensors (the gguf package's reader took a pytest run to 13 GB on such
    a file). A real header still reads (test above)."""
    import struct

    from pcie_tui.core.errors import UserError

    p = tmp_path / "model.gguf"
    with open(p, "wb") as f:
        f.write(b"GGUF" + struct.pack("<IQQ", 3, 2**60, 2**60) + struct.pack("<Q", 2**62) + b"\xff" * 64)
        f.truncate(6_480_804_800)
    with pytest.raises(UserError, match=r"cannot read GGUF .*not a readable GGUF header"):
        lm.from_gguf(p)  # the bounded header reader's words: no tensor was indexed
    (tmp_path / "text.gguf").write_text("not a model")
    with pytest.raises(UserError, match="not a readable GGUF header"):
        lm.from_gguf(tmp_path / "text.gguf")
