"""What a llama-server did at load, each with its source: its log where the log says it, its flags
and environment (:mod:`.flags`) only where it does not. A flag is an ask, not a fact.

From llama.cpp b11434's source:

* Load mode (``src/llama-model-loader.cpp``): mmap for ``auto``, ``mmap``, ``mmap+mlock``; not for
  ``none``, ``mlock``, ``dio``. ``load_tensors`` prints ``loading model tensors, this can take a
  while... (load_mode = X)``, with ``auto`` resolved to ``mmap`` or ``none``.
* Where host weights live (``src/llama-model.cpp`` ``make_cpu_buft_list``, the loader's buffer
  choice): the CPU buffer list starts with the GPU backend's host buffer type (``CUDA_Host``:
  ``cudaMallocHost``, pinned) unless ``--no-host``; with mmap the loader replaces the host buffer
  type by the CPU one and maps the file (``CPU_Mapped``, pageable). So ``none``, ``mlock`` and
  ``dio`` put host weights in pinned memory, the mmap modes in pageable file pages (mlock locks
  them but does not register them with CUDA). ``GGML_CUDA_NO_PINNED`` set to anything (ggml-cuda
  checks ``getenv() != NULL``) makes ``cudaMallocHost`` never called: the host buffer falls back to
  a plain ``CPU`` buffer, pageable.
* ``load_tensors: %12s model buffer size = %8.2f MiB`` per buffer (older builds:
  ``llm_load_tensors: ... buffer size``): ``CUDA_Host`` (or another ``*_Host``) is pinned host
  memory; ``CPU``, ``CPU_Mapped``, ``CPU_REPACK``, ``AMX`` are pageable host memory; the rest
  (``CUDA0``) device memory.
* ``load_tensors: offloaded N/M layers to GPU``: M is the repeating layers plus the output layer;
  ``-ngl N`` puts the output layer and the last N - 1 repeating layers on the GPU (the input layer
  always stays on the CPU). ``-ngl auto`` (the default) with ``--fit on`` (the default) lets
  ``common/fit.cpp`` choose the layers by free memory, unless ``-ngl``, ``-ts`` or a tensor override
  was given; ``-ngl auto`` otherwise, and ``-ngl all``, is every layer.
* Op offload (``ggml-backend.cpp``, ``ggml-cuda.cu``): with ``--op-offload`` (the default) an op
  on host weights runs on the GPU, its weights copied over, when its batch is at least
  ``GGML_OP_OFFLOAD_MIN_BATCH`` (default 32); ``--no-op-offload`` keeps it on the CPU.

These library lines print at ``-lv 4`` only (``common/log.cpp`` maps library INFO to trace); at
the default verbosity only the loader's mmap warning appears, and the flags stand in.
"""

from __future__ import annotations

import re
from typing import Any

from pcie_tui.engines.base import RuntimeFact

MMAP_WARNING = "mmap enabled - consider using --load-mode none"
DEFAULT_OP_OFFLOAD_MIN_BATCH = 32  # ggml-cuda.cu: GGML_OP_OFFLOAD_MIN_BATCH unset
_LOAD_MODE = re.compile(r"loading model tensors.*\(load_mode = (?P<mode>[\w+]+)\)")
_BUFFER = re.compile(
    r"load_tensors:\s+(?P<name>[A-Za-z][\w.-]*)\s+(?:model\s+)?buffer size\s*=\s*(?P<mib>[\d.]+)\s*MiB"
)
_OFFLOADED = re.compile(r"offloaded (?P<n>\d+)/(?P<m>\d+) layers to GPU")
_PAGEABLE_HOST = ("CPU", "AMX", "KLEIDIAI")  # names that start so: plain host memory
_PINNED_MODES = ("none", "mlock", "dio")
_MMAP_MODES = ("auto", "mmap", "mmap+mlock")


def _quote(m: re.Match[str]) -> str:
    return "log: '" + " ".join(m.group(0).split()) + "'"


