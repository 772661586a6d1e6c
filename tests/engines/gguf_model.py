"""Write a random-weight llama GGUF with the ``gguf`` package (no downloads).

The vocabulary is SentencePiece-style with only ``<unk>``, ``<s>``, ``</s>`` and the 256
byte tokens ``<0x00>``..``<0xFF>``, so every byte of a prompt is one token (llama.cpp's
/tokenize gives the exact count).  Output text is noise; the work done per token is real.

Tensors are streamed to the file one by one, so multi-GB models need little memory
(the largest single tensor, plus a 16 MiB pool).
Used by the engine tests (tiny, f32) and by the H200 script (GBs, f16)::

    python tests/engines/gguf_model.py OUT.gguf --embd 4096 --ff 11008 --layers 16 --f16

``--experts N --experts-used K`` writes a Mixtral-style MoE instead (still arch ``llama``:
llama.cpp's llama loader takes ``llama.expert_count`` / ``llama.expert_used_count`` and, in
place of the dense FFN, a router ``blk.N.ffn_gate_inp`` (f32, as converted Mixtral files
keep it) and 3-D expert tensors ``blk.N.ffn_{gate,up,down}_exps`` of N experts of width
``--ff`` each); these are the tensors ``--cpu-moe``, ``--n-cpu-moe`` and ``-ot exps=CPU``
keep in host memory::

    python tests/engines/gguf_model.py OUT.gguf --embd 2048 --ff 5632 --layers 16 --experts 8 --experts-used 2 --f16
"""

from __future__ import annotations

import argparse
from pathlib import Path

import numpy as np

MAX_EXPERTS = 1024  # LLAMA_MAX_EXPERTS in llama.cpp's src/llama-hparams.h


def _weights(rng: np.random.Generator, pool: np.ndarray, shape: tuple[int, ...], dtype: type) -> np.ndarray:
    """Random-looking weights cut from a pre-generated pool (fast for GBs: no RNG per element)."""
    n = int(np.prod(shape))
    start = int(rng.integers(0, pool.size))
    rolled = np.concatenate([pool[start:], pool[:start]])
    return np.resize(rolled, n).astype(dtype, copy=False).reshape(shape)


