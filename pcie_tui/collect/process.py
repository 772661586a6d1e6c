"""Find running inference engines and attach to one.

vLLM: API servers by command line (``-m vllm.entrypoints.openai.api_server``,
``vllm serve``); its ``VLLM::EngineCore`` and ``VLLM::Worker*`` children (by
process title) map back to the API server that owns them. llama.cpp:
``llama-server`` processes. For each: listening ports -> URL, the process
tree, the launch command line, the parallel/split layout parsed from it, and
the version where that is cheap to know.
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import psutil

from pcie_tui.collect.engine import http_get, normalize_url
from pcie_tui.collect.engine_base import EngineClient
from pcie_tui.errors import UserError

DEFAULT_PORT = {"vllm": 8000, "llamacpp": 8080}
_LOCAL_HOSTS = {"0.0.0.0", "::", "127.0.0.1", "::1", "localhost", ""}

VLLM_FLAGS: dict[str, tuple[str, ...]] = {
    "tensor_parallel_size": ("--tensor-parallel-size", "-tp"),
    "pipeline_parallel_size": ("--pipeline-parallel-size", "-pp"),
    "data_parallel_size": ("--data-parallel-size", "-dp"),
    "model": ("--model",),
    "served_model_name": ("--served-model-name",),
    "host": ("--host",),
    "port": ("--port",),
}


@dataclass(frozen=True)
class EngineCandidate:
    """One running engine found on this host."""

    pid: int
    kind: str  # "vllm" | "llamacpp"
    url: str | None
    cmdline: tuple[str, ...]
    tree_pids: tuple[int, ...] = ()
    layout: dict[str, Any] = field(default_factory=dict)
    version: str | None = None
    ports: tuple[int, ...] = ()
    titles: dict[int, str] = field(default_factory=dict)  # pid -> process title for engine children

    def info(self) -> dict[str, Any]:
        """Static facts a client puts into ``describe()``."""
        return {
            "cmdline": list(self.cmdline),
            "layout": self.layout,
            "version": self.version,
            "tree_pids": list(self.tree_pids),
            "titles": {str(k): v for k, v in self.titles.items()},
        }


# ---- command lines --------------------------------------------------------


def flag_values(argv: Sequence[str], spec: dict[str, tuple[str, ...]]) -> dict[str, str | bool]:
    """Values of the flags in ``spec`` from ``--flag v``, ``--flag=v``, ``-f v`` and ``-f=v`` (last wins).

    A flag with no value after it (end of argv or another flag follows) reads True.
    """
    alias = {name: key for key, names in spec.items() for name in names}
    out: dict[str, str | bool] = {}
    i = 0
    while i < len(argv):
        a = argv[i]
        name, eq, val = a.partition("=")
        if name in alias:
            if eq:
                out[alias[name]] = val
            elif i + 1 < len(argv) and not _is_flag(argv[i + 1]):
                out[alias[name]] = argv[i + 1]
                i += 1
            else:
                out[alias[name]] = True
        i += 1
    return out


def _is_flag(a: str) -> bool:
    return a.startswith("-") and not re.fullmatch(r"-\d+(\.\d+)?", a)


def _int_or(v: str | bool | None, default: Any = None) -> Any:
    if v is None or isinstance(v, bool):
        return default
    try:
        return int(v)
    except ValueError:
        return v


def parse_vllm_layout(argv: Sequence[str]) -> dict[str, Any]:
    """tp/pp/dp sizes (1 where absent) plus model/host/port from a vLLM command line."""
    f = flag_values(argv, VLLM_FLAGS)
    tp = _int_or(f.get("tensor_parallel_size"), 1)
    pp = _int_or(f.get("pipeline_parallel_size"), 1)
    dp = _int_or(f.get("data_parallel_size"), 1)
    model = f.get("model")
    if model is None:  # `vllm serve MODEL ...`
        for i, a in enumerate(argv[:-1]):
            if a == "serve" and not _is_flag(argv[i + 1]):
                model = argv[i + 1]
                break
    out: dict[str, Any] = {
        "tensor_parallel_size": tp,
        "pipeline_parallel_size": pp,
        "data_parallel_size": dp,
        "gpus_expected": tp * pp * dp if all(isinstance(x, int) for x in (tp, pp, dp)) else None,
        "explicit": sorted(
            k for k in ("tensor_parallel_size", "pipeline_parallel_size", "data_parallel_size") if k in f
        ),
        "model": model if isinstance(model, str) else None,
        "host": f.get("host") if isinstance(f.get("host"), str) else None,
        "port": _int_or(f.get("port")),
    }
    return out


def parse_llama_layout(argv: Sequence[str], environ: dict[str, str] | None = None) -> dict[str, Any]:
    """-sm/-ts/-mg/-ngl (+ LLAMA_ARG_* variables) as llama.cpp support parses them; absent flags are absent."""
    from pcie_tui.collect.llamaproc import parse_layout

    return parse_layout(list(argv), environ)


def classify(argv: Sequence[str], name: str = "") -> str | None:
    """What a process is: "vllm" (API server), "vllm-child" (EngineCore/Worker title), "llamacpp", or None."""
    first = argv[0] if argv else ""
    if first.startswith("VLLM::") or name.startswith("VLLM::"):
        return "vllm-child"
    if os.path.basename(first) == "llama-server" or name == "llama-server":
        return "llamacpp"
    for i, a in enumerate(argv[:3]):
        if os.path.basename(a) == "vllm" and i + 1 < len(argv) and argv[i + 1] == "serve":
            return "vllm"
    for i, a in enumerate(argv):
        if a in ("vllm.entrypoints.openai.api_server", "vllm.entrypoints.api_server") and i > 0 and argv[i - 1] == "-m":
            return "vllm"
        if a == "-m" and i + 2 < len(argv) and argv[i + 1] == "vllm.entrypoints.cli.main" and argv[i + 2] == "serve":
            return "vllm"
        if a.endswith(("vllm/entrypoints/openai/api_server.py", "vllm/entrypoints/api_server.py")):
            return "vllm"
    return None


def pick_url(listens: Iterable[tuple[str, int]], expected_port: int | None) -> str | None:
    """A URL from (address, port) listening sockets: the expected port first, loopback preferred."""
    socks = sorted(set(listens), key=lambda x: (x[1] != expected_port, x[1]))
    if not socks:
        return None
    port = socks[0][1]
    addrs = {a for a, p in socks if p == port}
    if addrs & {"0.0.0.0", "127.0.0.1", "::"} or not addrs:
        host = "127.0.0.1"
    elif "::1" in addrs:
        host = "[::1]"
    else:
        a = sorted(addrs)[0]
        host = f"[{a}]" if ":" in a else a
    return f"http://{host}:{port}"


def gpus_for_tree(running_pids: dict[int, list[int]] | None, tree_pids: Iterable[int]) -> list[int]:
    """GPU indices where any pid of the engine's process tree runs (NVML running processes)."""
    tree = set(tree_pids)
    return sorted(i for i, pids in (running_pids or {}).items() if tree.intersection(pids))


