"""Link budget: bytes per token over each GPU link for a model and a parallel layout.

Tensor parallel (Megatron style): every layer does 2 all-reduces (after
attention, after the MLP) of ``tokens x hidden x dtype_bytes``. A ring
all-reduce over N GPUs makes each GPU send (and receive) ``2(N-1)/N`` of that
buffer. Per GPU, per token, each direction::

    tp_bytes = 2 x layers x 2(N-1)/N x hidden x dtype_bytes

Pipeline parallel: each stage boundary hands ``tokens x hidden x dtype_bytes``
to the next stage once per forward step.

Time over a link of ceiling C bytes/s uses an alpha-beta model: each
all-reduce costs a fixed latency alpha (launch + sync + hops; ~20-40 us on
PCIe) plus bytes / C. Decode at small batch is therefore latency-bound:
``2 x layers`` all-reduces per step, whatever the width of the link.

Host weights: an engine that keeps weights in host memory and copies them to the GPU once per
prefill micro-batch (llama.cpp's op offload: ``Engine.weight_stream``) adds ``W / ub`` bytes per
prompt token on the host->GPU direction (``predict``'s ``host_microbatch``; docs/doctor.md "linkmodel").
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from pcie_tui.core.errors import UserError
from pcie_tui.core.model import EngineSample, Sample, SessionHeader
from pcie_tui.engines import registry
from pcie_tui.engines.base import default_parallelism

DTYPE_BYTES = {"float32": 4, "float": 4, "fp32": 4, "bfloat16": 2, "bf16": 2, "float16": 2, "fp16": 2, "half": 2}
# Default per all-reduce latency on PCIe (~20-40 us: launch + sync + hops; docs/whatif.md).
PCIE_ALLREDUCE_LATENCY_S = 25e-6


@dataclass(frozen=True, slots=True)
class ModelShape:
    hidden_size: int
    num_layers: int
    dtype_bytes: int  # bytes per activation element on the wire
    name: str = "model"
    source: str = "flags"


@dataclass(frozen=True, slots=True)
class Layout:
    tp: int = 1
    pp: int = 1
    batch: int = 1  # sequences decoded together per step
    prompt_tokens: int = 2048  # tokens per prefill


def tp_bytes_per_token(shape: ModelShape, tp: int) -> float:
    """Bytes each GPU sends (and receives) per token for tensor-parallel all-reduces."""
    if tp <= 1:
        return 0.0
    return 2 * shape.num_layers * 2 * (tp - 1) / tp * shape.hidden_size * shape.dtype_bytes


def pp_bytes_per_token(shape: ModelShape, pp: int) -> float:
    """Bytes crossing each pipeline stage boundary per token (activation hand-off)."""
    return float(shape.hidden_size * shape.dtype_bytes) if pp > 1 else 0.0


def allreduces_per_step(shape: ModelShape, tp: int) -> int:
    """All-reduces per forward step (any batch): 2 per layer on each pipeline stage's layers."""
    return 2 * shape.num_layers if tp > 1 else 0


def predict(
    shape: ModelShape,
    layout: Layout,
    ceiling_Bps: float,
    allreduce_latency_s: float = PCIE_ALLREDUCE_LATENCY_S,
    host_microbatch: tuple[float, int] | None = None,
) -> dict[str, Any]:
    """Bytes and link time per phase for one GPU's link at ``ceiling_Bps`` per direction.

    ``host_microbatch``: (bytes, tokens) of host-resident weights copied to the GPU once per prefill
    micro-batch of that many tokens (the engine's ``weight_stream``); a prefill step of P tokens copies
    them ceil(P / tokens) times, and a prompt token at full micro-batches costs bytes / tokens.
    """
    if ceiling_Bps <= 0:
        raise UserError("link ceiling must be positive")
    tpb = tp_bytes_per_token(shape, layout.tp)
    ppb = pp_bytes_per_token(shape, layout.pp)
    # Each stage holds num_layers / pp layers; all-reduces happen within a stage.
    stage_layers = shape.num_layers / max(1, layout.pp)
    n_ar = 2 * stage_layers if layout.tp > 1 else 0.0
    tp_stage = tpb / max(1, layout.pp)
    host_bytes, ub = host_microbatch if host_microbatch and host_microbatch[1] > 0 else (0.0, 0)
    out: dict[str, Any] = {
        "model": asdict(shape),
        "layout": asdict(layout),
        "ceiling_Bps": ceiling_Bps,
        "allreduce_latency_s": allreduce_latency_s,
        "tp_bytes_per_token": tp_stage,
        "pp_bytes_per_token": ppb,
        "allreduces_per_step": n_ar,
    }
    for phase, tokens in (("prefill", layout.prompt_tokens), ("decode", layout.batch)):
        host = host_bytes * math.ceil(tokens / ub) if phase == "prefill" and ub else 0.0
        link_bytes = (tp_stage + ppb) * tokens + host
        bw_s = link_bytes / ceiling_Bps
        lat_s = n_ar * allreduce_latency_s
        out[phase] = {
            "tokens_per_step": tokens,
            "bytes_per_step": link_bytes,
            "host_bytes_per_step": host,
            "bytes_per_token": tp_stage + ppb + (host_bytes / ub if phase == "prefill" and ub else 0.0),
            "bandwidth_time_s": bw_s,
            "latency_floor_s": lat_s,
            "link_time_s": bw_s + lat_s,
            "link_time_per_token_s": (bw_s + lat_s) / tokens if tokens else None,
            "latency_bound": lat_s > bw_s,
        }
    return out


