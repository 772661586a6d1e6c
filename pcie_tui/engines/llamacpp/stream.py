"""llama-server's host weights over the link: the link budget's host term (docs/doctor.md "linkmodel").

From llama.cpp's source (b11434; the placements are :mod:`.advice`'s): a weight kept in host memory is
copied to the GPU whole whenever an op on it runs a batch of at least ``GGML_OP_OFFLOAD_MIN_BATCH``
(32) tokens (``--op-offload``, the default): once per prefill micro-batch of ``min(-ub, -b)`` tokens.
Decode batches (one token per sequence) stay below it: the CPU computes those layers and only their
activations cross. MoE experts are copied only as far as a micro-batch's tokens route to them (ggml's
scheduler, llama.cpp PR 15346): the recording does not keep the routing, so they are not priced.

The matrices of one layer, in llama's layout (norm vectors, n_embd x 4 B each, are left out)::

    FFN        3 x n_embd x n_ff                                  ffn_gate, ffn_up, ffn_down
    attention  2 x n_embd x n_embd + 2 x n_embd x n_embd_kv       attn_q, attn_output; attn_k, attn_v
               n_embd_kv = n_embd / n_head x n_head_kv

times the bytes per weight of the model's type (f32 4, f16 and bf16 2; quantized types mix block
formats per tensor and are not priced). With ``-ngl 0`` the output matrix (n_vocab x n_embd) stays
on the CPU too.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from pcie_tui.engines.base import EngineFacts, WeightStream
from pcie_tui.engines.llamacpp import advice, runtime

WEIGHT_BYTES = {"f32": 4, "f16": 2, "bf16": 2}
DEFAULT_BATCH = 2048  # llama.cpp's -b default; the micro-batch is min(-ub, -b)
_FFN = ("n_embd", "n_ff", "dtype")
_LAYER = ("n_embd", "n_ff", "n_head", "n_head_kv", "dtype")


def micro_batch(flags: Mapping[str, Any]) -> tuple[int, str]:
    """Tokens per micro-batch, ``min(-ub, -b)`` (llama_context: n_ubatch = min(n_batch, n_ubatch)), and why."""
    ub, b = flags.get("ubatch"), flags.get("batch")
    ub_n = ub if isinstance(ub, int) and ub > 0 else advice.DEFAULT_UBATCH
    b_n = b if isinstance(b, int) and b > 0 else DEFAULT_BATCH
    if b_n < ub_n:
        return b_n, f"-b {b_n}, below -ub {ub_n}"
    return ub_n, f"-ub {ub_n}" if isinstance(ub, int) and ub > 0 else f"default -ub {ub_n}"


def weight_stream(engine_info: dict[str, Any], shape: Mapping[str, Any]) -> WeightStream:
    """The host weights llama-server copies to the GPU per prefill micro-batch, priced from ``shape``."""
    fx = advice.facts(engine_info)
    if fx.host_weights is None:
        return WeightStream(None, notes=_notes(fx, False))
    notes = _notes(fx, True)
    for why in (_experts(fx.flags), _overrides(fx.flags)):
        if why:
            return WeightStream(fx.host_weights, problem=why, notes=notes)
    if shape.get("n_layer") is None:
        return WeightStream(fx.host_weights, used=("n_layer",), missing=("n_layer",), notes=notes)
    n_layer = int(shape["n_layer"])
    layers = fx.fact("gpu_layers")
    every = layers is not None and layers.value == "all"  # every layer on the GPU, their count not recorded
    whole = 0 if every else runtime.host_repeating_layers(layers, n_layer) if layers is not None else None
    if layers is None or whole is None:
        said = layers.source if layers is not None else "no layer placement read"
        return WeightStream(fx.host_weights, problem=f"the layers on the GPU are unknown ({said})", notes=notes)
    n_ffn = fx.flags.get("n_cpu_ffn")
    ffn_only = max(0, min(n_ffn, n_layer) - whole) if isinstance(n_ffn, int) and n_ffn > 0 else 0
    output = str(layers.value).partition("/")[0] == "0"  # -ngl 0: the output matrix stays on the CPU too
    if not (whole or ffn_only):  # -ngl above the layer count the facts could not check
        return WeightStream(None, notes=_notes(fx, False))
    what = _what(layers.source.removeprefix("flag "), whole, n_layer, ffn_only, n_ffn, output)
    ub, ub_words = micro_batch(fx.flags)
    on_cpu = _prefill_on_cpu(fx, ub)
    if on_cpu:
        none = f"none: {on_cpu}, so the CPU computes the host layers in prefill too"
        return WeightStream(what, 0.0, ub, ub_words, none, notes=notes)
    need = set(_LAYER if whole else ()) | set(_FFN if ffn_only else ()) | ({"n_vocab"} if output else set())
    used = tuple(k for k in ("n_embd", "n_ff", "n_head", "n_head_kv", "n_vocab", "dtype") if k in need)
    missing = tuple(k for k in used if shape.get(k) is None)
    if missing:
        return WeightStream(what, ubatch=ub, ubatch_source=ub_words, used=used, missing=missing, notes=notes)
    wb = WEIGHT_BYTES.get(str(shape["dtype"]))
    if wb is None:
        why = f"weights of type {shape['dtype']}: only f32, f16 and bf16 are priced (quantized types mix block formats per tensor)"
        return WeightStream(what, ubatch=ub, ubatch_source=ub_words, used=used, problem=why, notes=notes)
    terms, total = _terms(shape, whole, ffn_only, output)
    arithmetic = f"({' + '.join(terms)}) x {wb} B" if len(terms) > 1 else f"{terms[0]} x {wb} B"
    return WeightStream(what, float(total * wb), ub, ub_words, arithmetic, used=used, notes=notes)


def _terms(shape: Mapping[str, Any], whole: int, ffn_only: int, output: bool) -> tuple[list[str], int]:
    """The matrices' element counts in words and in total."""
    e, ff = int(shape["n_embd"]), int(shape.get("n_ff") or 0)  # n_ff: checked present where used
    terms, total = [], 0
    if whole:
        kv = e // int(shape["n_head"]) * int(shape["n_head_kv"])
        terms.append(f"{whole} x (3 x {e} x {ff} + 2 x {e} x {e} + 2 x {e} x {kv})")
        total += whole * (3 * e * ff + 2 * e * e + 2 * e * kv)
    if ffn_only:
        terms.append(f"{ffn_only} x 3 x {e} x {ff}")
        total += ffn_only * 3 * e * ff
    if output:
        terms.append(f"{shape['n_vocab']} x {e}")
        total += int(shape["n_vocab"]) * e
    return terms, total


