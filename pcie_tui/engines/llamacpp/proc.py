"""llama-server process facts: split/offload flags from its command line and environment,
and the files its log goes to (``/proc/PID/fd/1`` and ``2``, ``--log-file``)."""

from __future__ import annotations

import contextlib
import os
import re
import stat
from collections.abc import Callable
from typing import Any

from pcie_tui.engines.llamacpp import flags

_FLAGS = {
    "n_gpu_layers": ("-ngl", "--gpu-layers", "--n-gpu-layers"),
    "split_mode": ("-sm", "--split-mode"),
    "tensor_split": ("-ts", "--tensor-split"),
    "main_gpu": ("-mg", "--main-gpu"),
    "device": ("-dev", "--device"),
    "parallel": ("-np", "--parallel"),
    "ctx_size": ("-c", "--ctx-size"),
    "model": ("-m", "--model"),
    "host": ("--host",),
    "port": ("--port",),
    "log_file": ("--log-file",),
}
_ENV = {
    "n_gpu_layers": "LLAMA_ARG_N_GPU_LAYERS",
    "split_mode": "LLAMA_ARG_SPLIT_MODE",
    "tensor_split": "LLAMA_ARG_TENSOR_SPLIT",
    "main_gpu": "LLAMA_ARG_MAIN_GPU",
    "parallel": "LLAMA_ARG_N_PARALLEL",
    "ctx_size": "LLAMA_ARG_CTX_SIZE",
    "device": "LLAMA_ARG_DEVICE",
    "model": "LLAMA_ARG_MODEL",
    "log_file": "LLAMA_ARG_LOG_FILE",
}
# Variables that change where weights, KV cache and batches go; recorded with the engine's facts.
LAYOUT_ENV = frozenset(
    {
        *(v for k, v in _ENV.items() if k != "log_file"),
        *flags.ENV_VALUES,
        *flags.ENV_SWITCHES,
        *flags.ENV_PAIRS,
        *(v.replace("LLAMA_ARG_", "LLAMA_ARG_NO_") for v in flags.ENV_PAIRS),
        *flags.GGML_ENV,
        "LLAMA_ARG_FIT_TARGET",
        "LLAMA_ARG_FIT_CTX",
        "LLAMA_ARG_FLASH_ATTN",
        "LLAMA_ARG_CACHE_TYPE_K",
        "LLAMA_ARG_CACHE_TYPE_V",
    }
)
_INT_KEYS = ("main_gpu", "parallel", "ctx_size", "port")


def parse_layout(argv: list[str], environ: dict[str, str] | None = None) -> dict[str, Any]:
    """The split/offload flags of a llama-server command line (``-ngl -sm -ts -mg`` and friends).

    Command-line flags win over ``LLAMA_ARG_*`` variables, as in llama-server; ``--a_b`` is
    ``--a-b`` and ``--a=v`` is read too (:func:`.flags.canonical`).
    """
    found: dict[str, Any] = {}
    for i, a in enumerate(argv):
        flag, val = flags.canonical(a)
        for key, names in _FLAGS.items():
            if flag in names:
                if val is not None:
                    found[key] = val
                elif i + 1 < len(argv):
                    found[key] = argv[i + 1]
    env = environ or {}
    found["metrics"] = "--metrics" in argv or env.get("LLAMA_ARG_ENDPOINT_METRICS") in flags.TRUTHY
    slots_off_env = "LLAMA_ARG_NO_ENDPOINT_SLOTS" in env or env.get("LLAMA_ARG_ENDPOINT_SLOTS") in flags.FALSEY
    if "--no-slots" in argv or (slots_off_env and "--slots" not in argv):
        found["slots"] = False
    for key, var in _ENV.items():
        if key not in found and environ and var in environ:
            found[key] = environ[var]
    for key in _INT_KEYS:
        if key in found:
            with contextlib.suppress(TypeError, ValueError):
                found[key] = int(found[key])
    if "n_gpu_layers" in found:
        # "auto" / "all" in newer builds: keep the word
        with contextlib.suppress(TypeError, ValueError):
            found["n_gpu_layers"] = int(found["n_gpu_layers"])
    if "tensor_split" in found and isinstance(found["tensor_split"], str):
        with contextlib.suppress(ValueError):
            found["tensor_split"] = [float(x) for x in found["tensor_split"].replace("/", ",").split(",") if x]
    return found


