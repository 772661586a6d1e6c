"""llama-server's offload and loading flags as llama.cpp b11434's ``common/arg.cpp`` reads them, each
with where it came from (``flag -lm mlock``, ``env LLAMA_ARG_LOAD_MODE=mlock``).

How arg.cpp (``common_params_parse_ex``) reads them:

* Config files first (/etc/llama.cpp/config.ini, then ~/.config/llama.cpp/config.ini: keys are option
  names without dashes or ``LLAMA_ARG_*`` names, in sections ``[*]`` and ``[default]``); b11434 logs
  "using config file: PATH" for each. They are read at attach from the server's environment and recorded.
* The environment next, then the command line; a flag on the command line replaces the value
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


def config_paths(environ: dict[str, str]) -> list[str]:
    """The config files b11434 applies before its environment and command line (arg.cpp
    ``common_params_apply_system_config``, a later one over an earlier): /etc/llama.cpp/config.ini, then
    ``${XDG_CONFIG_HOME:-$HOME/.config}/llama.cpp/config.ini`` of the server's own environment."""
    out = ["/etc/llama.cpp/config.ini"]
    base = environ.get("XDG_CONFIG_HOME") or (f"{environ['HOME']}/.config" if environ.get("HOME") else "")
    if base:
        out.append(f"{base}/llama.cpp/config.ini")
    return out


def read_configs(environ: dict[str, str]) -> list[dict[str, Any]]:
    """Each config file of :func:`config_paths` that exists and reads: its path and the options b11434 applies
    from it, in order (the ``[*]`` section, then ``[default]`` or keys before any section: common/preset.cpp);
    the sections of other models (router presets) are not the running server's. Only the options this module
    reads are kept (never a key, a path or anything else the file holds)."""
    out = []
    for path in config_paths(environ):
        try:
            with open(path, encoding="utf-8", errors="replace") as f:
                text = f.read(1 << 20)
        except OSError:
            continue
        opts = [kv for kv in _ini_options(text) if _config_key(kv[0]) is not None]
        out.append({"path": path, "options": opts})
    return out


def _ini_options(text: str) -> list[tuple[str, str]]:
    sections: dict[str, list[tuple[str, str]]] = {"*": [], "default": []}
    current = "default"
    for raw in text.splitlines():
        line = raw.strip()
        if not line or line[0] in ";#":
            continue
        if line.startswith("[") and line.endswith("]"):
            current = line[1:-1].strip()
            continue
        key, eq, value = line.partition("=")
        if eq and current in sections:
            sections[current].append((key.strip(), value.strip().strip('"')))
    return sections["*"] + sections["default"]


def _config_key(key: str) -> str | None:
    """The argument or variable a config key names (``ngl``, ``n-gpu-layers``, ``LLAMA_ARG_N_GPU_LAYERS``)."""
    if key.startswith(("LLAMA_ARG_", "GGML_")):
        return key if key in ENV_VALUES or key in ENV_SWITCHES or key in ENV_PAIRS or key in GGML_ENV else None
    for name in (canonical("--" + key)[0], "-" + key):
        if name in _ALIAS or name in SWITCHES:
            return name
    return None


def _from_configs(configs: list[dict[str, Any]], vals: dict[str, Any], src: dict[str, str]) -> None:
    for cfg in configs:
        path = cfg.get("path")
        for kv in cfg.get("options") or ():
            if not isinstance(kv, list | tuple) or len(kv) != 2:
                continue  # a damaged recording
            key, value = kv
            name = _config_key(str(key))
            where = f"config {path}: {key} = {value}"
            if name is None:
                continue
            if name.startswith(("LLAMA_ARG_", "GGML_")):
                _from_env({name: str(value)}, vals, src, where)
            elif name in _ALIAS:
                _put(vals, src, _ALIAS[name], str(value), where)
            elif str(value) in TRUTHY or str(value) in FALSEY:  # a switch: on, or its opposite
                k, on = SWITCHES[name]
                vals[k], src[k] = on if str(value) in TRUTHY else not on, where


def parse(
    argv: list[str], environ: dict[str, str] | None = None, configs: list[dict[str, Any]] | None = None
) -> tuple[dict[str, Any], dict[str, str]]:
    """The flags of a llama-server command line, environment and config files (``configs``:
    :func:`read_configs` at attach, recorded), and the source of each: config first, then the environment,
    then the command line, each over the one before (arg.cpp)."""
    vals: dict[str, Any] = {}
    src: dict[str, str] = {}
    _from_configs(configs or [], vals, src)
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


def _from_env(env: dict[str, str], vals: dict[str, Any], src: dict[str, str], where: str | None = None) -> None:
    """``LLAMA_ARG_*`` and ggml's variables (``where``: the source to say, else ``env VAR=value``)."""

    def said(var: str) -> str:
        return where or f"env {var}={env[var]}"

    for var, key in ENV_VALUES.items():
        if var in env:
            _put(vals, src, key, env[var], said(var))
    for var, key in ENV_SWITCHES.items():
        if env.get(var) in TRUTHY:
            vals[key], src[key] = True, said(var)
    for var, key in ENV_PAIRS.items():
        neg = var.replace("LLAMA_ARG_", "LLAMA_ARG_NO_")
        if neg in env:
            vals[key], src[key] = True, said(neg)
        elif env.get(var) in TRUTHY or env.get(var) in FALSEY:
            vals[key], src[key] = env[var] in FALSEY, said(var)
    for var in GGML_ENV:
        if var in env:  # getenv() != NULL: set at all, even empty or "0"
            key = var.lower()
            vals[key], src[key] = env[var], said(var)
