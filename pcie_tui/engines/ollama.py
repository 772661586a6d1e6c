"""Ollama: how much of each loaded model sits in VRAM (``/api/ps``) and the layer offload of its runner.

Written from Ollama's documentation and source, never run against a real Ollama server (no Ollama build runs
on these machines): :attr:`OllamaEngine.tested` is False. Sources: ollama/ollama at
fb30760996871fa9460115c753afd2c60d4ab0f7 (v0.33.0-rc2), and older tags where named.

* ``GET /api/ps``, ``GET /api/version``: docs/api.md ("List Running Models", "Version",
  https://github.com/ollama/ollama/blob/main/docs/api.md) and docs/openapi.yaml (``Ps``: ``size`` "Size of the
  model in bytes", ``size_vram`` "VRAM usage in bytes", ``context_length``, ``expires_at``, ``details``).
  ``ollama ps`` shows ``(size - size_vram) / size`` as the CPU share, "Unknown" when ``size_vram > size`` or
  ``size == 0`` (cmd/cmd.go); that case is None here.
* ``GET /`` answers "Ollama is running"; there is no metrics endpoint (server/routes.go): token counts, running
  and waiting requests and latencies are None because Ollama does not expose them.
* Port 11434, ``OLLAMA_HOST`` and the settings read from the server's environment (only these named variables):
  envconfig/config.go.
* The runner under ``ollama serve``: ``ollama_llama_server --model .. --n-gpu-layers N --port P`` (v0.3-v0.5,
  llm/server.go), ``ollama runner [--ollama-engine] --model .. --port P`` (v0.5.13-v0.29), and from v0.30.0 the
  upstream ``llama-server --model <models>/blobs/sha256-.. --port P --host 127.0.0.1 --no-webui --offline ..``
  (llm/llama_server.go ``startLlamaServer``).
* The runner writes to ``ollama serve``'s stderr (``NewStatusWriter(os.Stderr)``), including
  ``offloaded N/M layers to GPU`` (``offloadedLayersRegex`` in llm/llama_server.go; ml/backend/ggml/ggml.go).
  Read from that file when stderr is one (``--log`` overrides), never from the journal.
"""

from __future__ import annotations

import json
import os
import re
import threading
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from pcie_tui.core.model import EngineSample
from pcie_tui.core.units import pct, size
from pcie_tui.engines.base import (
    Advice,
    Engine,
    EngineClient,
    EngineFacts,
    FindingFacts,
    Role,
    SourceRow,
    TimingBasis,
    typed,
)
from pcie_tui.engines.http import SCRAPE_TIMEOUT_S, failure_reason, http_get, normalize_url

DOCS = (
    "https://github.com/ollama/ollama/blob/main/docs/api.md#list-running-models",
    "https://github.com/ollama/ollama/blob/main/docs/faq.mdx",
    "https://github.com/ollama/ollama/blob/main/envconfig/config.go",
)
ENV_VARS = {
    "OLLAMA_HOST": "host",
    "OLLAMA_NUM_PARALLEL": "num_parallel",
    "OLLAMA_MAX_LOADED_MODELS": "max_loaded_models",
    "OLLAMA_FLASH_ATTENTION": "flash_attention",
    "OLLAMA_KV_CACHE_TYPE": "kv_cache_type",
    "OLLAMA_GPU_OVERHEAD": "gpu_overhead_bytes",
    "OLLAMA_SCHED_SPREAD": "sched_spread",
    "OLLAMA_CONTEXT_LENGTH": "context_length",
    "OLLAMA_KEEP_ALIVE": "keep_alive",
    "OLLAMA_LLM_LIBRARY": "llm_library",
    "CUDA_VISIBLE_DEVICES": "cuda_visible_devices",
}
OFFLOAD_RX = re.compile(rb"offloaded\s+(\d+)/(\d+)\s+layers to GPU")
_LOG_TAIL = 8 << 20  # first read of the server log: its last 8 MiB
PS_EVERY_S = 1.0  # /api/ps changes only when a model loads or unloads
LOG_EVERY_S = 2.0


def _flag(argv: Sequence[str], *names: str) -> str | None:
    for i, a in enumerate(argv):
        name, eq, val = a.partition("=")
        if name in names:
            return val if eq else (argv[i + 1] if i + 1 < len(argv) else None)
    return None


def classify(argv: Sequence[str], proc_name: str = "") -> Role | None:
    """``ollama serve``: root; its runner (``ollama runner``, ``ollama_llama_server``, Ollama's llama-server): child."""
    base = os.path.basename(argv[0]) if argv else ""
    sub = argv[1] if len(argv) > 1 else ""
    if base in ("ollama", "ollama.exe") or (not argv and proc_name == "ollama"):
        return "root" if sub == "serve" else "child" if sub == "runner" else None
    if base == "ollama_llama_server" or proc_name.startswith("ollama_llama_se"):
        return "child"
    if base == "llama-server" and "--offline" in argv and "--no-webui" in argv:
        model = _flag(argv, "--model", "-m") or ""
        if "/blobs/sha256-" in model.replace("\\", "/"):
            return "child"
    return None


