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
* ``/api/ps`` ``size`` / ``size_vram`` of a v0.30+ runner: ``llamaServerRunner.MemorySize`` (llm/llama_server.go)
  sums llama-server's model, KV, compute, output and RS buffer lines; ``size_vram`` the GPU ones. So
  ``size - size_vram`` is the model memory not in VRAM (weights, KV cache, compute buffers), never weights
  alone: weights on the host are claimed only from the ``offloaded N/M layers to GPU`` line.
* The runner's port: ``startLlamaServer`` picks a free 127.0.0.1 port and passes it as ``--port P``; no Ollama
  API returns it, so it is read from the runner's command line (a child of ``ollama serve``). The runner runs
  without ``--metrics`` (no token counters) with ``/slots`` on (llama-server's default) and
  ``--log-verbosity 4 --no-log-prefix --no-log-timestamps``; its output goes to ``ollama serve``'s stderr, so
  its per-request timing lines are in that log, read by the llama.cpp adapter (:class:`LlamaCppClient`).
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

import psutil

from pcie_tui.core.model import EngineSample
from pcie_tui.core.units import pct, size
from pcie_tui.engines.base import (
    Advice,
    Engine,
    EngineClient,
    EngineFacts,
    FindingFacts,
    RequestTiming,
    Role,
    RuntimeFact,
    SourceRow,
    TimingBasis,
    typed,
)
from pcie_tui.engines.http import SCRAPE_TIMEOUT_S, failure_reason, http_get, normalize_url
from pcie_tui.engines.llamacpp import ENGINE as LLAMACPP
from pcie_tui.engines.llamacpp.client import LlamaCppClient

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
# Ollama's own plan before it starts the runner (llm/memory.go, llm/server.go, v0.1.4x-v0.29): the runner is then
# started with --n-gpu-layers <layers.offload>. Real logs: ollama#7610 ("offload to cuda"), ollama#10823 (msg=offload).
PLAN_RX = re.compile(rb"layers\.model=(\d+)\s+layers\.offload=(\d+)")
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
        if "size_vram" not in m and size is not None:
            # /api/ps came with v0.1.38; v0.1.38-v0.1.41 left size_vram out when it was 0 (all on the CPU:
            # ollama#4840, fixed by #4842) and later versions always send it, so an answer without it says 0
            vram = 0
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
    """The last ``offloaded N/M layers to GPU`` of a log chunk (or, where it comes later or alone, Ollama's
    ``layers.model=M layers.offload=N`` plan): {gpu_layers, total_layers, line}."""
    ran = [(m.start(), int(m.group(1)), int(m.group(2)), False) for m in OFFLOAD_RX.finditer(text)]
    plan = [(m.start(), int(m.group(2)), int(m.group(1)), True) for m in PLAN_RX.finditer(text)]
    if not ran and not plan:
        return None
    # The later of the two: a runner's line follows its load's plan; a plan alone (the ollama engine of
    # v0.6-v0.11 logs no "offloaded" line) is the split the runner was started with.
    _, a, b, planned = max(ran + plan)
    line = f"layers.offload={a} of layers.model={b} (Ollama's offload plan)" if planned else None
    return {"gpu_layers": a, "total_layers": b, "line": line or f"offloaded {a}/{b} layers to GPU"}


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


def runner_of(argv: Sequence[str]) -> tuple[int | None, str]:
    """(port, why) of one runner command line: the port of a v0.30+ ``llama-server`` runner (``--port P``
    on its command line, bound to 127.0.0.1), else None and why its timing cannot be read."""
    if classify(argv) != "child":
        return None, "not an Ollama runner"
    if os.path.basename(argv[0]) != "llama-server":
        return None, "Ollama's own runner (before v0.30) serves no llama-server /slots or timing log"
    port = _flag(argv, "--port")
    if port is None or not port.isdigit():
        return None, "the runner's command line names no --port"
    return int(port), f"runner's command line: --port {port}"


def find_runner(serve_pid: int | None) -> tuple[dict[str, Any] | None, str]:
    """The newest llama-server runner under ``ollama serve`` ({pid, port, argv, source}), or None and why
    not. Ollama's API does not say where its runner listens: only the runner's own command line does."""
    if serve_pid is None:
        return None, "per-request timing unknown: the runner's port is private (attached by URL, no process)"
    try:
        children = psutil.Process(serve_pid).children(recursive=True)
    except psutil.Error:
        return None, "per-request timing unknown: ollama serve's processes could not be read"
    found: list[tuple[float, dict[str, Any]]] = []
    why = "per-request timing unknown: no runner is running (no model loaded)"
    for c in children:
        try:
            argv, started = c.cmdline(), c.create_time()
        except psutil.Error:
            continue
        port, reason = runner_of(argv)
        if port is not None:
            found.append((started, {"pid": c.pid, "port": port, "argv": argv, "source": reason}))
        elif reason != "not an Ollama runner":
            why = f"per-request timing unknown: {reason}"
    if not found:
        return None, why
    runner = max(found, key=lambda x: x[0])[1]
    runner["runners"] = len(found)
    return runner, runner["source"]


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
        # The v0.30+ llama-server runner, read through the llama.cpp client (its /slots and its timing
        # lines in ollama serve's log), re-found at most every LOG_EVERY_S: each model load starts a new one.
        self._runner: LlamaCppClient | None = None
        self._runner_info: dict[str, Any] | None = None
        self._runner_t = float("-inf")
        self.runner_note = "per-request timing unknown: the runner was not looked for yet"

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

    def _runner_client(self) -> LlamaCppClient | None:
        """The llama.cpp client of ollama serve's newest llama-server runner (None: none, or its port
        cannot be known; ``runner_note`` says which)."""
        now = time.monotonic()
        if now - self._runner_t < LOG_EVERY_S:
            return self._runner
        self._runner_t = now
        info, self.runner_note = find_runner(self.pid)
        if info is None:
            self._runner = self._runner_info = None
        elif self._runner_info is None or info["pid"] != self._runner_info["pid"]:
            # The runner writes into ollama serve's stderr (a pipe to it): its timing lines are in that log.
            url = f"http://127.0.0.1:{info['port']}"
            self._runner = LlamaCppClient(url, pid=info["pid"], log_path=self.log_path, info={"cmdline": info["argv"]})
            self._runner_info = {k: info[k] for k in ("pid", "port", "source", "runners")} | {"url": url}
        return self._runner

    def _read_runner(self, extra: dict[str, Any]) -> float | None:
        """One read of the runner (/slots, the log's finished requests) into ``extra``; its busy slots."""
        runner = self._runner_client()
        if runner is None:
            return None
        s = runner.read()
        for k in ("slots", "slots_prefill", "slots_decode", "requests"):
            if k in s.extra:
                extra[k] = s.extra[k]
        if s.error:
            extra["runner_error"] = s.error[:200]
        return s.requests_running if s.up else None

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
        self._runner_t = float("-inf")
        self._runner_client()
        d.update(runner=self._runner_info, runner_note=self.runner_note)
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
            running = self._read_runner(extra)
        return EngineSample(kind=self.kind, up=True, requests_running=running, extra=extra)


def _version(v: Any) -> tuple[int, ...] | None:
    """(major, minor, patch) of an Ollama version string such as "0.30.8" or "0.30.11-rc0"."""
    m = re.match(r"v?(\d+)\.(\d+)\.(\d+)", v) if isinstance(v, str) else None
    return tuple(int(x) for x in m.groups()) if m else None


# Before v0.30.11 (ollama#16637, fixed by #16709) a partly offloaded model's ``size`` counted its mmap'd
# weights twice (the CPU_Mapped buffer spans nearly the whole file): size - size_vram overstated what is not
# in VRAM (26.7 GiB size for 13.4 GiB in VRAM, real split ~94 % GPU, in the report).
MMAP_FIXED = (0, 30, 11)


def memory_fact(models: list[dict[str, Any]], version: Any = None) -> RuntimeFact:
    """Model memory Ollama did not place in VRAM, per partly placed model: ``size - size_vram`` of /api/ps,
    which counts the runner's weights, KV cache and compute buffers alike (llm/llama_server.go
    ``MemorySize``: the sum of llama-server's model, KV, compute, output buffers), so not weights alone.
    Before v0.30.11 (or an unknown version) it may count mmap'd weights twice: said in the source."""
    src = "/api/ps size - size_vram: weights, KV cache and compute buffers together"

    if not models:
        return RuntimeFact("memory_not_in_vram", None, "unknown: no model loaded at attach (/api/ps)")
    known = [m for m in models if isinstance(m.get("vram_frac"), int | float)]
    if not known:
        return RuntimeFact("memory_not_in_vram", None, "unknown: /api/ps gives no share ('ollama ps' says Unknown)")
    partial = [m for m in known if m["vram_frac"] < 1.0]
    if not partial:
        return RuntimeFact("memory_not_in_vram", "none", src)
    said = "; ".join(f"{size(m.get('host_bytes'))} of {m.get('name')} ({pct(1 - m['vram_frac'])})" for m in partial)
    v = _version(version)
    if v is None or v < MMAP_FIXED:
        why = f"Ollama {version}" if v is not None else "Ollama's version unknown"
        src += f"; {why}: an upper bound (before 0.30.11 size counts mmap'd weights twice, ollama#16637)"
    return RuntimeFact("memory_not_in_vram", said, src)


def layers_fact(offload: Mapping[str, Any]) -> RuntimeFact:
    """The runner's layer split from its ``offloaded N/M layers to GPU`` line (the last model load)."""
    line = offload.get("line")
    host = _host_layers(dict(offload))
    if not isinstance(line, str) or host is None:
        return RuntimeFact("gpu_layers", None, "unknown: no 'offloaded N/M layers to GPU' line read from the log")
    return RuntimeFact("gpu_layers", f"{offload['gpu_layers']}/{offload['total_layers']}", f"log: '{line}'")


def timing_fact(engine_info: Mapping[str, Any]) -> RuntimeFact:
    """Whether per-request timing can be read: the runner's port and where it was read, or why not."""
    runner = engine_info.get("runner")
    if isinstance(runner, dict) and isinstance(runner.get("port"), int):
        many = runner.get("runners")
        more = f"; the newest of {many} runners" if isinstance(many, int) and many > 1 else ""
        return RuntimeFact("request_timing", f"llama-server runner on 127.0.0.1:{runner['port']}",
                           f"{runner.get('source')}{more}")  # fmt: skip
    note = engine_info.get("runner_note")
    return RuntimeFact("request_timing", None, str(note) if note else "unknown: the runner's port is private")


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
    not_exposed = frozenset({"token counters, waiting"})  # its runner runs without --metrics
    docs = DOCS
    probe_paths = ("/api/version",)
    # From v0.30 the runner is llama-server: its requests are timed as llama.cpp's are (where its port is known).
    per_request_timing = True
    quantile_method = (
        "per request, from the llama-server runner's timing lines in ollama serve's log (Ollama starts it with "
        "--no-log-timestamps: TTFT = prompt eval time, a lower bound; ITL = mean gap per request)"
    )

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

    # ---- per-request timing: the runner's, read as llama.cpp's -------------------------

    def live_tokens(self, ticks: Sequence[tuple[float, EngineSample]], what: str) -> tuple[float, float, str] | None:
        got = LLAMACPP.live_tokens(ticks, what)
        return (got[0], got[1], f"runner {got[2]}") if got is not None else None

    def request_latencies(self, requests: Sequence[dict[str, Any]]) -> dict[str, dict[str, float] | None]:
        return LLAMACPP.request_latencies(requests)

    def request_timing(self, request: Mapping[str, Any]) -> RequestTiming | None:
        return LLAMACPP.request_timing(request)

    def timings_unavailable(self, engine_info: dict[str, Any]) -> str | None:
        fact = timing_fact(engine_info)
        return fact.source if fact.value is None and "runner_note" in engine_info else None

    def timing_basis(self, n_requests: int, n_client_timed: int | None = None) -> str | None:
        basis = LLAMACPP.timing_basis(n_requests, n_client_timed)
        return f"Ollama's runner: {basis}" if basis else None

    def sources(self, window: str) -> list[SourceRow]:
        note = "Ollama /api/ps; written from its source, not tested against a real server"
        return [
            ("model in VRAM", f"size_vram / size summed over loaded models ({note})", "%", "latest (every 1 s)"),
            ("model memory not in VRAM", "size - size_vram from /api/ps: weights, KV cache and buffers (an upper "
             "bound before v0.30.11: mmap'd weights counted twice)", "GB", "latest (every 1 s)"),
            ("GPU layers", "'offloaded N/M layers to GPU' in ollama serve's log, else Ollama's plan "
             "(layers.model, layers.offload)", "layers", "last model load"),
            ("running, per-request timing", "the llama-server runner's /slots and timing lines (v0.30+, port "
             "from its command line)", "requests, s", window),
            ("token counters, waiting", "not exposed by Ollama or its runner (no --metrics)", "n/a", "-"),
        ]  # fmt: skip

    def facts(self, engine_info: dict[str, Any]) -> EngineFacts:
        models = [m for m in typed(engine_info, "models", list, []) if isinstance(m, dict)]
        off: dict[str, Any] = typed(engine_info, "offload", dict, {})
        layout: dict[str, Any] = typed(engine_info, "layout", dict, {})
        layers, timed = layers_fact(off), timing_fact(engine_info)
        host = _host_layers(off)
        # Weights in host memory only where the runner's layer split says so; /api/ps alone cannot.
        weights = f"weights of {host} of {off['total_layers']} layers ({layers.source})" if host else None
        evidence = tuple(sv for m in models if (sv := vram_sentence(m)) is not None)
        line = off.get("line") if isinstance(off.get("line"), str) else None
        return EngineFacts(
            kind=self.name,
            host_weights=weights,
            host_layers=host if layers.value is not None else None,
            timing=self.timing() if timed.value is not None else TimingBasis("none", None, None, timed.source),
            flags={k: layout[k] for k in ("num_parallel", "flash_attention", "kv_cache_type") if k in layout},
            log_evidence=(*evidence, *((line,) if line else ())),
            runtime=(memory_fact(models, engine_info.get("version")), layers, timed),
        )

    def advise(self, facts: EngineFacts, finding: FindingFacts) -> list[Advice]:
        mem, layers = facts.fact("memory_not_in_vram"), facts.fact("gpu_layers")
        partly = mem is not None and mem.value not in (None, "none")
        if finding.bound not in ("link", "transfer") or not (facts.host_weights or partly):
            return []
        note = "Ollama support is written from its source, not tested against a real server"
        if facts.host_weights:
            cause = f"{facts.host_weights} stay in host memory: those layers are computed from host memory"
        else:
            cause = (f"{mem.value if mem else '?'} of the model's memory is not in VRAM ({mem.source if mem else ''}); "
                     "how much of it is weights is unknown (no layer split read)")  # fmt: skip
        said = tuple(f"{f.name}: {'unknown' if f.value is None else f.value} ({f.source})" for f in (mem, layers) if f)
        return [
            Advice(
                cause=cause,
                fix="a smaller quantization or context (num_ctx), fewer parallel slots (OLLAMA_NUM_PARALLEL), "
                "OLLAMA_KV_CACHE_TYPE=q8_0, or more GPU memory, until /api/ps size_vram reaches size",
                evidence=(*said, *facts.log_evidence, note),
                short="model partly in host memory",
            )
        ]


ENGINE = OllamaEngine()