# ---- processes --------------------------------------------------------------


def process_tree(pid: int | None) -> list[int]:
    """pid and all its descendants (empty if it is gone)."""
    if pid is None:
        return []
    try:
        p = psutil.Process(pid)
        return [pid] + [c.pid for c in p.children(recursive=True)]
    except psutil.Error:
        return []


def _listens(pids: Iterable[int]) -> list[tuple[str, int]]:
    out: list[tuple[str, int]] = []
    for pid in pids:
        try:
            conns = psutil.Process(pid).net_connections(kind="inet")
        except psutil.Error:
            continue
        out.extend((c.laddr.ip, c.laddr.port) for c in conns if c.status == psutil.CONN_LISTEN and c.laddr)
    return out


def _vllm_version_from_venv(argv: Sequence[str]) -> str | None:
    """vLLM's version from the dist-info beside the interpreter that runs it (no import)."""
    exe = argv[0] if argv else ""
    if not os.path.isabs(exe):
        return None
    prefix = Path(exe).parent.parent
    for d in sorted(prefix.glob("lib/python3*/site-packages/vllm*.dist-info")):
        m = re.fullmatch(r"vllm(?:[_-]cpu)?-([0-9][^-]*)\.dist-info", d.name)
        if m:
            return m.group(1)
    return None