def child_title(argv: Sequence[str]) -> str | None:
    """A short title for a runner: which runner it is and its placement flags (never the model path)."""
    base = os.path.basename(argv[0]) if argv else ""
    spec: tuple[tuple[str, ...], ...]
    if base == "llama-server":
        head = "ollama runner: llama-server"
        spec = (("-ngl", "-ngl", "--n-gpu-layers"), ("-c", "-c", "--ctx-size"), ("-np", "-np", "--parallel"))
    elif base == "ollama_llama_server":
        head = "ollama runner: ollama_llama_server"
        spec = (("-ngl", "--n-gpu-layers"), ("-c", "--ctx-size"), ("-np", "--parallel"))
    elif len(argv) > 1 and argv[1] == "runner":
        eng = "ollama engine" if "--ollama-engine" in argv else "mlx" if "--mlx-engine" in argv else "llama.cpp"
        return f"ollama runner ({eng})"
    else:
        return None
    parts = [f"{s[0]} {v}" for s in spec if (v := _flag(argv, *s[1:])) is not None]
    return " ".join([head, *parts])


def parse_host(value: str) -> tuple[str | None, int | None]:
    """(host, port) from OLLAMA_HOST the way envconfig.Host reads it (default port 11434; 80/443 with a scheme)."""
    s = value.strip()
    scheme, sep, rest = s.partition("://")
    default = 11434 if not sep else 443 if scheme == "https" else 80
    hostport = (rest if sep else s).split("/", 1)[0]
    try:
        parts = urlsplit("//" + hostport)
        port = parts.port
    except ValueError:
        return None, default
    return parts.hostname or None, port or default


def parse_layout(argv: Sequence[str], environ: Mapping[str, str]) -> dict[str, Any]:
    """The server's settings from the named OLLAMA_* variables of its environment (nothing else is read)."""
    out: dict[str, Any] = {}
    for var, key in ENV_VARS.items():
        v = environ.get(var)
        if v is None or var == "OLLAMA_HOST":
            continue
        out[key] = int(v) if v.strip().isdigit() else v
    host = environ.get("OLLAMA_HOST")
    out["host"], out["port"] = parse_host(host) if host else (None, None)
    return out


def _int(v: Any) -> int | None:
    return v if isinstance(v, int) and not isinstance(v, bool) and v >= 0 else None


def parse_ps(obj: Any) -> list[dict[str, Any]]:
    """``/api/ps`` JSON -> one dict per loaded model; ValueError when it is not that shape."""
    if not isinstance(obj, dict) or not isinstance(obj.get("models"), list):
        raise ValueError("not an /api/ps answer (no models list)")
    out = []
    for m in obj["models"]:
        if not isinstance(m, dict):
            continue
        size, vram = _int(m.get("size")), _int(m.get("size_vram"))
        d = m.get("details")
        det: dict[str, Any] = d if isinstance(d, dict) else {}
        frac = vram / size if size is not None and vram is not None and size > 0 and vram <= size else None
        out.append(
            {
                "name": str(m.get("name") or m.get("model") or "?")[:120],
                "size_bytes": size,
                "vram_bytes": vram,
                # None where `ollama ps` says "Unknown" (size 0, or more in VRAM than the model's size).
                "vram_frac": frac,
                "host_bytes": size - vram if frac is not None and size is not None and vram is not None else None,
                "context_length": _int(m.get("context_length")),
                "expires_at": m.get("expires_at") if isinstance(m.get("expires_at"), str) else None,
                "parameter_size": det.get("parameter_size") if isinstance(det.get("parameter_size"), str) else None,
                "quantization": det.get("quantization_level")
                if isinstance(det.get("quantization_level"), str)
                else None,
            }
        )
    return out


def placement(models: list[dict[str, Any]]) -> dict[str, Any]:
    """Totals over the loaded models: bytes in VRAM, in host memory, and the VRAM share (None if unknown)."""
    known = [m for m in models if m["vram_frac"] is not None]
    size = sum(m["size_bytes"] for m in known)
    vram = sum(m["vram_bytes"] for m in known)
    whole = bool(models) and len(known) == len(models)
    return {
        "models_loaded": len(models),
        "model_bytes": size if whole else None,
        "vram_bytes": vram if whole else None,
        "host_bytes": size - vram if whole else None,
        "vram_frac": vram / size if whole and size else None,
    }


