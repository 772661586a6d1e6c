"""vLLM: what its settings do to the bus, and what to change; every cause rests on a fact with its source.

The facts (:mod:`.runtime`): weight offload (``--cpu-offload-gb`` for the UVA backend,
``--offload-group-size`` / ``--offload-num-in-group`` for prefetch), whether those weights are
pinned (``VLLM_WEIGHT_OFFLOADING_DISABLE_PIN_MEMORY``), the KV connector that keeps KV blocks in
host memory (``--kv-offloading-size`` / ``--kv-offloading-backend``, ``--kv-transfer-config``;
older ``--swap-space``), prefix caching; and, per phase, the engine's own counters
(:class:`~pcie_tui.engines.base.FindingFacts`): its KV offload bytes (``vllm:kv_offload_load_bytes``,
``vllm:kv_offload_store_bytes``) and prefix-cache hit rate (``vllm:prefix_cache_hits`` /
``vllm:prefix_cache_queries``). A fact not readable is unknown and no cause rests on it.
``--tensor-parallel-size`` splits each layer across GPUs: two all-reduces per layer over NVLink or PCIe.
No vLLM GPU session has been recorded for this project yet: these rules are tested on synthetic findings.
"""

from __future__ import annotations

from typing import Any

from pcie_tui.core.units import rate as fmt_rate
from pcie_tui.engines.base import Advice, EngineFacts, FindingFacts, Layout, RuntimeFact, typed
from pcie_tui.engines.vllm import runtime

_VALUE_FLAGS = {
    "--cpu-offload-gb": "cpu_offload_gb",
    "--kv-offloading-size": "kv_offloading_size",
    "--swap-space": "swap_space",
    "--tensor-parallel-size": "tp",
    "-tp": "tp",
    "--max-num-batched-tokens": "max_num_batched_tokens",
    "--load-format": "load_format",
}


