"""vLLM: what its flags do to the bus, and what to change.

From vLLM's engine arguments (vllm/engine/arg_utils.py, docs "Engine Arguments"):
``--cpu-offload-gb N`` keeps N GiB of weights per GPU in CPU memory and streams them to the GPU
in every forward pass; ``--kv-offloading-size`` / ``--kv-offloading-backend`` (and the older
``--swap-space``) put KV cache blocks in CPU memory; ``--tensor-parallel-size`` splits each
layer across GPUs, two all-reduces per layer over NVLink or PCIe.
No vLLM GPU session has been recorded for this project yet: these rules rest on the flags and on
the attribution's evidence, and are tested on synthetic findings only.
"""

from __future__ import annotations

from typing import Any

from pcie_tui.engines.base import Advice, EngineFacts, FindingFacts, Layout, typed

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
    argv: list[Any] = typed(engine_info, "cmdline", list, [])
    f = parse_flags([str(a) for a in argv])
    layout: dict[str, Any] = typed(engine_info, "layout", dict, {})
    tp: Any = f.get("tp") or layout.get("tensor_parallel_size") or layout.get("tp")
    tp = tp if type(tp) in (int, float) and 0 < tp < 4096 else None
    off = f.get("cpu_offload_gb")
    kv = f.get("kv_offloading_size")
    load = f.get("load_format")
    return EngineFacts(
        kind="vllm",
        host_weights=f"{off} GiB of weights per GPU (--cpu-offload-gb {off})" if off else None,
        host_pinned=True if off else None,  # vLLM allocates its CPU-offloaded weights pinned
        host_memory_why="vLLM pins CPU-offloaded weights" if off else None,
        kv_on_host=f"--kv-offloading-size {kv}: KV cache blocks in CPU memory" if kv else None,
        tensor_parallel=int(tp) if tp is not None else None,
        load_mode=str(load) if load is not None else None,
        layout=Layout(
            tensor_parallel=int(tp) if tp is not None else None,
            pipeline_parallel=_size(layout, "pipeline_parallel_size"),
            data_parallel=_size(layout, "data_parallel_size"),
        ),
        flags=f,
    )


def _size(layout: dict[str, Any], key: str) -> int | None:
    """A parallel size of the recorded layout (None where it has none)."""
    v = layout.get(key)
    return v if isinstance(v, int) and not isinstance(v, bool) and 0 < v < 4096 else None


def advise(fx: EngineFacts, finding: FindingFacts) -> list[Advice]:
    bound = finding.bound
    out: list[Advice] = []
    if bound in ("link", "transfer") and fx.host_weights:
        out.append(
            Advice(
                cause=f"{fx.host_weights} are streamed to the GPU in every forward pass",
                fix="lower --cpu-offload-gb (or spread the model over more GPUs with -tp) if memory allows",
                evidence=(f"--cpu-offload-gb {fx.flags.get('cpu_offload_gb')} on the command line",),
            )
        )
    elif bound in ("link", "transfer") and fx.kv_on_host:
        out.append(
            Advice(
                cause=fx.kv_on_host + ", moved over PCIe when reused",
                fix="give the GPU KV cache more room (--gpu-memory-utilization) or a smaller offload size",
                evidence=(fx.kv_on_host,),
            )
        )
    elif bound == "link" and (fx.tensor_parallel or 1) > 1:
        out.append(
            Advice(
                cause=f"tensor parallelism over {fx.tensor_parallel} GPUs: two all-reduces per layer cross the link",
                fix="a faster GPU-to-GPU path (NVLink bridge, both GPUs on CPU lanes at x16), or pipeline "
                "parallelism (-pp), which sends one activation per stage instead",
                evidence=(f"--tensor-parallel-size {fx.tensor_parallel}",),
            )
        )
    return out
