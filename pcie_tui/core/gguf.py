"""A few scalar facts from a GGUF file's header (the model's shape), without the gguf package.

GGUF v2/v3 header: magic ``GGUF``, u32 version, u64 tensor count, u64 key/value count, then
key/value pairs (u64-length key, u32 type, value). Reading stops once the wanted keys are found
or the tokenizer's large arrays begin; the tensor data is never touched.
"""

from __future__ import annotations

import os
import struct
from typing import Any, BinaryIO

_SCALARS = {0: "<B", 1: "<b", 2: "<H", 3: "<h", 4: "<I", 5: "<i", 6: "<f", 7: "<?", 10: "<Q", 11: "<q", 12: "<d"}
# ``<arch>.<key>`` (``general.file_type``: the weights' type, 0 all f32, 1 mostly f16, 32 mostly bf16, ...).
_WANTED = (
    "block_count",
    "embedding_length",
    "feed_forward_length",
    "head_count",
    "head_count_kv",
    "vocab_size",
    "file_type",
    "expert_count",
    "expert_used_count",
)


class _Bad(Exception):
    pass


def _read(f: BinaryIO, fmt: str) -> Any:
    n = struct.calcsize(fmt)
    b = f.read(n)
    if len(b) != n:
        raise _Bad("truncated")
    return struct.unpack(fmt, b)[0]


def _string(f: BinaryIO, limit: int = 1 << 20) -> str:
    n = _read(f, "<Q")
    if n > limit:
        raise _Bad("string too long")
    return f.read(n).decode("utf-8", "replace")


def _skip(f: BinaryIO, vtype: int) -> Any:
    if vtype in _SCALARS:
        return _read(f, _SCALARS[vtype])
    if vtype == 8:
        return _string(f)
    if vtype == 9:
        raise _Bad("array")  # arrays (tokenizer vocabularies) come after the model's own keys
    raise _Bad(f"type {vtype}")


def gguf_meta(path: str, max_keys: int = 256, name: bool = False) -> dict[str, Any] | None:
    """``{"arch", "file_bytes"}`` and the integer keys of ``_WANTED`` (``block_count``, ``embedding_length``,
    ``feed_forward_length``, ``head_count``, ...; keys the file does not have are left out; ``name``: also ``general.name``), or None when the
    file is not a readable GGUF. Bounded: at most ``max_keys`` keys, strings of 1 MiB, no arrays, no
    tensor info, so a corrupt or hostile file costs microseconds, never memory."""
    try:
        size = os.path.getsize(path)
        with open(path, "rb") as f:
            if f.read(4) != b"GGUF":
                return None
            _read(f, "<I")
            _read(f, "<Q")
            n_kv = _read(f, "<Q")
            out: dict[str, Any] = {"file_bytes": size}
            for _ in range(min(n_kv, max_keys)):
                key = _string(f, 1 << 16)
                vtype = _read(f, "<I")
                try:
                    val = _skip(f, vtype)
                except _Bad:
                    break
                if key == "general.architecture":
                    out["arch"] = val
                elif name and key == "general.name" and isinstance(val, str):
                    out["name"] = val
                elif key.rpartition(".")[2] in _WANTED and isinstance(val, int | float):
                    out[key.rpartition(".")[2]] = int(val)
                if all(k in out for k in ("arch", *_WANTED)):
                    break
            return out
    except (OSError, _Bad, struct.error):
        return None