def proc_argv(pid: int) -> list[str] | None:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            raw = f.read()
    except OSError:
        return None
    return [p.decode("utf-8", "replace") for p in raw.split(b"\0") if p]


def _environ(pid: int, keep: Callable[[str], bool]) -> dict[str, str]:
    """The variables of process ``pid``'s environment that ``keep`` names (no others are held)."""
    try:
        with open(f"/proc/{pid}/environ", "rb") as f:
            raw = f.read()
    except OSError:
        return {}
    out = {}
    for p in raw.split(b"\0"):
        k, eq, v = p.decode("utf-8", "replace").partition("=")
        if eq and keep(k):
            out[k] = v
    return out


def proc_environ(pid: int) -> dict[str, str]:
    """The variables that set llama-server's offload and loading (``LLAMA_ARG_*``, ggml-cuda's)."""
    return _environ(pid, lambda k: k.startswith(("LLAMA_ARG_", "GGML_CUDA_")) or k in flags.GGML_ENV)


def proc_config_home(pid: int) -> dict[str, str]:
    """``HOME`` and ``XDG_CONFIG_HOME`` of the process: where its config file is (:func:`.flags.config_paths`)."""
    return _environ(pid, lambda k: k in ("HOME", "XDG_CONFIG_HOME"))


def log_paths_for_pid(pid: int, argv: list[str] | None = None) -> list[str]:
    """Regular files the process writes its log to: stdout/stderr (``/proc/PID/fd/1``, ``2``) and ``--log-file``.

    A deleted file stays readable through its ``/proc`` fd path; a terminal or pipe is skipped.
    """
    out: list[str] = []
    seen: set[tuple[int, int]] = set()
    cands: list[str] = []
    for fd in (1, 2):
        link = f"/proc/{pid}/fd/{fd}"
        try:
            target = os.readlink(link)
        except OSError:
            continue
        cands.append(link if target.endswith(" (deleted)") or not target.startswith("/") else target)
    lf = parse_layout(argv or [], proc_environ(pid)).get("log_file")
    if isinstance(lf, str):
        cwd = None
        with contextlib.suppress(OSError):
            cwd = os.readlink(f"/proc/{pid}/cwd")
        cands.append(lf if os.path.isabs(lf) or cwd is None else os.path.join(cwd, lf))
    for c in cands:
        try:
            st = os.stat(c)
        except OSError:
            continue
        if not stat.S_ISREG(st.st_mode) or (st.st_dev, st.st_ino) in seen:
            continue
        seen.add((st.st_dev, st.st_ino))
        out.append(c)
    return out


# ---- load-time facts from the head of the server log ----------------------------------------

# Lines that say where weights, KV cache and compute buffers live, and warnings. Only lines up to
# "listening on" / "model loaded" are read: the server prints no request content before it serves.
_LOAD_KEYWORDS = re.compile(
    r"buffer size|offload|n_layer|n_expert|KV self size|KV buffer|CUDA_Host|CPU_Mapped|CUDA\d+ |"
    r"ggml_cuda_init|using device|load_tensors|mmap|mlock|load-mode|tensor override|consider using",
    re.IGNORECASE,
)
# llama.cpp's leveled log: "0.00.201.188 W srv  ..."; older builds print "warning:"/"WARN".
_WARN = re.compile(r"^\s*[\d.]+\s+W\s|warning[:!]|\bWARN\b", re.IGNORECASE)
_READY = re.compile(r"listening on|model loaded|server is listening")


def load_facts(path: str, max_bytes: int = 2 << 20, max_lines: int = 80) -> dict[str, Any]:
    """Load-time lines of a llama-server log: warnings and where weights and buffers went.

    Returns ``{"path", "warnings": [...], "lines": [...], "complete": bool}``; ``complete`` is
    True when the read reached the line that says the server is ready. Never raises.
    """
    out: dict[str, Any] = {"path": path, "warnings": [], "lines": [], "complete": False}
    try:
        with open(path, "rb") as f:
            head = f.read(max_bytes)
    except OSError as e:
        out["error"] = f"cannot read log {path}: {e.strerror}"
        return out
    for raw in head.split(b"\n"):
        line = raw.decode("utf-8", "replace").rstrip()[:300]
        if _READY.search(line):
            out["complete"] = True
            break
        if _WARN.search(line):
            if len(out["warnings"]) < max_lines:
                out["warnings"].append(line)
        elif _LOAD_KEYWORDS.search(line) and len(out["lines"]) < max_lines:
            out["lines"].append(line)
    return out
