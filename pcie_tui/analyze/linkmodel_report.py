"""The link budget for ``report``: the recording's own model and layout, from its header."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from pcie_tui.analyze.linkmodel import (
    Layout,
    ModelShape,
    compare_with_recording,
    from_gguf,
    from_hf_config,
    predict,
)
from pcie_tui.engines import registry
from pcie_tui.engines.base import default_parallelism
from pcie_tui.errors import UserError
from pcie_tui.model import Sample, SessionHeader


def from_engine(header: SessionHeader) -> tuple[ModelShape | None, Layout | None, str]:
    """Model shape and layout from the attached engine's facts in the header (reason when unknown).

    The engine says what ``layout.model`` is (``Engine.model_format``: a model directory with
    config.json, or a GGUF file) and which tp/pp its layout implies (``Engine.parallelism``).
    """
    eng: dict[str, Any] = header.engine if isinstance(header.engine, dict) else {}
    lay: dict[str, Any] = eng["layout"] if isinstance(eng.get("layout"), dict) else {}
    path = lay.get("model") or eng.get("model")
    if not isinstance(path, str) or not path:
        return None, None, "the engine's model path is unknown"
    n_gpus = max(1, len(header.gpus))
    try:
        engine = registry.get(eng.get("kind")) if isinstance(eng.get("kind"), str) else None
        fmt = engine.model_format if engine is not None else "hf"
        shape = from_gguf(path) if fmt == "gguf" else from_hf_config(path)
        tp, pp = engine.parallelism(lay, n_gpus) if engine is not None else default_parallelism(lay)
        layout = Layout(tp=tp, pp=pp)
    except UserError as e:
        return None, None, str(e)
    return shape, layout, f"from the {eng.get('kind') or 'engine'}'s model {path}"


def report_linkmodel(header: SessionHeader, samples: Iterable[Sample]) -> dict[str, Any] | None:
    """Predicted vs measured link bytes per token for a recording, or None when the model is unknown."""
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
