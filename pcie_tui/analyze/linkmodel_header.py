"""The model's shape as the recording kept it: the link budget's model when the model file is not read here.

A header says what the model is in two places: ``engine.model_meta`` (llama-server's client reads the
GGUF's own header when it attaches: ``embedding_length``, ``block_count``, and from this version on
``feed_forward_length``, ``head_count``, ``head_count_kv``, ``vocab_size``, ``file_type``) and a top-level
``model_shape`` (``n_embd``, ``n_ff``, ``n_layer``, ``n_head``, ``n_head_kv``, ``n_vocab``, ``dtype``;
scripts/h200_llama_sessions.py writes it). Both describe the model that ran; where both give a field they
must agree. A field that is absent, or not a positive integer, is unknown: never assumed.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from pcie_tui.core.model import SessionHeader

# shape field -> (model_shape key, GGUF / model_meta key)
FIELDS: dict[str, tuple[str, str]] = {
    "n_embd": ("n_embd", "embedding_length"),
    "n_ff": ("n_ff", "feed_forward_length"),
    "n_layer": ("n_layer", "block_count"),
    "n_head": ("n_head", "head_count"),
    "n_head_kv": ("n_head_kv", "head_count_kv"),
    "n_vocab": ("n_vocab", "vocab_size"),
    "dtype": ("dtype", "file_type"),
}
_DTYPES = {
    **dict.fromkeys(("f32", "fp32", "float32", "float"), "f32"),
    **dict.fromkeys(("f16", "fp16", "float16", "half"), "f16"),
    **dict.fromkeys(("bf16", "bfloat16"), "bf16"),
}
_FILE_TYPES = {0: "f32", 1: "f16", 32: "bf16"}  # llama_ftype: ALL_F32, MOSTLY_F16, MOSTLY_BF16


def _count(v: Any) -> int | None:
    return v if isinstance(v, int) and not isinstance(v, bool) and v > 0 else None


def _dtype(v: Any, from_gguf: bool) -> str | None:
    """The weights' type: a name (``f16``, ``bfloat16``, ``torch.float16``) or a GGUF ``general.file_type``."""
    if from_gguf:
        if not isinstance(v, int) or isinstance(v, bool) or v < 0:
            return None
        return _FILE_TYPES.get(v, f"llama file type {v}")
    if not isinstance(v, str) or not v.strip():
        return None
    name = v.strip().lower().removeprefix("torch.")
    return _DTYPES.get(name, name)


def from_meta(meta: Mapping[str, Any]) -> dict[str, Any]:
    """Shape fields from a GGUF header's keys (:func:`pcie_tui.core.gguf.gguf_meta`, ``engine.model_meta``)."""
    out: dict[str, Any] = {f: _count(meta.get(k)) for f, (_, k) in FIELDS.items() if f != "dtype"}
    out["dtype"] = _dtype(meta.get("file_type"), True)
    return {k: v for k, v in out.items() if v is not None}


def from_model_shape(shape: Mapping[str, Any]) -> dict[str, Any]:
    """Shape fields from a header's ``model_shape``."""
    out: dict[str, Any] = {f: _count(shape.get(k)) for f, (k, _) in FIELDS.items() if f != "dtype"}
    out["dtype"] = _dtype(shape.get("dtype"), False)
    return {k: v for k, v in out.items() if v is not None}


def header_shape(header: SessionHeader) -> tuple[dict[str, Any], str | None]:
    """The shape fields the header keeps, and where ``model_shape`` and ``engine.model_meta`` disagree, why
    neither is taken (then the fields are empty)."""
    eng = header.engine if isinstance(header.engine, dict) else {}
    meta = from_meta(eng["model_meta"]) if isinstance(eng.get("model_meta"), dict) else {}
    raw = header.extra.get("model_shape")
    shape = from_model_shape(raw) if isinstance(raw, dict) else {}
    for k in sorted(meta.keys() & shape.keys()):
        if meta[k] != shape[k]:
            return {}, (
                f"the header's model_shape says {k} {shape[k]}, its engine.model_meta {FIELDS[k][1]} {meta[k]}: "
                "two models"
            )
    return {**meta, **shape}, None


def describe(fields: Mapping[str, Any], used: tuple[str, ...] = ()) -> str:
    """'n_embd 4096, n_ff 11008, 16 layers, f16': the main fields known, and any others ``used``."""
    words = {
        "n_embd": f"n_embd {fields.get('n_embd')}",
        "n_ff": f"n_ff {fields.get('n_ff')}",
        "n_layer": f"{fields.get('n_layer')} layers",
        "n_head": f"n_head {fields.get('n_head')}",
        "n_head_kv": f"n_head_kv {fields.get('n_head_kv')}",
        "n_vocab": f"n_vocab {fields.get('n_vocab')}",
        "dtype": str(fields.get("dtype")),
    }
    main = ("n_embd", "n_ff", "n_layer", "dtype")
    return ", ".join(w for k, w in words.items() if k in fields and (k in main or k in used))


def missing_words(missing: tuple[str, ...] | list[str], where: str = "the header") -> str:
    """'the header has no n_ff', '... no n_ff and no dtype', '... no n_ff, n_head, n_head_kv or dtype'."""
    if len(missing) <= 2:
        return f"{where} has no " + " and no ".join(missing)
    return f"{where} has no " + ", ".join(missing[:-1]) + f" or {missing[-1]}"