def offload_from_log(text: bytes) -> dict[str, Any] | None:
    """The last ``offloaded N/M layers to GPU`` of a log chunk: {gpu_layers, total_layers, line}."""
    found = list(OFFLOAD_RX.finditer(text))
    if not found:
        return None
    last = found[-1]
    a, b = int(last.group(1)), int(last.group(2))
    return {"gpu_layers": a, "total_layers": b, "line": f"offloaded {a}/{b} layers to GPU"}


def vram_sentence(m: dict[str, Any]) -> str | None:
    """E.g. "Ollama placed 62 % of qwen3:14b in VRAM (/api/ps size_vram 9.10 GB of 14.7 GB)"."""
    if m.get("vram_frac") is None:
        return None
    return (
        f"Ollama placed {pct(m['vram_frac'])} of {m['name']} in VRAM "
        f"(/api/ps size_vram {size(m['vram_bytes'])} of {size(m['size_bytes'])})"
    )


def _stderr_file(pid: int | None) -> str | None:
    if pid is None:
        return None
    try:
        target = Path(f"/proc/{pid}/fd/2").resolve(strict=True)
    except OSError:
        return None
    return str(target) if target.is_file() else None


class OllamaClient:
    """One ``ollama serve``. ``read`` never raises; /api/ps at most every PS_EVERY_S, the log every LOG_EVERY_S."""

    kind = "ollama"

    def __init__(
        self,
        url: str,
        pid: int | None = None,
        info: dict[str, Any] | None = None,
        log_path: str | None = None,
        timeout_s: float = SCRAPE_TIMEOUT_S,
    ):
        self.url = normalize_url(url)
        self.pid = pid
        self.timeout_s = timeout_s
        self.info: dict[str, Any] = dict(info or {})
        self.user_log_path = log_path  # named by the user (--log): kept across a reattach
        self.log_path = log_path or _stderr_file(pid)
        self._version: str | None = self.info.get("version")
        self._lock = threading.Lock()
        self._ps: tuple[float, list[dict[str, Any]]] | None = None
        self._sent_models: list[dict[str, Any]] | None = None
        self._log_pos: int | None = None
        self._log_t = 0.0
        self._offload: dict[str, Any] | None = None

    def _models(self, max_age_s: float) -> list[dict[str, Any]]:
        """Loaded models, from a fresh /api/ps when the last is older than ``max_age_s``. Raises OSError/ValueError."""
        now = time.monotonic()
        if self._ps is not None and now - self._ps[0] < max_age_s:
            return self._ps[1]
        status, body = http_get(self.url + "/api/ps", self.timeout_s)
        if status != 200:
            raise OSError(f"/api/ps answered HTTP {status}")
        models = parse_ps(json.loads(body))
        self._ps = (now, models)
        return models

    def _read_log(self) -> None:
        """New bytes of the server log since the last read (its tail the first time), at most every LOG_EVERY_S."""
        now = time.monotonic()
        if self.log_path is None or now - self._log_t < LOG_EVERY_S:
            return
        self._log_t = now
        try:
            with open(self.log_path, "rb") as f:
                end = f.seek(0, os.SEEK_END)
                start = max(0, end - _LOG_TAIL) if self._log_pos is None or self._log_pos > end else self._log_pos
                if start == end:
                    return
                f.seek(start)
                chunk = f.read(min(end - start, _LOG_TAIL))
                self._log_pos = start + len(chunk)
        except OSError:
            return
        found = offload_from_log(chunk)
        if found is not None:
            self._offload = found

    def describe(self) -> dict[str, Any]:
        """Header facts, with the models loaded now and the runner's last layer offload (None when not known)."""
        if self._version is None:
            try:
                status, body = http_get(self.url + "/api/version", max(self.timeout_s, 1.0))
                v = json.loads(body).get("version") if status == 200 else None
                self._version = v if isinstance(v, str) else None
            except (OSError, ValueError, AttributeError):
                pass
        with self._lock:
            try:
                models: list[dict[str, Any]] | None = self._models(0.0)
            except (OSError, ValueError):
                models = None
            self._log_t = 0.0
            self._read_log()
            offload = self._offload
        d = {k: self.info.get(k) for k in ("cmdline", "layout", "gpus", "tree_pids", "titles")}
        d.update(kind=self.kind, url=self.url, pid=self.pid, version=self._version, log_path=self.log_path)
        d.update(model=models[0]["name"] if models else None, models=models, offload=offload, tested=False)
        return {**d, "placement": placement(models) if models is not None else None}

    def read(self) -> EngineSample:
        """VRAM placement from /api/ps (+ the log's layer offload). Ollama has no token or request counters: None."""
        with self._lock:
            try:
                models = self._models(PS_EVERY_S)
            except OSError as e:
                return EngineSample(kind=self.kind, up=False, error=failure_reason(e))
            except ValueError as e:
                return EngineSample(kind=self.kind, up=False, error=f"/api/ps unreadable: {str(e)[:120]}")
            self._read_log()
            extra: dict[str, Any] = {k: v for k, v in placement(models).items() if v is not None}
            if models != self._sent_models:
                extra["models"] = models  # only when the set or its placement changed (keeps recordings small)
                self._sent_models = models
            if self._offload is not None:
                extra["gpu_layers"] = self._offload["gpu_layers"]
                extra["total_layers"] = self._offload["total_layers"]
        return EngineSample(kind=self.kind, up=True, extra=extra)