def parse_flags(argv: list[str]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for i, a in enumerate(argv):
        flag, eq, val = a.partition("=")
        if flag in _VALUE_FLAGS and (eq or i + 1 < len(argv)):
            v = val if eq else argv[i + 1]
            try:
                out[_VALUE_FLAGS[flag]] = float(v) if "." in v else int(v)
            except ValueError:
                out[_VALUE_FLAGS[flag]] = v
    return out


def facts(engine_info: dict[str, Any]) -> EngineFacts:
    argv = [str(a) for a in typed(engine_info, "cmdline", list, [])]
    f = parse_flags(argv)
    layout: dict[str, Any] = typed(engine_info, "layout", dict, {})
    tp: Any = f.get("tp") or layout.get("tensor_parallel_size") or layout.get("tp")
    tp = tp if type(tp) in (int, float) and 0 < tp < 4096 else None
    off, pinned, kv, prefix = runtime.facts(argv, runtime.environ(layout))
    host_weights = f"{off.value} ({off.source})" if off.value not in (None, "none") else None
    kv_moves = isinstance(kv.value, str) and kv.value != "none" and not kv.value.startswith("none ")
    load = f.get("load_format")
    return EngineFacts(
        kind="vllm",
        host_weights=host_weights,
        host_pinned=pinned.value if host_weights else None,
        host_memory_why=f"pinned: {'unknown' if pinned.value is None else pinned.value} ({pinned.source})"
        if host_weights
        else None,
        kv_on_host=f"KV cache blocks in host memory: {kv.value} ({kv.source})" if kv_moves else None,
        tensor_parallel=int(tp) if tp is not None else None,
        load_mode=str(load) if load is not None else None,
        layout=Layout(
            tensor_parallel=int(tp) if tp is not None else None,
            pipeline_parallel=_size(layout, "pipeline_parallel_size"),
            data_parallel=_size(layout, "data_parallel_size"),
        ),
        flags=f,
        runtime=(off, pinned, kv, prefix),
    )


def _size(layout: dict[str, Any], key: str) -> int | None:
    """A parallel size of the recorded layout (None where it has none)."""
    v = layout.get(key)
    return v if isinstance(v, int) and not isinstance(v, bool) and 0 < v < 4096 else None


# The engine's KV offload bytes below this share of the link's rate: not what loads the link.
KV_SHARE_MIN = 0.10
PREFIX_HIT_MIN = 0.10  # a prefill phase whose prefix-cache hit rate is at least this gets the note
QUIET_LINK = 0.10  # share of a phase's time bound by the link below which it counts as quiet


def advise(fx: EngineFacts, finding: FindingFacts) -> list[Advice]:
    bound = finding.bound
    if finding.phase == "housekeeping":
        return [_housekeeping_advice(fx, finding)]
    out: list[Advice] = []
    off = fx.fact("weight_offload")
    if bound in ("link", "transfer") and fx.host_weights and off is not None:
        out.append(_weight_advice(fx, finding, off))
    elif bound in ("link", "transfer") and fx.kv_on_host and _kv_moves_enough(finding):
        out.append(_kv_advice(fx, finding))
    elif bound == "link" and (fx.tensor_parallel or 1) > 1:
        tp = fx.tensor_parallel
        said = f"flag --tensor-parallel-size {tp}" if fx.flags.get("tp") else f"layout tensor_parallel_size {tp}"
        out.append(
            Advice(
                cause=f"tensor parallelism over {tp} GPUs ({said}): two all-reduces per layer cross the link",
                fix="a faster GPU-to-GPU path (NVLink bridge, both GPUs on CPU lanes at x16), or pipeline "
                "parallelism (-pp), which sends one activation per stage instead",
                evidence=(said,),
            )
        )
    note = _prefix_note(finding)
    if note is not None:
        out.append(note)
    return out


def _kv_moves_enough(finding: FindingFacts) -> bool:
    """The engine's own KV offload bytes do not rule it out: unknown, or at least KV_SHARE_MIN of the link's rate."""
    eng, link = finding.engine_offload_Bps, finding.link_Bps
    return eng is None or not link or eng >= KV_SHARE_MIN * link


def _engine_bytes(finding: FindingFacts) -> str | None:
    """The engine's KV offload bytes/s in this phase with NVML's beside them, as evidence."""
    if finding.engine_offload_Bps is None:
        return None
    nvml = finding.nvml_pcie_Bps
    seen = f"; NVML PCIe RX + TX {fmt_rate(nvml)} over the same ticks" if nvml is not None else ""
    return (
        f"/metrics vllm:kv_offload_load_bytes + vllm:kv_offload_store_bytes: {fmt_rate(finding.engine_offload_Bps)} "
        f"host<->device in this phase{seen}"
    )


def _weight_advice(fx: EngineFacts, finding: FindingFacts, off: RuntimeFact) -> Advice:
    """Weights kept in CPU memory (UVA or prefetch offload) load the link every forward pass."""
    pin = fx.fact("weights_pinned")
    ev = tuple(x for x in (f"weight offload: {off.value} ({off.source})", fx.host_memory_why) if x)
    if finding.bound == "transfer" and pin is not None and pin.value is False:
        return Advice(
            cause=f"offloaded weights ({off.value}) are copied from pageable memory ({pin.source}): the driver "
            "stages every copy, so the link runs below its capacity",
            fix="unset VLLM_WEIGHT_OFFLOADING_DISABLE_PIN_MEMORY (vLLM then pins offloaded weights)",
            evidence=ev,
            short=f"offloaded weights copied from pageable memory ({pin.source})",
        )
    if str(off.value).startswith("prefetch"):
        fix = (
            "offload fewer layers: lower --offload-num-in-group or raise --offload-group-size "
            f"({off.source.removeprefix('flag ')}) if memory allows; a larger --offload-prefetch-step only "
            "starts the same copies earlier"
        )
        cause = f"{off.value} stay in CPU memory and are copied to the GPU in every forward pass"
    else:
        gb = fx.flags.get("cpu_offload_gb")
        fix = (
            f"lower --cpu-offload-gb (now {gb}) if memory allows, or spread the model over more GPUs with -tp; the "
            "prefetch backend (--offload-group-size, --offload-num-in-group) copies whole layers ahead instead "
            "of reading them during the pass"
        )
        cause = f"{off.value} of weights stay in CPU memory and are read over the link in every forward pass (UVA)"
    return Advice(cause=f"{cause} ({off.source})", fix=fix, evidence=ev, short=f"weight offload {off.value}")


def _kv_advice(fx: EngineFacts, finding: FindingFacts) -> Advice:
    """KV blocks offloaded to host memory come back over the link when a prefix is reused."""
    measured = _engine_bytes(finding)
    return Advice(
        cause=f"{fx.kv_on_host}: blocks move over PCIe when stored and when a reused prefix is loaded back",
        fix="give the GPU KV cache more room (--gpu-memory-utilization, a smaller --max-model-len) so fewer "
        "blocks leave it, or a smaller --kv-offloading-size",
        evidence=tuple(x for x in (fx.kv_on_host, measured) if x),
        short="KV offload traffic"
        + (f" ({fmt_rate(finding.engine_offload_Bps)} by vLLM's counters)" if measured else ""),
    )


def _prefix_note(finding: FindingFacts) -> Advice | None:
    """A prefill quiet on the link with prefix-cache hits: cached prompt tokens move no bytes."""
    rate = finding.prefix_cache_hit_rate
    if finding.phase not in ("prefill", "mixed") or finding.bound in ("link", "transfer") or rate is None:
        return None
    if rate < PREFIX_HIT_MIN or finding.shares.get("link", 0.0) >= QUIET_LINK:
        return None
    said = "/metrics vllm:prefix_cache_hits / vllm:prefix_cache_queries over this phase"
    return Advice(
        cause=f"{rate * 100:.0f}% of the prompt tokens looked up were prefix-cache hits ({said}): their KV blocks "
        "were already on the GPU, so their prefill computed and moved nothing, and the link stays quiet for them",
        fix=None,
        evidence=(f"prefix-cache hit rate {rate * 100:.0f}% ({said})",),
        short=f"{rate * 100:.0f}% of prompt tokens were prefix-cache hits",
    )


_DIRS = (("d2h", "GPU->host", "store", "vllm:kv_offload_store_bytes / _store_time"),
         ("h2d", "host->GPU", "load", "vllm:kv_offload_load_bytes / _load_time"))  # fmt: skip


def _housekeeping_advice(fx: EngineFacts, finding: FindingFacts) -> Advice:
    """Requests held up by vLLM's own work (the tick's ``own_work``, :mod:`.client`): preemption (the scheduler
    ran out of KV blocks, took a running request's and queued it to be recomputed) and KV offload copies a
    request waits on. Priced by the engine's counters: its preemptions, and per direction its bytes, copy
    seconds and rate against the pinned ceiling, with NVML's PCIe bytes over the same ticks beside them."""
    n = finding.preemptions
    pre = f"{n:g} preemptions (/metrics vllm:num_preemptions over this phase)" if n else None
    moved = _copy_words(finding)
    if not n and not moved:  # neither counter rose over the phase's ticks: what the work was is not known
        return Advice(
            cause="vLLM's own work while requests waited; its counters over this phase show neither a preemption "
            "nor a KV offload copy, so what it was is not known",
            fix=None,
            short="vLLM's own work while requests waited (cause not known)",
        )
    what = "preemption and recompute" if n else "KV offload copies"
    cause = (
        f"vLLM's own work while requests waited: {what} ("
        + ("the KV cache ran out of blocks: a running request's blocks were freed and it was queued to be "
           "computed again" if n else "blocks copied between GPU and host memory that waiting requests need")
        + (f"; {fx.kv_on_host}" if fx.kv_on_host else "") + ")"
    )  # fmt: skip
    fix = (
        "give the KV cache more blocks (a higher --gpu-memory-utilization, a smaller --max-model-len) or admit "
        "fewer requests at once (--max-num-seqs, --max-num-batched-tokens)"
        + ("; with --kv-offloading-size set, preempted blocks come back from host memory instead of being "
           "recomputed" if n and not fx.kv_on_host else "")
    )  # fmt: skip
    return Advice(
        cause=cause,
        fix=fix,
        evidence=tuple(x for x in (pre, moved, _copy_link(finding), _vram(finding)) if x),
        short=f"vLLM's own {what} while requests waited",
    )


def _copy_words(f: FindingFacts) -> str | None:
    """The engine's KV copies over the phase per direction: bytes, its own rate and against the pinned ceiling."""
    c = f.engine_copies
    if not c:
        return None
    parts = []
    for d, words, verb, said in _DIRS:
        x = c.get(d) or {}
        b = x.get("bytes")
        if not b:
            continue
        r = x.get("Bps")
        of = f", {r / f.pinned_ceiling_Bps:.0%} of the pinned ceiling" if r and f.pinned_ceiling_Bps else ""
        at = f" at {fmt_rate(r)} (its own copy time){of}" if r else ""
        parts.append(f"{verb} {words} {b / 1e6:.1f} MB{at} ({said})")
    return "KV offload in this phase: " + "; ".join(parts) if parts else None


def _copy_link(f: FindingFacts) -> str | None:
    """NVML's PCIe bytes over the same ticks as the engine's (engine_bytes intervals), where both exist."""
    if f.nvml_pcie_Bps is None or f.engine_offload_Bps is None:
        return None
    return (
        f"NVML PCIe RX + TX {fmt_rate(f.nvml_pcie_Bps)} vs vLLM's {fmt_rate(f.engine_offload_Bps)} over the same ticks"
    )


def _vram(f: FindingFacts) -> str | None:
    if f.vram_used_bytes is None or not f.vram_total_bytes:
        return None
    return f"VRAM {f.vram_used_bytes / 1e9:.1f} of {f.vram_total_bytes / 1e9:.1f} GB in use"