def model_buffers(lines: list[str]) -> list[tuple[str, float, str]]:
    """``(buffer name, MiB, source)`` of each ``model buffer size`` line."""
    out = []
    for x in lines:
        m = _BUFFER.search(x)
        if m is not None:
            quoted = " ".join(x[m.start("name") : m.end()].split())
            out.append((m.group("name"), float(m.group("mib")), f"log: '{quoted}'"))
    return out


def buffer_kind(name: str) -> str:
    """``pinned``, ``pageable`` (host memory) or ``device`` for a ggml buffer name."""
    if name.endswith("_Host"):
        return "pinned"
    return "pageable" if name.upper().startswith(_PAGEABLE_HOST) else "device"


def load_mode(f: dict[str, Any], src: dict[str, str], lines: list[str]) -> RuntimeFact:
    """The load mode: the loader's own line, else ``-lm``/``LLAMA_ARG_LOAD_MODE``, else the old switches."""
    for x in lines:
        m = _LOAD_MODE.search(x)
        if m is not None:
            return RuntimeFact("load_mode", m.group("mode"), _quote(m))
    if f.get("load_mode"):
        return RuntimeFact("load_mode", str(f["load_mode"]).lower(), src["load_mode"])
    if f.get("no_mmap"):  # older builds: --no-mmap [--mlock]
        return RuntimeFact("load_mode", "mlock" if f.get("mlock") else "none", src["no_mmap"])
    if f.get("mlock"):  # older builds: --mlock with mmap
        return RuntimeFact("load_mode", "mmap+mlock", src["mlock"])
    return RuntimeFact("load_mode", "auto", "default: no -lm, no LLAMA_ARG_LOAD_MODE")


def host_memory(f: dict[str, Any], src: dict[str, str], lines: list[str], mode: RuntimeFact) -> tuple[RuntimeFact, str]:
    """Whether weights in host memory are pinned (True/False, None: unknown), and why in words.

    The ``model buffer size`` lines settle it; else the flags and environment, with the loader's
    mmap warning as the log's word on top (it wins over a flag that says otherwise).
    """
    host = [(n, mib, s) for n, mib, s in model_buffers(lines) if buffer_kind(n) != "device" and mib > 0]
    if host:
        pinned = sum(mib for n, mib, _ in host if buffer_kind(n) == "pinned")
        pageable = sum(mib for n, mib, _ in host if buffer_kind(n) == "pageable")
        words = (
            "host weights in pinned CUDA host buffers"
            if pinned > pageable
            else "host weights in pageable memory (" + ", ".join(n for n, _, _ in host) + ")"
        )
        return RuntimeFact("host_pinned", pinned > pageable, "; ".join(s for _, _, s in host)), words
    fact, words = _host_memory_from_flags(f, src, mode)
    if not any(MMAP_WARNING in x for x in lines):
        return fact, words
    quoted = f"log: 'tensor overrides to CPU are used with {MMAP_WARNING}'"
    if fact.value is False:
        return RuntimeFact("host_pinned", False, f"{fact.source}; {quoted}"), words
    return RuntimeFact("host_pinned", False, quoted), "the loader says mmap is on: pageable memory"


def _host_memory_from_flags(f: dict[str, Any], src: dict[str, str], mode: RuntimeFact) -> tuple[RuntimeFact, str]:
    if f.get("no_host"):
        return RuntimeFact("host_pinned", False, src["no_host"]), "--no-host bypasses the pinned host buffer"
    if "ggml_cuda_no_pinned" in f:
        words = "GGML_CUDA_NO_PINNED is set: cudaMallocHost is never called, host buffers are pageable CPU memory"
        return RuntimeFact("host_pinned", False, src["ggml_cuda_no_pinned"]), words
    if mode.value in _PINNED_MODES:
        return RuntimeFact("host_pinned", True, mode.source), f"load mode {mode.value}: pinned CUDA host buffers"
    if mode.value in _MMAP_MODES:
        words = f"load mode {mode.value}" + (" = mmap" if mode.value == "auto" else "") + ": pageable memory"
        return RuntimeFact("host_pinned", False, mode.source), words
    return RuntimeFact("host_pinned", None, mode.source), f"unknown: load mode {mode.value!r}"


