"""llama-server's offload and loading flags as llama.cpp b11434's ``common/arg.cpp`` reads them, each
with where it came from (``flag -lm mlock``, ``env LLAMA_ARG_LOAD_MODE=mlock``).

How arg.cpp (``common_params_parse_ex``) reads them:

* The environment first, then the command line; a flag on the command line replaces the value
  an ``LLAMA_ARG_*`` variable gave. Options whose handler appends (``-ot``, ``--cpu-moe``,
  ``--n-cpu-moe``, ``--n-cpu-ffn``: each adds tensor overrides) apply from both.
* Every argument that starts with ``--`` has its ``_`` replaced by ``-`` before the lookup, so
  ``--n_cpu_moe`` is ``--n-cpu-moe``; short names (``-ngl``) are taken as written.
  ``--flag=value`` is not an arg.cpp form (b11434 rejects it as an invalid argument); it is read
  anyway, for wrappers and builds that pass it.
* A switch (``--cpu-moe``, ``--no-host``) applies from its variable only when the value is
  truthy (``on``, ``enabled``, ``true``, ``1``; case as written). A ``--x``/``--no-x`` pair
  (``-kvo``/``-nkvo``, ``--repack``/``--no-repack``) reads ``LLAMA_ARG_NO_X`` (set at all: off),
  else ``LLAMA_ARG_X`` (truthy or falsey).
* ``--op-offload``/``--no-op-offload`` has no variable.
* b11434 has ``-lm/--load-mode {auto,none,mmap,mlock,mmap+mlock,dio}`` and no ``--no-mmap`` or
  ``--mlock``: those two (and ``LLAMA_ARG_NO_MMAP``, ``LLAMA_ARG_MLOCK``) are read for older servers.
"""

from __future__ import annotations

import contextlib
from typing import Any

# Options that take a value: canonical key -> the names arg.cpp gives them.
VALUE_FLAGS: dict[str, tuple[str, ...]] = {
    "n_gpu_layers": ("-ngl", "--gpu-layers", "--n-gpu-layers"),
    "override_tensor": ("-ot", "--override-tensor"),
    "n_cpu_ffn": ("-ncffn", "--n-cpu-ffn"),
    "n_cpu_moe": ("-ncmoe", "--n-cpu-moe"),
    "load_mode": ("-lm", "--load-mode"),
    "fit": ("-fit", "--fit"),
    "ubatch": ("-ub", "--ubatch-size"),
    "batch": ("-b", "--batch-size"),
    "cache_ram": ("-cram", "--cache-ram"),
    "parallel": ("-np", "--parallel"),
}
# Options without a value: name -> (key, value it sets).
SWITCHES: dict[str, tuple[str, bool]] = {
    "-cmoe": ("cpu_moe", True),
    "--cpu-moe": ("cpu_moe", True),
    "-nkvo": ("no_kv_offload", True),
    "--no-kv-offload": ("no_kv_offload", True),
    "-kvo": ("no_kv_offload", False),
    "--kv-offload": ("no_kv_offload", False),
    "--no-host": ("no_host", True),
    "--no-op-offload": ("no_op_offload", True),
    "--op-offload": ("no_op_offload", False),
    "-nr": ("no_repack", True),
    "--no-repack": ("no_repack", True),
    "--repack": ("no_repack", False),
    "--no-mmap": ("no_mmap", True),  # older builds (b11434: -lm none)
    "--mlock": ("mlock", True),  # older builds (b11434: -lm mlock / mmap+mlock)
}
ENV_VALUES = {
    "LLAMA_ARG_N_GPU_LAYERS": "n_gpu_layers",
    "LLAMA_ARG_OVERRIDE_TENSOR": "override_tensor",
    "LLAMA_ARG_N_CPU_FFN": "n_cpu_ffn",
    "LLAMA_ARG_N_CPU_MOE": "n_cpu_moe",
    "LLAMA_ARG_LOAD_MODE": "load_mode",
    "LLAMA_ARG_FIT": "fit",
    "LLAMA_ARG_UBATCH": "ubatch",
    "LLAMA_ARG_BATCH": "batch",
    "LLAMA_ARG_CACHE_RAM": "cache_ram",
    "LLAMA_ARG_N_PARALLEL": "parallel",
}
ENV_SWITCHES = {
    "LLAMA_ARG_CPU_MOE": "cpu_moe",
    "LLAMA_ARG_NO_HOST": "no_host",
    "LLAMA_ARG_NO_MMAP": "no_mmap",  # older builds
    "LLAMA_ARG_MLOCK": "mlock",  # older builds
}
# --x/--no-x pairs: the variable -> the key of the negative form.
ENV_PAIRS = {"LLAMA_ARG_KV_OFFLOAD": "no_kv_offload", "LLAMA_ARG_REPACK": "no_repack"}
# Variables read beside LLAMA_ARG_*: ggml-cuda reads these with getenv.
GGML_ENV = ("GGML_CUDA_NO_PINNED", "GGML_OP_OFFLOAD_MIN_BATCH")