def _what(said: str, whole: int, n_layer: int, ffn_only: int, n_ffn: Any, output: bool) -> str:
    """The host weights in words: whole layers (and what placed them), then the FFN of further layers."""
    parts = []
    if whole:
        parts.append(f"{whole} of {n_layer} layers ({said})" + (" and the output matrix" if output else ""))
    if ffn_only:
        more = " further" if whole else ""
        parts.append(f"FFN weights of {ffn_only}{more} layers (--n-cpu-ffn {n_ffn})")
    return "; ".join(parts)


def _prefill_on_cpu(fx: EngineFacts, ub: int) -> str | None:
    """What keeps prefill of the host layers on the CPU (op offload off, or a micro-batch below its minimum)."""
    off, least = fx.fact("op_offload"), fx.fact("op_offload_min_batch")
    if off is not None and off.value is False:
        return f"op offload off ({off.source})"
    need = least.value if least is not None and isinstance(least.value, int) else runtime.DEFAULT_OP_OFFLOAD_MIN_BATCH
    if ub < need:
        src = least.source if least is not None else "GGML_OP_OFFLOAD_MIN_BATCH unset"
        return f"a micro-batch of {ub} tokens is below the op offload minimum of {need} ({src})"
    return None


def _experts(flags: Mapping[str, Any]) -> str | None:
    if flags.get("cpu_moe") or flags.get("n_cpu_moe"):
        return (
            "MoE experts in host memory are copied only as far as a micro-batch's tokens route to them "
            "(llama.cpp's scheduler), and the recording does not keep the routing: not priced"
        )
    return None


def _overrides(flags: Mapping[str, Any]) -> str | None:
    ot = advice.cpu_overrides(dict(flags))
    if ot:
        pats = ", ".join(f"-ot {p}" for p in ot)
        return f"{pats} keeps tensors in host memory by name pattern; which tensors, of what size, is not recorded: not priced"
    return None


def _notes(fx: EngineFacts, host: bool) -> tuple[str, ...]:
    """Traffic that crosses the link and is not priced (``host``: weights stay in host memory)."""
    out = []
    if host:
        out.append(
            "decode: one token per sequence stays below the op offload minimum, so the CPU computes the host "
            "layers and no weight crosses; the activations that do (n_embd x 4 B per hand-off) are not priced"
        )
    if fx.kv_on_host:
        out.append(
            "the KV cache is in host memory (-nkvo): attention reads it on the CPU, traffic that grows with "
            "the context and is not priced"
        )
    return tuple(out)