def gpu_layers(f: dict[str, Any], src: dict[str, str], lines: list[str], n_layer: int | None) -> RuntimeFact:
    """Layers on the GPU as ``"N/M"`` (M: repeating layers + output), from ``offloaded N/M layers`` first."""
    for x in lines:
        m = _OFFLOADED.search(x)
        if m is not None:
            return RuntimeFact("gpu_layers", f"{m.group('n')}/{m.group('m')}", _quote(m))
    total = n_layer + 1 if n_layer is not None else None
    ngl = f.get("n_gpu_layers")
    if isinstance(ngl, int) and ngl >= 0:
        n = min(ngl, total) if total is not None else ngl
        return RuntimeFact("gpu_layers", f"{n}/{total if total is not None else '?'}", src["n_gpu_layers"])
    all_of = f"{total}/{total}" if total is not None else "all"
    if ngl == "all" or (isinstance(ngl, int) and ngl <= -2):
        return RuntimeFact("gpu_layers", all_of, src["n_gpu_layers"])
    why = src.get("n_gpu_layers", "no -ngl (auto)")
    if f.get("fit") is False:
        return RuntimeFact("gpu_layers", all_of, f"{why} with {src['fit']}: every layer")
    user = [src[k] for k in ("override_tensor", "n_cpu_moe", "n_cpu_ffn", "cpu_moe") if k in src]
    if user:
        return RuntimeFact("gpu_layers", all_of, f"{why}, --fit skipped for {user[0]}: every layer")
    return RuntimeFact(
        "gpu_layers",
        None,
        f"unknown: {why} with --fit on (the default) places layers by free memory at load, and the log has no "
        "'offloaded N/M layers to GPU' line (llama-server prints it at -lv 4)",
    )


def host_repeating_layers(layers: RuntimeFact, n_layer: int | None) -> int | None:
    """Repeating layers kept on the CPU by ``gpu_layers`` ``N/M``: all but the last N - 1 (None: unknown)."""
    if not isinstance(layers.value, str) or "/" not in layers.value:
        return None
    n_s, _, m_s = layers.value.partition("/")
    if not n_s.isdigit():
        return None
    m = int(m_s) if m_s.isdigit() else (n_layer + 1 if n_layer is not None else None)
    return None if m is None else max(m - 1 - max(int(n_s) - 1, 0), 0)


def op_offload(f: dict[str, Any], src: dict[str, str]) -> list[RuntimeFact]:
    """``--op-offload`` (default) or not, and ``GGML_OP_OFFLOAD_MIN_BATCH`` where set."""
    on = not f.get("no_op_offload")
    out = [RuntimeFact("op_offload", on, src.get("no_op_offload", "default: --op-offload"))]
    if "ggml_op_offload_min_batch" in f:
        out.append(
            RuntimeFact(
                "op_offload_min_batch",
                _atoi(str(f["ggml_op_offload_min_batch"])),
                f"{src['ggml_op_offload_min_batch']} (default {DEFAULT_OP_OFFLOAD_MIN_BATCH})",
            )
        )
    return out


def _atoi(s: str) -> int:
    """C's atoi: the leading integer, 0 if none."""
    m = re.match(r"\s*([+-]?\d+)", s)
    return int(m.group(1)) if m else 0


DEFAULT_CACHE_RAM_MIB = 8192  # b11434 common.h: cache_ram_mib (-1: no limit, 0: off)


def prompt_cache(f: dict[str, Any], src: dict[str, str]) -> RuntimeFact:
    """The host-memory prompt cache's size in MiB (``--cache-ram``; 0: off, -1: no limit). llama-server
    saves a slot's KV there when the slot takes a new request and loads a cached prompt back, on its one
    loop, before the request starts (b11434 ``get_available_slot``)."""
    v = f.get("cache_ram")
    if isinstance(v, int):
        return RuntimeFact("prompt_cache_mib", v, src.get("cache_ram", "flag"))
    if v is not None:
        return RuntimeFact("prompt_cache_mib", None, f"{src.get('cache_ram', 'flag')}: not a number")
    return RuntimeFact("prompt_cache_mib", DEFAULT_CACHE_RAM_MIB, f"default: --cache-ram {DEFAULT_CACHE_RAM_MIB}")