def _candidate(root: psutil.Process, kind: str) -> EngineCandidate | None:
    try:
        argv = tuple(root.cmdline())
        children = root.children(recursive=True)
    except psutil.Error:
        return None
    tree = [root.pid] + [c.pid for c in children]
    titles: dict[int, str] = {}
    for c in children:
        try:
            cargv = c.cmdline()
            t = cargv[0] if cargv and cargv[0].startswith("VLLM::") else c.name()
        except psutil.Error:
            continue
        if t.startswith("VLLM::"):
            titles[c.pid] = t.strip()
    if kind == "vllm":
        layout = parse_vllm_layout(argv)
        version = _vllm_version_from_venv(argv)
    else:
        try:
            environ = root.environ()
        except psutil.Error:
            environ = {}
        layout = parse_llama_layout(argv, environ)
        version = None
    listens = _listens([root.pid]) or _listens(tree[1:])
    expected = layout.get("port") if isinstance(layout.get("port"), int) else DEFAULT_PORT[kind]
    return EngineCandidate(
        pid=root.pid,
        kind=kind,
        url=pick_url(listens, expected),
        cmdline=argv,
        tree_pids=tuple(tree),
        layout=layout,
        version=version,
        ports=tuple(sorted({p for _, p in listens})),
        titles=titles,
    )


def _engine_root(p: psutil.Process) -> tuple[psutil.Process, str] | None:
    """The engine process ``p`` belongs to (itself, or the API server above a VLLM:: child)."""
    try:
        kind = classify(p.cmdline(), p.name())
    except psutil.Error:
        return None
    if kind in ("vllm", "llamacpp"):
        return p, kind
    if kind == "vllm-child":
        top = None
        try:
            for a in p.parents():
                k = classify(a.cmdline(), a.name())
                if k == "vllm":
                    return a, "vllm"
                if k is None and top is None:
                    top = a  # the Python process that spawned the engine (offline LLM use)
        except psutil.Error:
            pass
        return (top, "vllm") if top is not None and top.pid != 1 else (p, "vllm")
    return None


def discover() -> list[EngineCandidate]:
    """Running vLLM and llama-server engines on this host, by pid (this process excluded).

    Engines started by this process (as tests do) are found like any other.
    """
    me = {os.getpid()}
    roots: dict[int, tuple[psutil.Process, str]] = {}
    for p in psutil.process_iter(["pid", "name", "cmdline"]):
        if p.pid in me:
            continue
        argv = p.info.get("cmdline") or []
        if classify(argv, p.info.get("name") or "") is None:
            continue
        r = _engine_root(p)
        if r is not None and r[0].pid not in me:
            roots.setdefault(r[0].pid, r)
    cands = [c for proc, kind in roots.values() if (c := _candidate(proc, kind)) is not None]
    # A wrapper whose child is also an engine (e.g. a launcher script): keep the one that listens.
    inner = {pid for c in cands for pid in c.tree_pids[1:]}
    kept = [c for c in cands if c.pid not in inner or c.ports]
    drop = {c.pid for c in kept if c.pid not in inner and any(o.pid in c.tree_pids[1:] and o.ports for o in kept)}
    return sorted((c for c in kept if c.pid not in drop), key=lambda c: c.pid)


def candidate_for_pid(pid: int) -> EngineCandidate:
    """The engine a pid belongs to; UserError when it is none."""
    try:
        p = psutil.Process(pid)
        name, argv = p.name(), p.cmdline()
    except psutil.NoSuchProcess:
        raise UserError(f"no process with pid {pid}") from None
    except psutil.AccessDenied:
        raise UserError(f"cannot inspect pid {pid}: permission denied (run as its user or root)") from None
    r = _engine_root(p)
    if r is None:
        # A launcher (a shell or container init that started the engine: its parent or grandparent)
        # above exactly one engine is fine too; pid 1 and other far ancestors are above everything.
        below = [c for c in discover() if pid != 1 and pid in _ancestors(c.pid, depth=2)]
        if len(below) == 1:
            return below[0]
        shown = " ".join(argv)[:80] or name
        raise UserError(f"pid {pid} ({shown}) is not a vLLM or llama-server process")
    c = _candidate(*r)
    if c is None:
        raise UserError(f"pid {pid} exited while being inspected")
    return c


def _ancestors(pid: int, depth: int | None = None) -> set[int]:
    """Pids above ``pid`` (the nearest ``depth`` of them when given)."""
    try:
        return {a.pid for a in psutil.Process(pid).parents()[:depth]}
    except psutil.Error:
        return set()