def _host_layers(offload: dict[str, Any]) -> int | None:
    """Layers the runner kept in host memory: total - GPU layers of its "offloaded N/M layers" line."""
    gpu: int | None = typed(offload, "gpu_layers", int, None)
    total: int | None = typed(offload, "total_layers", int, None)
    return total - gpu if gpu is not None and total is not None and 0 <= gpu <= total else None


class OllamaEngine(Engine):
    name = "ollama"
    display = "Ollama"
    default_port = 11434
    tested = False
    docs = DOCS
    probe_paths = ("/api/version",)

    def classify(self, argv: Sequence[str], proc_name: str) -> Role | None:
        return classify(argv, proc_name)

    def child_title(self, argv: Sequence[str], proc_name: str) -> str | None:
        return child_title(argv)

    def parse_layout(self, argv: Sequence[str], environ: Mapping[str, str]) -> dict[str, Any]:
        return parse_layout(argv, environ)

    def recognise(self, path: str, status: int, body: bytes) -> bool:
        if status != 200:
            return False
        try:
            obj = json.loads(body)
        except ValueError:
            return False
        return (
            path == "/api/version" and isinstance(obj, dict) and isinstance(obj.get("version"), str) and len(obj) == 1
        )

    def client(self, url: str, pid: int | None, info: dict[str, Any], log_path: str | None) -> EngineClient:
        return OllamaClient(url, pid=pid, info=info, log_path=log_path)

    def sources(self, window: str) -> list[SourceRow]:
        note = "Ollama /api/ps; written from its docs, not tested against a real server"
        return [
            ("model in VRAM", f"size_vram / size summed over loaded models ({note})", "%", "latest (every 1 s)"),
            ("model in host memory", "size - size_vram from /api/ps", "GB", "latest (every 1 s)"),
            ("GPU layers", "'offloaded N/M layers to GPU' in ollama serve's log", "layers", "last model load"),
            ("tokens, requests, latencies", "not exposed by Ollama (no metrics endpoint)", "n/a", "-"),
        ]

    def facts(self, engine_info: dict[str, Any]) -> EngineFacts:
        models = [m for m in typed(engine_info, "models", list, []) if isinstance(m, dict)]
        off: dict[str, Any] = typed(engine_info, "offload", dict, {})
        layout: dict[str, Any] = typed(engine_info, "layout", dict, {})
        partial = [m for m in models if isinstance(m.get("vram_frac"), int | float) and m["vram_frac"] < 1.0]
        evidence = tuple(s for m in models if (s := vram_sentence(m)) is not None)
        host = None
        if partial:
            host = "; ".join(
                f"{size(m.get('host_bytes'))} of {m.get('name')} ({pct(1 - m['vram_frac'])})" for m in partial
            )
            host += " (/api/ps size - size_vram)"
        line = off.get("line") if isinstance(off.get("line"), str) else None
        return EngineFacts(
            kind=self.name,
            host_weights=host,
            host_layers=_host_layers(off) if host else None,
            timing=self.timing(),
            flags={k: layout[k] for k in ("num_parallel", "flash_attention", "kv_cache_type") if k in layout},
            log_evidence=(*evidence, *((line,) if line else ())),
        )

    def timing(self) -> TimingBasis:
        return TimingBasis("none", None, None, "Ollama exposes no latencies (no metrics endpoint)")

    def advise(self, facts: EngineFacts, finding: FindingFacts) -> list[Advice]:
        if finding.bound not in ("link", "transfer") or not facts.host_weights:
            return []
        note = "Ollama support is written from its documentation, not tested against a real server"
        return [
            Advice(
                cause=f"{facts.host_weights} in host memory: the layers kept there are computed from host memory",
                fix="a smaller quantization or context (num_ctx), fewer parallel slots (OLLAMA_NUM_PARALLEL), "
                "OLLAMA_KV_CACHE_TYPE=q8_0, or more GPU memory, until /api/ps size_vram reaches size",
                evidence=(*facts.log_evidence, note),
                short="model partly in host memory",
            )
        ]


ENGINE = OllamaEngine()
