"""The link budget for ``report``: the recording's own model and layout, from its header.

The header names the model by a path on the machine that recorded. The file at that path here is
read only when it is verifiably the model that ran (:func:`local_model_problem`); otherwise the
result says why it was not read.
"""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path
from typing import Any, TypeGuard

from pcie_tui.analyze.linkmodel import (
    Layout,
    ModelShape,
    compare_with_recording,
    from_gguf,
    from_hf_config,
    predict,
)
from pcie_tui.core.errors import UserError
from pcie_tui.core.model import Sample, SessionHeader
from pcie_tui.engines import registry
from pcie_tui.engines.base import default_parallelism

_META_KEYS = ("file_bytes", "embedding_length", "block_count")  # what a GGUF is checked by


def from_engine(header: SessionHeader) -> tuple[ModelShape | None, Layout | None, str]:
    """Model shape and layout from the attached engine's facts in the header (reason when unknown).

    The engine says what ``layout.model`` is (``Engine.model_format``: a model directory with
    config.json, or a GGUF file) and which tp/pp its layout implies (``Engine.parallelism``).
    The model path names a file on the machine that recorded; it is read here only when it can
    be checked to be that file (:func:`local_model_problem`), else the reason says why not.
    """
    eng: dict[str, Any] = header.engine if isinstance(header.engine, dict) else {}
    lay: dict[str, Any] = eng["layout"] if isinstance(eng.get("layout"), dict) else {}
    path = lay.get("model") or eng.get("model")
    if not isinstance(path, str) or not path:
        return None, None, "the engine's model path is unknown"
    n_gpus = max(1, len(header.gpus))
    kind = eng.get("kind") if isinstance(eng.get("kind"), str) else None
    meta: dict[str, Any] = eng["model_meta"] if isinstance(eng.get("model_meta"), dict) else {}
    try:
        engine = registry.get(kind) if kind else None
        fmt = engine.model_format if engine is not None else "hf"
        tp, pp = engine.parallelism(lay, n_gpus) if engine is not None else default_parallelism(lay)
        problem = local_model_problem(header, path, fmt, meta)
        if problem:
            return None, None, f"the model was not read: {problem}"
        shape = from_gguf(path) if fmt == "gguf" else from_hf_config(path)
        for key, got in (("embedding_length", shape.hidden_size), ("block_count", shape.num_layers)):
            if fmt == "gguf" and _positive_int(meta.get(key)) and meta[key] != got:
                return (
                    None,
                    None,
                    (
                        f"the model was not read: {path} here has {key} {got}, the recording's header says {meta[key]}: "
                        "another model"
                    ),
                )
    except UserError as e:
        return None, None, str(e)
    return shape, Layout(tp=tp, pp=pp), f"from the {kind or 'engine'}'s model {path}"


def _positive_int(v: Any) -> TypeGuard[int]:
    return isinstance(v, int) and not isinstance(v, bool) and v > 0


def local_model_problem(header: SessionHeader, path: str, fmt: str, meta: dict[str, Any]) -> str | None:
    """Why ``path`` on this machine cannot be taken for the model the recording ran (None: it can).

    The header keeps the host name, the start time, the model path and, for llama-server, the
    GGUF's size and metadata (``model_meta``). A GGUF whose header kept its size, hidden size and
    layer count is checked against those (size here; the other two once read, in
    :func:`from_engine`), on any host. Otherwise the file counts as the model that ran only when
    the recording was made on this host and the file (a directory's ``config.json``) has not
    changed since the recording began. Either way the path must be absolute.
    """
    import os
    import socket
    from datetime import datetime, timezone

    if not os.path.isabs(path):
        return f"{path!r} is not an absolute path (a hub name, or relative to the engine's working directory)"
    p = Path(path)
    target = p / "config.json" if fmt != "gguf" and p.is_dir() else p
    try:
        st = target.stat()
    except OSError:
        return None  # the reader says it cannot read it
    size = meta.get("file_bytes")
    if fmt == "gguf" and _positive_int(size) and size != st.st_size:
        return f"{path} here is {st.st_size} bytes, the recording's header says {size}: another file"
    if fmt == "gguf" and all(_positive_int(meta.get(k)) for k in _META_KEYS):
        return None  # size matched; hidden size and layer count are compared once read
    here = socket.gethostname()
    if header.host != here:
        kept = (
            "keeps no size and metadata of the model" if fmt == "gguf" else "keeps nothing about the model but its path"
        )
        return (
            f"the recording was made on host {header.host or '(unknown)'!r}, this is {here!r}, and its header {kept} "
            f"to check {path} here against"
        )
    try:
        began = datetime.fromisoformat(header.created.replace("Z", "+00:00"))
    except ValueError:
        return f"the recording's start time {header.created!r} is unreadable, so whether {target} changed since cannot be checked"
    if began.tzinfo is None:
        began = began.replace(tzinfo=timezone.utc)
    changed = datetime.fromtimestamp(st.st_mtime, timezone.utc)
    if changed > began:
        return (
            f"{target} was modified {changed.strftime('%Y-%m-%dT%H:%M:%SZ')}, after the recording began "
            f"({header.created}): it may not be the model that ran"
        )
    return None


def report_linkmodel(header: SessionHeader, samples: Iterable[Sample]) -> dict[str, Any]:
    """Predicted vs measured link bytes per token for a recording (``available``), or why not (``reason``)."""
    shape, layout, why = from_engine(header)
    if shape is None or layout is None:
        return {"available": False, "reason": why}
    g = header.gpus[0] if header.gpus else None
    ceiling = (g.link.measured_Bps or g.link.capacity_Bps) if g else None
    if not ceiling:
        return {"available": False, "reason": "the link's ceiling is unknown"}
    pred = predict(shape, layout, ceiling)
    pred["ceiling_label"] = "calibrated" if g and g.link.measured_Bps else "theoretical"
    compare_with_recording(pred, layout, header, samples)
    pred["available"] = True
    pred["source"] = why
    return pred