def _pid_listening_on(port: int) -> int | None:
    try:
        for c in psutil.net_connections(kind="inet"):
            if c.status == psutil.CONN_LISTEN and c.laddr and c.laddr.port == port and c.pid:
                return c.pid
    except (psutil.Error, OSError):
        pass
    return None


def probe_kind(url: str, timeout_s: float = 1.0) -> str:
    """Kind ("vllm" or "llamacpp") of what answers at ``url``; UserError when it is neither or nothing answers."""
    reasons = []
    for path in ("/metrics", "/version", "/props"):
        try:
            status, body = http_get(url + path, timeout_s)
        except OSError as e:
            reasons.append(f"{path}: {e.strerror or e}")
            if isinstance(e, ConnectionRefusedError):
                raise UserError(f"nothing answers at {url} (connection refused)") from None
            continue
        text = body[: 1 << 20].decode("utf-8", "replace")
        if status != 200:
            reasons.append(f"{path}: HTTP {status}")
            continue
        if path == "/metrics":
            if "vllm:" in text:
                return "vllm"
            if "llamacpp:" in text:
                return "llamacpp"
            continue
        try:
            obj = json.loads(text)
        except ValueError:
            continue
        if path == "/version" and isinstance(obj, dict) and "version" in obj:
            return "vllm"
        if (
            path == "/props"
            and isinstance(obj, dict)
            and ({"default_generation_settings", "total_slots", "build_info"} & obj.keys())
        ):
            return "llamacpp"
    why = "; ".join(reasons) if reasons else "no vllm:/llamacpp: metrics, no /version, no /props"
    raise UserError(f"{url} is neither vLLM nor llama-server ({why})")


def client_for(
    cand: EngineCandidate,
    url: str | None = None,
    log_path: str | None = None,
    running_pids: dict[int, list[int]] | None = None,
) -> EngineClient:
    """A client for a discovered engine."""
    url = url or cand.url
    if url is None:
        host = cand.layout.get("host") or "127.0.0.1"
        host = "127.0.0.1" if host in _LOCAL_HOSTS else host
        port = cand.layout.get("port") if isinstance(cand.layout.get("port"), int) else DEFAULT_PORT[cand.kind]
        url = f"http://{host}:{port}"
    info = cand.info()
    info["gpus"] = gpus_for_tree(running_pids, cand.tree_pids) if running_pids is not None else None
    if cand.kind == "vllm":
        from pcie_tui.collect.vllm import VllmClient

        return VllmClient(url, pid=cand.pid, info=info)
    try:
        from pcie_tui.collect.llamacpp import LlamaCppClient
    except ImportError:
        raise UserError("llama-server support is not available in this build") from None
    return LlamaCppClient(url, pid=cand.pid, log_path=log_path, info=info)  # type: ignore[no-any-return]


def attach(
    pid: int | None = None,
    url: str | None = None,
    log_path: str | None = None,
    running_pids: dict[int, list[int]] | None = None,
) -> EngineClient:
    """A client for the engine given by pid, by URL, or both. UserError when it is not an engine."""
    if pid is None and url is None:
        raise UserError("attach needs --pid or --url")
    nurl = normalize_url(url) if url is not None else None
    if pid is not None:
        return client_for(candidate_for_pid(pid), nurl, log_path, running_pids)
    assert nurl is not None
    kind = probe_kind(nurl)
    parts = urlsplit(nurl)
    local_pid = _pid_listening_on(parts.port or 80) if (parts.hostname or "") in _LOCAL_HOSTS else None
    if local_pid is not None:
        try:
            cand = candidate_for_pid(local_pid)
            if cand.kind == kind:
                return client_for(cand, nurl, log_path, running_pids)
        except UserError:
            pass
    # Remote, or nothing local owns the port: metrics only, no process facts.
    info: dict[str, Any] = {"cmdline": None, "layout": None, "version": None, "tree_pids": [], "gpus": None}
    if kind == "vllm":
        from pcie_tui.collect.vllm import VllmClient

        return VllmClient(nurl, pid=None, info=info)
    try:
        from pcie_tui.collect.llamacpp import LlamaCppClient
    except ImportError:
        raise UserError("llama-server support is not available in this build") from None
    return LlamaCppClient(nurl, pid=None, log_path=log_path, info=info)  # type: ignore[no-any-return]