# ---- model config readers ----------------------------------------------------


def from_hf_config(path: str | Path, dtype_bytes: int | None = None) -> ModelShape:
    """Read hidden size, layers and dtype from a vLLM/HF model directory's config.json."""
    p = Path(path)
    cfg_path = p / "config.json" if p.is_dir() else p
    try:
        cfg = json.loads(cfg_path.read_text())
    except (OSError, ValueError) as e:
        raise UserError(f"cannot read model config {cfg_path}: {e}") from e
    # Multimodal models nest the language model's config.
    text = cfg.get("text_config") or cfg.get("llm_config") or cfg
    hidden = text.get("hidden_size") or text.get("n_embd") or text.get("d_model")
    layers = text.get("num_hidden_layers") or text.get("n_layer") or text.get("num_layers")
    if not hidden or not layers:
        raise UserError(f"{cfg_path} has no hidden_size / num_hidden_layers")
    if dtype_bytes is None:
        dt = str(text.get("torch_dtype") or text.get("dtype") or cfg.get("torch_dtype") or "bfloat16")
        dtype_bytes = DTYPE_BYTES.get(dt.replace("torch.", ""), 2)
    return ModelShape(
        int(hidden), int(layers), dtype_bytes, name=p.name if p.is_dir() else p.parent.name, source=str(cfg_path)
    )


def from_gguf(path: str | Path, dtype_bytes: int = 4) -> ModelShape:
    """Read ``<arch>.embedding_length`` / ``<arch>.block_count`` from a GGUF file.

    llama.cpp keeps activations in f32 between layers, hence 4 bytes by default.
    """
    # The header's key/values only, bounded (pcie_tui/core/gguf.py): the gguf package's reader maps
    # and indexes every tensor, and a corrupt file of a model's size once took it to 13 GB of memory.
    from pcie_tui.core.gguf import gguf_meta

    if not Path(path).is_file():
        raise UserError(f"cannot read GGUF {path}: no such file")
    meta = gguf_meta(str(path), name=True)
    if meta is None:
        raise UserError(f"cannot read GGUF {path}: not a readable GGUF header")
    arch = meta.get("arch")
    if not arch:
        raise UserError(f"{path} has no general.architecture")
    hidden = meta.get("embedding_length")
    layers = meta.get("block_count")
    if hidden is None or layers is None:
        raise UserError(f"{path} lacks {arch}.embedding_length / {arch}.block_count")
    name = meta.get("name") or Path(path).stem
    return ModelShape(int(hidden), int(layers), dtype_bytes, name=str(name), source=str(path))


# ---- comparison with a recording ----------------------------------------------


def measured_bytes_per_token(header: SessionHeader, samples: Iterable[Sample]) -> dict[str, Any]:
    """Per phase and GPU: link bytes moved (busier direction, PCIe + NVLink) and tokens the engine counted.

    Tokens, in order of preference:

    * per-request counts (llama-server): its cumulative counters move only when a
      request ends, usually in a later tick of another phase, so per-tick deltas
      would credit the tokens to the wrong phase. Its ticks carry the finished
      requests (``engine.extra["requests"]``, each with ``prompt_n`` /
      ``predicted_n``); prefill gets the prompt tokens of every request that
      finished in the recording, decode their generated tokens.
    * the engine's cumulative counters, tick by tick (vLLM updates them each step).

    ``tokens`` is None when unknown, with ``tokens_reason`` saying why.
    """
    fold = MeasuredFold(header)
    for s in samples:
        fold.feed(s)
    return fold.result()