TRUTHY = ("on", "enabled", "true", "1")  # common_arg_utils::is_truthy
FALSEY = ("off", "disabled", "false", "0")  # common_arg_utils::is_falsey
_ADDITIVE = ("override_tensor", "n_cpu_ffn", "n_cpu_moe")
_INTS = ("n_cpu_ffn", "n_cpu_moe", "ubatch", "batch", "n_gpu_layers", "cache_ram", "parallel")
_ALIAS = {n: key for key, names in VALUE_FLAGS.items() for n in names}


def canonical(arg: str) -> tuple[str, str | None]:
    """``(name, value)`` of one argument as arg.cpp looks it up: ``--a_b`` is ``--a-b``; ``--a=v`` gives v."""
    name, eq, val = arg.partition("=") if arg.startswith("-") else (arg, "", "")
    if name.startswith("--"):
        name = name.replace("_", "-")
    return name, (val if eq else None)


def parse(argv: list[str], environ: dict[str, str] | None = None) -> tuple[dict[str, Any], dict[str, str]]:
    """The flags of a llama-server command line and environment, and the source of each."""
    vals: dict[str, Any] = {}
    src: dict[str, str] = {}
    _from_env(environ or {}, vals, src)
    i = 1 if argv and not argv[0].startswith("-") else 0  # argv[0] is the program
    while i < len(argv):
        name, val = canonical(argv[i])
        key = _ALIAS.get(name)
        if key is not None and (val is not None or i + 1 < len(argv)):
            shown = argv[i] if val is not None else f"{argv[i]} {argv[i + 1]}"
            if val is None:
                val, i = argv[i + 1], i + 1
            _put(vals, src, key, val, f"flag {shown}")
        elif name in SWITCHES:
            key, on = SWITCHES[name]
            vals[key], src[key] = on, f"flag {argv[i]}"
        i += 1
    for key in _INTS:
        if isinstance(vals.get(key), str):
            with contextlib.suppress(ValueError):  # "auto" / "all" for -ngl stay words
                vals[key] = int(vals[key])
    if isinstance(vals.get("fit"), str):
        fit = vals["fit"]
        vals["fit"] = True if fit in TRUTHY else (False if fit in FALSEY else fit)
    return vals, src


def _put(vals: dict[str, Any], src: dict[str, str], key: str, val: str, where: str) -> None:
    """One value for ``key``: replaces a scalar, adds to what appends (as arg.cpp's handlers do)."""
    if key == "override_tensor":
        vals.setdefault(key, []).append(val)
    elif key in _ADDITIVE and key in vals:
        # --n-cpu-moe / --n-cpu-ffn add overrides for the first N layers each time: the largest N holds.
        with contextlib.suppress(ValueError):
            vals[key] = max(int(vals[key]), int(val))
    else:
        vals[key] = val
    src[key] = f"{src[key]} and {where}" if key in _ADDITIVE and key in src else where


def _from_env(env: dict[str, str], vals: dict[str, Any], src: dict[str, str]) -> None:
    for var, key in ENV_VALUES.items():
        if var in env:
            _put(vals, src, key, env[var], f"env {var}={env[var]}")
    for var, key in ENV_SWITCHES.items():
        if env.get(var) in TRUTHY:
            vals[key], src[key] = True, f"env {var}={env[var]}"
    for var, key in ENV_PAIRS.items():
        neg = var.replace("LLAMA_ARG_", "LLAMA_ARG_NO_")
        if neg in env:
            vals[key], src[key] = True, f"env {neg}={env[neg]}"
        elif env.get(var) in TRUTHY or env.get(var) in FALSEY:
            vals[key], src[key] = env[var] in FALSEY, f"env {var}={env[var]}"
    for var in GGML_ENV:
        if var in env:  # getenv() != NULL: set at all, even empty or "0"
            key = var.lower()
            vals[key], src[key] = env[var], f"env {var}={env[var]}"
