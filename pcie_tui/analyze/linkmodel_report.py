"""The link budget for ``report``: the recording's own model and layout, from its header.

The header names the model by a path on the machine that recorded. The file at that path here is
read only when it is verifiably the model that ran (:func:`local_model_problem`); otherwise the model's
shape comes from what the header kept (:mod:`.linkmodel_header`), and where that lacks a field the
budget needs, the result says which.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeGuard

from pcie_tui.analyze.linkmodel import (
    Layout,
    MeasuredFold,
    ModelShape,
    compare_with_measured,
    from_gguf,
    from_hf_config,
    predict,
)
from pcie_tui.analyze.linkmodel_header import describe, from_meta, header_shape, missing_words
from pcie_tui.core.errors import UserError
from pcie_tui.core.model import Sample, SessionHeader
from pcie_tui.engines import registry
from pcie_tui.engines.base import Engine, WeightStream, default_parallelism

_META_KEYS = ("file_bytes", "embedding_length", "block_count")  # what a GGUF is checked by
_ACT_BYTES = {"f32": 4, "f16": 2, "bf16": 2}  # activation bytes of an HF model of that dtype


@dataclass(frozen=True)
class ModelSource:
    """The model a recording ran, as priced: ``shape`` and ``layout`` (None: unknown, ``reason`` says why),
    the shape ``fields`` known (:mod:`.linkmodel_header`'s names) and the recorded engine."""

    shape: ModelShape | None
    layout: Layout | None
    reason: str  # where the shape came from, or why there is none
    fields: dict[str, Any] = field(default_factory=dict)
    engine: Engine | None = None
    from_header: bool = False
    file_reason: str | None = None  # why the model file was not read (None: it was)


def from_engine(header: SessionHeader) -> ModelSource:
    """Model shape and layout from the attached engine's facts in the header (reason when unknown).

    The engine says what ``layout.model`` is (``Engine.model_format``: a model directory with
    config.json, or a GGUF file) and which tp/pp its layout implies (``Engine.parallelism``).
    The model path names a file on the machine that recorded; it is read here only when it can
    be checked to be that file (:func:`local_model_problem`). Otherwise the header's own record
    of the model's shape is used (:func:`.linkmodel_header.header_shape`).
    """
    eng: dict[str, Any] = header.engine if isinstance(header.engine, dict) else {}
    lay: dict[str, Any] = eng["layout"] if isinstance(eng.get("layout"), dict) else {}
    kind = eng.get("kind") if isinstance(eng.get("kind"), str) else None
    engine = registry.get(kind) if kind else None
    fmt = engine.model_format if engine is not None else "hf"
    if engine is not None:
        tp, pp = engine.parallelism(lay, max(1, len(header.gpus)))
    else:
        tp, pp = default_parallelism(lay)
    path = lay.get("model") or eng.get("model")
    fields, conflict = header_shape(header)
    if not isinstance(path, str) or not path:
        shape, why = None, "the engine's model path is unknown"
    else:
        shape, why = _read_model(header, path, fmt, eng)
    if shape is not None:
        meta = _gguf_fields(str(path)) if fmt == "gguf" else {}
        return ModelSource(shape, Layout(tp=tp, pp=pp), why, {**fields, **meta}, engine)
    if conflict or not eng:
        return ModelSource(None, None, f"{why}; {conflict}" if conflict else why)
    return _from_header(fields, fmt, Layout(tp=tp, pp=pp), engine, why, path)


def _read_model(header: SessionHeader, path: str, fmt: str, eng: dict[str, Any]) -> tuple[ModelShape | None, str]:
    """The model file's shape where it is verifiably the one that ran, else None and why not."""
    meta: dict[str, Any] = eng["model_meta"] if isinstance(eng.get("model_meta"), dict) else {}
    try:
        problem = local_model_problem(header, path, fmt, meta)
        if problem:
            return None, f"the model was not read: {problem}"
        shape = from_gguf(path) if fmt == "gguf" else from_hf_config(path)
        for key, got in (("embedding_length", shape.hidden_size), ("block_count", shape.num_layers)):
            if fmt == "gguf" and _positive_int(meta.get(key)) and meta[key] != got:
                return None, (
                    f"the model was not read: {path} here has {key} {got}, the recording's header says {meta[key]}: "
                    "another model"
                )
    except UserError as e:
        return None, str(e)
    return shape, f"from the {eng.get('kind') or 'engine'}'s model {path}"


def _gguf_fields(path: str) -> dict[str, Any]:
    from pcie_tui.core.gguf import gguf_meta

    return from_meta(gguf_meta(path) or {})


def _from_header(
    fields: dict[str, Any], fmt: str, layout: Layout, engine: Engine | None, file_why: str, path: Any
) -> ModelSource:
    """The shape the header kept (llama.cpp keeps activations in f32 between layers: 4 bytes; an HF
    model's are its dtype's), or why it cannot be priced: ``file_why`` and the fields it lacks."""
    need = ("n_embd", "n_layer") if fmt == "gguf" else ("n_embd", "n_layer", "dtype")
    missing = tuple(k for k in need if k not in fields)
    if missing:
        return ModelSource(None, None, f"{file_why}; {missing_words(missing)}", fields, engine)
    act = 4 if fmt == "gguf" else _ACT_BYTES.get(str(fields["dtype"]))
    if act is None:
        return ModelSource(
            None, None, f"{file_why}; the header's dtype {fields['dtype']} is not priced", fields, engine
        )
    name = Path(path).stem if isinstance(path, str) and path else "model"
    shape = ModelShape(int(fields["n_embd"]), int(fields["n_layer"]), act, name=name, source="the recording's header")
    return ModelSource(shape, layout, "model shape from the recording's header", fields, engine, True, file_why)


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
    lm = LinkModelReport(header)
    if lm.fold is not None:
        for s in samples:
            lm.fold.feed(s)
    return lm.result()


class LinkModelReport:
    """:func:`report_linkmodel` in two steps: the prediction from the header at once, then (where there
    is one, ``fold`` not None) the recording's ticks fed to ``fold``, then :meth:`result`."""

    def __init__(self, header: SessionHeader) -> None:
        self.header = header
        self.fold: MeasuredFold | None = None
        self._done: dict[str, Any] | None = None
        src = from_engine(header)
        self.src = src
        if src.shape is None or src.layout is None:
            self._done = {"available": False, "reason": src.reason}
            return
        eng: dict[str, Any] = header.engine if isinstance(header.engine, dict) else {}
        stream = src.engine.weight_stream(eng, src.fields) if src.engine is not None else None
        self.stream = stream
        if stream is not None and not stream.priced:
            self._done = {"available": False, "reason": _unpriced(stream, src)}
            return
        g = header.gpus[0] if header.gpus else None
        ceiling = (g.link.measured_Bps or g.link.capacity_Bps) if g else None
        if not ceiling:
            self._done = {"available": False, "reason": "the link's ceiling is unknown"}
            return
        host = (stream.bytes_per_microbatch, stream.ubatch) if stream is not None and stream.ubatch else None
        self.pred = predict(src.shape, src.layout, ceiling, host_microbatch=host)
        self.pred["ceiling_label"] = "calibrated" if g and g.link.measured_Bps else "theoretical"
        self.fold = MeasuredFold(header)

    def result(self) -> dict[str, Any]:
        if self._done is not None:
            return self._done
        src, stream, pred = self.src, self.stream, self.pred
        assert src.layout is not None and self.fold is not None  # noqa: S101 - no answer yet: there is a fold
        compare_with_measured(pred, src.layout, self.header, self.fold.result())
        pred["available"] = True
        used = stream.used if stream is not None else ()
        pred["source"] = f"{src.reason} ({describe(src.fields, used)})" if src.from_header else src.reason
        pred["model_file_reason"] = src.file_reason
        pred["host_weights"] = stream.to_json() if stream is not None else None
        self._done = pred
        return pred


def _unpriced(stream: WeightStream, src: ModelSource) -> str:
    """Why the host weights cannot be priced: the shape fields missing (and from where), or the problem."""
    if stream.missing:
        where = "the header" if src.from_header else "the model file (and the header)"
        words = missing_words(stream.missing, where)
        return f"{words}: needed to price {stream.what}, which cross the link once per micro-batch ({stream.ubatch_source})"
    return f"{stream.problem} (host weights: {stream.what})"