class MeasuredFold:
    """:func:`measured_bytes_per_token` one tick at a time (a long recording streams through it)."""

    def __init__(self, header: SessionHeader) -> None:
        self.acc: dict[str, dict[str, Any]] = {}
        self.prev: Sample | None = None
        self.engine_seen = header.engine is not None
        self.counters_seen = False
        self.requests: dict[Any, tuple[float, float]] = {}  # request key -> (prompt tokens, generated tokens)

    def feed(self, s: Sample) -> None:
        if s.engine is not None:
            self.engine_seen = True
            if s.engine.prompt_tokens_total is not None or s.engine.generation_tokens_total is not None:
                self.counters_seen = True
            _note_request_tokens(s.t, s.engine, self.requests)
        if self.prev is not None:
            _add_tick(self.acc, self.prev, s)
        self.prev = s

    def result(self) -> dict[str, Any]:
        out: dict[str, Any] = {}
        for phase, a in self.acc.items():
            tokens, basis, reason = _phase_tokens(phase, a, self.engine_seen, self.counters_seen, self.requests)
            per_gpu = {}
            for idx, b in sorted(a["bytes"].items()):
                per_gpu[idx] = {
                    "bytes": b,
                    "mean_Bps": b / a["seconds"],
                    "bytes_per_token": (b / tokens) if tokens else None,
                }
            out[phase] = {
                "seconds": a["seconds"],
                "ticks": a["ticks"],
                "tokens": tokens or None,
                "tokens_basis": basis if tokens else None,
                "tokens_reason": None if tokens else reason,
                "gpus": per_gpu,
            }
        return out


def _note_request_tokens(t: float, engine: EngineSample, requests: dict[Any, tuple[float, float]]) -> None:
    """Record the prompt and generated token counts of the finished requests a tick at ``t`` carries
    (``engine.extra["requests"]``), each under its key (``seq``, else the tick's time and position)."""
    for i, r in enumerate(engine.extra.get("requests") or ()):
        if not isinstance(r, dict):
            continue
        pn, gn = r.get("prompt_n", r.get("prompt_tokens")), r.get("predicted_n", r.get("generation_tokens"))
        if isinstance(pn, (int, float)) or isinstance(gn, (int, float)):
            key = r.get("seq") if r.get("seq") is not None else (t, i)
            requests[key] = (float(pn or 0), float(gn or 0))


def _add_tick(acc: dict[str, dict[str, Any]], prev: Sample, s: Sample) -> None:
    """Add the time since ``prev``, each GPU's link bytes over it and the engine counters' increases to
    the tally of the phase of tick ``s`` (ticks without a phase or going back in time are left out)."""
    dt = s.t - prev.t
    phase = _phase(s)
    if not (phase and dt > 0):
        return
    a = acc.setdefault(phase, {"seconds": 0.0, "ticks": 0, "bytes": {}, "prompt_tokens": 0.0, "gen_tokens": 0.0})
    a["seconds"] += dt
    a["ticks"] += 1
    for g in s.gpus:
        b = _dir_max(g.pcie_tx_Bps, g.pcie_rx_Bps) + _dir_max(g.nvlink_tx_Bps, g.nvlink_rx_Bps)
        a["bytes"][g.index] = a["bytes"].get(g.index, 0.0) + b * dt
    if s.engine is not None and prev.engine is not None:
        a["prompt_tokens"] += _delta(prev.engine.prompt_tokens_total, s.engine.prompt_tokens_total)
        a["gen_tokens"] += _delta(prev.engine.generation_tokens_total, s.engine.generation_tokens_total)


def _phase_tokens(
    phase: str,
    a: dict[str, Any],
    engine_seen: bool,
    counters_seen: bool,
    requests: dict[Any, tuple[float, float]],
) -> tuple[float | None, str | None, str | None]:
    """The tokens of one phase's tally ``a`` (per-request counts where there are any, else the engine's
    counters), with their basis and, where they are unknown or zero, the reason."""
    tokens: float | None
    reason: str | None = None
    basis: str | None = None
    if phase not in ("prefill", "decode"):
        tokens, reason = None, f"tokens are counted for prefill and decode only, not {phase!r} ticks"
    elif not engine_seen:
        tokens, reason = None, "no engine attached to the recording"
    elif requests:
        k = 0 if phase == "prefill" else 1
        tokens = sum(v[k] for v in requests.values())
        basis = f"token counts of {count(len(requests), 'finished request')}"
        if not tokens:
            reason = f"the {count(len(requests), 'finished request')} counted no " + (
                "prompt tokens" if phase == "prefill" else "generated tokens"
            )
    elif not counters_seen:
        tokens, reason = None, "the engine reported no token counters"
    else:
        tokens = a["prompt_tokens"] if phase == "prefill" else a["gen_tokens"]
        basis = "engine counters, tick by tick"
        if not tokens:
            reason = f"the engine's counters did not move during {phase} ticks"
    return tokens, basis, reason


