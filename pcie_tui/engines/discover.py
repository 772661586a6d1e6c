"""Find running inference engines and attach to one, through the engine registry.

Every registered engine (:mod:`pcie_tui.engines.registry`) says which processes are its
own (``classify``: its server, "root", or a helper process under one, "child"); a child
maps back to the root above it. For each engine found: listening ports -> URL, the
process tree, the launch command line, the layout the engine parses from it, and the
version where that is cheap to know. Attach by URL asks each engine's probe paths.
"""

from __future__ import annotations

import os
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urlsplit

import psutil

from pcie_tui.core.errors import UserError
from pcie_tui.engines import registry
from pcie_tui.engines.base import Engine, EngineClient
from pcie_tui.engines.http import http_get, normalize_url

_LOCAL_HOSTS = {"0.0.0.0", "::", "127.0.0.1", "::1", "localhost", ""}


@dataclass(frozen=True)
class EngineCandidate:
    """One running engine found on this host."""

    pid: int
    kind: str  # the engine's registry name
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


def classify(argv: list[str] | tuple[str, ...], name: str = "") -> tuple[str, str] | None:
    """(engine name, "root" | "child") of a process, by its command line and name; None if no engine's."""
    r = registry.for_process(argv, name)
    return (r[0].name, r[1]) if r is not None else None


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


def _candidate(root: psutil.Process, eng: Engine) -> EngineCandidate | None:
    try:
        argv = tuple(root.cmdline())
        children = root.children(recursive=True)
    except psutil.Error:
        return None
    tree = [root.pid] + [c.pid for c in children]
    titles: dict[int, str] = {}
    for c in children:
        try:
            t = eng.child_title(c.cmdline(), c.name())
        except psutil.Error:
            continue
        if t is not None:
            titles[c.pid] = t
    try:
        environ = root.environ()
    except psutil.Error:
        environ = {}
    layout = eng.parse_layout(argv, environ)
    version = eng.version(argv)
    listens = _listens([root.pid]) or _listens(tree[1:])
    expected = layout.get("port") if isinstance(layout.get("port"), int) else eng.default_port
    return EngineCandidate(
        pid=root.pid,
        kind=eng.name,
        url=pick_url(listens, expected),
        cmdline=argv,
        tree_pids=tuple(tree),
        layout=layout,
        version=version,
        ports=tuple(sorted({p for _, p in listens})),
        titles=titles,
    )


def _engine_root(p: psutil.Process) -> tuple[psutil.Process, Engine] | None:
    """The engine process ``p`` belongs to: itself, or the server above a child.

    A child with no server above it (an engine used as a library) belongs to the
    nearest ancestor that is no engine's (pid 1 excepted), else to itself.
    """
    try:
        argv, name = p.cmdline(), p.name()
    except psutil.Error:
        return None
    found = registry.for_process(argv, name)
    if found is None:
        return None
    eng, role = found
    if role == "root":
        return p, eng
    top = None
    try:
        for a in p.parents():
            r = eng.classify(a.cmdline(), a.name())
            if r == "root":
                return a, eng
            if r is None and top is None:
                top = a  # the process that spawned the engine (offline use)
    except psutil.Error:
        pass
    # No server of its own above it: a process another engine calls its server is that engine's
    # (a llama-server started by hand with the flags Ollama gives its runner is a llama-server).
    other = next((e for e in registry.engines() if e is not eng and e.classify(argv, name) == "root"), None)
    if other is not None:
        return p, other
    return (top, eng) if top is not None and top.pid != 1 else (p, eng)


def discover() -> list[EngineCandidate]:
    """Running engines of every registered kind on this host, by pid (this process excluded).

    Engines started by this process (as tests do) are found like any other.
    """
    me = {os.getpid()}
    roots: dict[int, tuple[psutil.Process, Engine]] = {}
    for p in psutil.process_iter(["pid", "name", "cmdline"]):
        if p.pid in me:
            continue
        argv = p.info.get("cmdline") or []
        if registry.for_process(argv, p.info.get("name") or "") is None:
            continue
        r = _engine_root(p)
        if r is not None and r[0].pid not in me:
            roots.setdefault(r[0].pid, r)
    cands = [c for proc, eng in roots.values() if (c := _candidate(proc, eng)) is not None]
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
        raise UserError(f"pid {pid} ({shown}) is not a {registry.displays()} process")
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
    """Kind of the engine answering at ``url`` (each engine's probe paths, registry order).

    UserError when no engine recognises it or nothing answers.
    """
    reasons = []
    for path in registry.probe_paths():
        try:
            status, body = http_get(url + path, timeout_s)
        except OSError as e:
            reasons.append(f"{path}: {e.strerror or e}")
            if isinstance(e, ConnectionRefusedError):
                raise UserError(f"nothing answers at {url} (connection refused)") from None
            continue
        if status != 200:
            reasons.append(f"{path}: HTTP {status}")
            continue
        eng = registry.for_probe(path, status, body[: 1 << 20])
        if eng is not None:
            return eng.name
    why = "; ".join(reasons) if reasons else "no answer any engine recognises at " + ", ".join(registry.probe_paths())
    raise UserError(f"{url} is neither {registry.displays(' nor ')} ({why})")


def _engine(kind: str) -> Engine:
    eng = registry.get(kind)
    if eng is None:
        raise UserError(f"no engine of kind {kind!r} is known to this build")
    return eng


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
        port = cand.layout.get("port") if isinstance(cand.layout.get("port"), int) else _engine(cand.kind).default_port
        url = f"http://{host}:{port}"
    info = cand.info()
    info["gpus"] = gpus_for_tree(running_pids, cand.tree_pids) if running_pids is not None else None
    return _engine(cand.kind).client(url, cand.pid, info, log_path)


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
    return _engine(kind).client(nurl, None, info, log_path)