def write_llama_gguf(
    path: str | Path,
    n_embd: int = 256,
    n_ff: int = 768,
    n_layer: int = 4,
    n_head: int = 8,
    n_head_kv: int | None = None,
    ctx_len: int = 4096,
    f16: bool = False,
    seed: int = 0,
    n_expert: int = 0,
    n_expert_used: int = 0,
) -> dict[str, int]:
    """Write the model; returns its shape and size in bytes (``n_expert`` 0: dense)."""
    import gguf  # imported here so the module can be read without the package

    if n_expert < 0 or n_expert == 1 or n_expert > MAX_EXPERTS:
        raise ValueError(f"experts must be 0 (dense) or 2..{MAX_EXPERTS}, got {n_expert}")
    if n_expert and not 1 <= n_expert_used <= n_expert:
        raise ValueError(f"experts-used must be 1..{n_expert} (the expert count), got {n_expert_used}")
    if not n_expert and n_expert_used:
        raise ValueError("experts-used needs experts (an MoE model)")

    n_head_kv = n_head if n_head_kv is None else n_head_kv
    head_dim = n_embd // n_head
    n_embd_kv = head_dim * n_head_kv
    tokens = [b"<unk>", b"<s>", b"</s>"] + [f"<0x{i:02X}>".encode() for i in range(256)]
    types = [gguf.TokenType.UNKNOWN, gguf.TokenType.CONTROL, gguf.TokenType.CONTROL] + [gguf.TokenType.BYTE] * 256
    n_vocab = len(tokens)

    w = gguf.GGUFWriter(str(path), "llama")
    w.add_name("pcie-tui random llama")
    w.add_context_length(ctx_len)
    w.add_embedding_length(n_embd)
    w.add_block_count(n_layer)
    w.add_feed_forward_length(n_ff)
    w.add_rope_dimension_count(head_dim)
    w.add_head_count(n_head)
    w.add_head_count_kv(n_head_kv)
    w.add_layer_norm_rms_eps(1e-5)
    w.add_rope_freq_base(10000.0)
    w.add_file_type(1 if f16 else 0)
    if n_expert:
        w.add_expert_count(n_expert)
        w.add_expert_used_count(n_expert_used)
    w.add_tokenizer_model("llama")
    w.add_token_list(tokens)
    w.add_token_scores([0.0] * n_vocab)
    w.add_token_types(types)
    w.add_bos_token_id(1)
    w.add_eos_token_id(2)
    w.add_unk_token_id(0)
    w.add_add_bos_token(True)
    w.add_add_eos_token(False)

    mat = np.float16 if f16 else np.float32
    # numpy shape = reversed ggml shape: (out_features, in_features)
    plan: list[tuple[str, tuple[int, ...], type]] = [("token_embd.weight", (n_vocab, n_embd), mat)]
    for i in range(n_layer):
        b = f"blk.{i}."
        plan += [
            (b + "attn_norm.weight", (n_embd,), np.float32),
            (b + "attn_q.weight", (n_embd, n_embd), mat),
            (b + "attn_k.weight", (n_embd_kv, n_embd), mat),
            (b + "attn_v.weight", (n_embd_kv, n_embd), mat),
            (b + "attn_output.weight", (n_embd, n_embd), mat),
            (b + "ffn_norm.weight", (n_embd,), np.float32),
        ]
        if n_expert:  # llama.cpp shapes {n_embd, n_expert}, {n_embd, n_ff, n_expert}, {n_ff, n_embd, n_expert}
            plan += [
                (b + "ffn_gate_inp.weight", (n_expert, n_embd), np.float32),
                (b + "ffn_gate_exps.weight", (n_expert, n_ff, n_embd), mat),
                (b + "ffn_up_exps.weight", (n_expert, n_ff, n_embd), mat),
                (b + "ffn_down_exps.weight", (n_expert, n_embd, n_ff), mat),
            ]
        else:
            plan += [
                (b + "ffn_gate.weight", (n_ff, n_embd), mat),
                (b + "ffn_up.weight", (n_ff, n_embd), mat),
                (b + "ffn_down.weight", (n_embd, n_ff), mat),
            ]
    plan += [("output_norm.weight", (n_embd,), np.float32), ("output.weight", (n_vocab, n_embd), mat)]
    total = 0
    for name, shape, dt in plan:
        nbytes = int(np.prod(shape)) * np.dtype(dt).itemsize
        w.add_tensor_info(name, shape, np.dtype(dt), nbytes)
        total += nbytes
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_ti_data_to_file()

    rng = np.random.default_rng(seed)
    # Small weights keep activations finite through many random layers.
    scale = 1.0 / np.sqrt(n_embd)
    pool = (rng.standard_normal(1 << 22, dtype=np.float32) * scale).astype(mat)
    for name, shape, dt in plan:
        arr = np.ones(shape, dtype=np.float32) if name.endswith("norm.weight") else _weights(rng, pool, shape, dt)
        w.write_tensor_data(arr)
    w.close()
    info = {"n_vocab": n_vocab, "n_embd": n_embd, "n_ff": n_ff, "n_layer": n_layer, "bytes": total}
    if n_expert:
        info |= {"n_expert": n_expert, "n_expert_used": n_expert_used, "expert_bytes": expert_bytes(plan)}
    return info


def expert_bytes(plan: list[tuple[str, tuple[int, ...], type]]) -> int:
    """Bytes of the ``*_exps`` tensors: what ``--cpu-moe`` keeps in host memory."""
    return sum(int(np.prod(shape)) * np.dtype(dt).itemsize for name, shape, dt in plan if "_exps." in name)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("out")
    ap.add_argument("--embd", type=int, default=256)
    ap.add_argument("--ff", type=int, default=768)
    ap.add_argument("--layers", type=int, default=4)
    ap.add_argument("--heads", type=int, default=8)
    ap.add_argument("--kv-heads", type=int, default=None)
    ap.add_argument("--ctx", type=int, default=4096)
    ap.add_argument("--f16", action="store_true")
    ap.add_argument("--experts", type=int, default=0, help="MoE: experts per layer (default 0: dense)")
    ap.add_argument("--experts-used", type=int, default=None, help="MoE: experts routed per token (default 2)")
    ap.add_argument("--seed", type=int, default=0)
    a = ap.parse_args()
    used = a.experts_used if a.experts_used is not None else (min(2, a.experts) if a.experts else 0)
    try:
        info = write_llama_gguf(
            a.out, a.embd, a.ff, a.layers, a.heads, a.kv_heads, a.ctx, a.f16, a.seed, a.experts, used
        )
    except (ValueError, OSError) as e:
        ap.exit(2, f"gguf_model: {e}\n")
    print(info)


if __name__ == "__main__":
    main()