def compare(prediction: dict[str, Any], measured: dict[str, Any]) -> dict[str, Any]:
    """Measured bytes/token against predicted, per phase and GPU (ratio > 1: more traffic than the model)."""
    out: dict[str, Any] = {}
    for phase in ("prefill", "decode"):
        m = measured.get(phase)
        if not m:
            continue
        predicted_bpt = prediction[phase]["bytes_per_token"]
        rows = {}
        for idx, g in m["gpus"].items():
            bpt = g["bytes_per_token"]
            rows[idx] = {
                "measured_bytes_per_token": bpt,
                "tokens_reason": m.get("tokens_reason"),
                "predicted_bytes_per_token": predicted_bpt,
                "ratio": (bpt / predicted_bpt) if bpt is not None and predicted_bpt > 0 else None,
            }
        out[phase] = rows
    return out


def recorded_parallelism(header: SessionHeader) -> tuple[int, int] | None:
    """(tp, pp) the recording's engine ran with (its layout over the recorded GPUs), or None without an engine."""
    eng: dict[str, Any] = header.engine if isinstance(header.engine, dict) else {}
    lay = eng.get("layout")
    if not isinstance(lay, dict):  # no engine, or one whose flags were not read: its layout is unknown
        return None
    kind = eng.get("kind")
    engine = registry.get(kind) if isinstance(kind, str) else None
    n_gpus = max(1, len(header.gpus))
    return engine.parallelism(lay, n_gpus) if engine is not None else default_parallelism(lay)


def layout_mismatch(header: SessionHeader, layout: Layout) -> str | None:
    """Why the recording's GPU layout is not the modelled one (None when it may be).

    The engine's own layout (tp/pp from its flags, ``Engine.parallelism``) decides where the
    header has one; without an engine only the GPU count can rule a layout out.
    """
    n = len(header.gpus)
    gpus = count(n, "GPU")
    rec = recorded_parallelism(header)
    if rec is not None:
        tp, pp = rec
        if (tp, pp) != (layout.tp, layout.pp):
            kind = (header.engine or {}).get("kind") or "engine"
            return (
                f"the recording's {kind} ran TP={tp} PP={pp} on {gpus}, the model is TP={layout.tp} PP={layout.pp}: "
                f"its link bytes are not this layout's (model --tp {tp} --pp {pp}, or record the layout you model)"
            )
        return None
    need = layout.tp * layout.pp
    if n < need:
        return (
            f"the recording watched {gpus}, TP={layout.tp} PP={layout.pp} needs {count(need, 'GPU')}: "
            "its link bytes are not this layout's"
        )
    return None


def no_comparison_reason(measured: dict[str, Any]) -> str | None:
    """Why no phase of the recording can be compared (None when prefill or decode ticks exist)."""
    if any(ph in measured for ph in ("prefill", "decode")):
        return None
    if not measured:
        return "the recording has no labelled ticks (no engine phase or label): nothing to count bytes per token over"
    return (
        "the recording has no prefill or decode ticks (its phases: "
        + ", ".join(measured)
        + "): bytes per token are counted over an engine's prefill and decode only"
    )


def compare_with_recording(
    prediction: dict[str, Any], layout: Layout, header: SessionHeader, samples: Iterable[Sample]
) -> None:
    """Add ``measured``, ``comparison`` and ``comparison_reason`` (why there is none, else None) to ``prediction``."""
    compare_with_measured(prediction, layout, header, measured_bytes_per_token(header, samples))


def compare_with_measured(
    prediction: dict[str, Any], layout: Layout, header: SessionHeader, measured: dict[str, Any]
) -> None:
    """:func:`compare_with_recording` with the recording's bytes per token already measured."""
    prediction["measured"] = measured
    why = layout_mismatch(header, layout) or no_comparison_reason(measured)
    prediction["comparison"] = {} if why else compare(prediction, measured)
    prediction["comparison_reason"] = why


def _plural(n: float, word: str) -> str:
    return word if n == 1 else word + "s"


def count(n: float, word: str) -> str:
    """'1 token', '2 tokens', '1.5 ticks'."""
    return f"{n:g} {_plural(n, word)}"


def _phase(s: Sample) -> str | None:
    if s.engine is not None and s.engine.phase:
        return s.engine.phase
    label = s.extra.get("label")
    return label if isinstance(label, str) else None


def _dir_max(a: float | None, b: float | None) -> float:
    vals = [v for v in (a, b) if v is not None]
    return max(vals) if vals else 0.0


def _delta(a: float | None, b: float | None) -> float:
    if a is None or b is None or b < a:  # missing or the engine restarted
        return 0.0
    return b - a
