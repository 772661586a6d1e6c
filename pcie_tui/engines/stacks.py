"""Opt-in (``--stacks``): where the engine's Python threads are, via ``py-spy dump``.

A low-rate thread (every 2 s by default) runs ``py-spy dump --nonblocking
--json`` (argv list, never a shell; never ``--locals``, so no request data is
read) on the API server, ``VLLM::EngineCore`` and ``VLLM::Worker*``
processes, and classifies each thread: model forward, all-reduce/NCCL,
scheduler, idle, other. Without ptrace permission it says once what to grant
and stops; nothing else is affected.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Sequence
from typing import Any

import psutil

from pcie_tui.engines import registry

STATES = ("all-reduce/NCCL", "model forward", "scheduler", "other", "idle")
_RANK = {s: i for i, s in enumerate(STATES)}  # lower = busier, wins for the process
PTRACE_HINT = (
    "py-spy has no ptrace permission: run pcie-tui as root or grant CAP_SYS_PTRACE "
    "(setcap cap_sys_ptrace+ep {py_spy}; in a container: --cap-add SYS_PTRACE)"
)
# Function names of collectives (pynccl, custom all-reduce, torch.distributed). Not "broadcast": vLLM
# workers wait for work on an shm_broadcast queue, which is idle, not communication.
_COLLECTIVE = ("all_reduce", "allreduce", "all_gather", "allgather", "reduce_scatter", "nccl", "barrier")
# EngineCore.step / collective_rpc: the engine core waiting for its workers' forward pass.
_FORWARD = ("forward", "execute_model", "sample_tokens", "enginecore.step", "step_with_batch_queue", "collective_rpc")
_SCHED = ("schedule", "scheduler")
_WAIT = ("wait", "select", "poll", "recv", "sleep", "get", "accept", "acquire", "epoll", "yield")
# vLLM workers spin (active!) on an shm queue while waiting for the next step: idle, not busy.
_WAIT_FOR_WORK = ("dequeue", "acquire_read", "spincondition.wait")


def find_py_spy() -> str | None:
    """py-spy next to this interpreter, else on PATH."""
    beside = os.path.join(os.path.dirname(sys.executable), "py-spy")
    if os.access(beside, os.X_OK):
        return beside
    return shutil.which("py-spy")


def classify_thread(frames: Sequence[dict[str, Any]], active: bool) -> str:
    """One state for a thread from its frames (innermost first) and py-spy's active flag."""
    text = [(str(f.get("name") or "").lower(), str(f.get("filename") or "").lower()) for f in frames]
    if any(any(k in n for k in _COLLECTIVE) or "nccl" in fn or "all_reduce" in fn for n, fn in text):
        return "all-reduce/NCCL"
    if any(any(k in n for k in _FORWARD) for n, _ in text):
        return "model forward"
    if any(any(k in n for k in _SCHED) or "/sched" in fn for n, fn in text):
        return "scheduler"
    if not active:
        return "idle"
    inner = text[0][0] if text else ""
    if any(k in inner for k in _WAIT) or any(any(k in n for k in _WAIT_FOR_WORK) for n, _ in text[:8]):
        return "idle"
    return "other"


def summarize_dump(dump: list[dict[str, Any]]) -> tuple[str, str | None, dict[str, int]]:
    """(process state, its top frame, thread counts per state) for one py-spy JSON dump."""
    counts: dict[str, int] = {}
    best, top = "idle", None
    for th in dump:
        frames = th.get("frames") or []
        st = classify_thread(frames, bool(th.get("active")))
        counts[st] = counts.get(st, 0) + 1
        if _RANK[st] < _RANK[best] or top is None and st == best:
            best = st
            f = frames[0] if frames else {}
            top = f"{f.get('name')} ({f.get('short_filename')}:{f.get('line')})" if f else None
    return best, top, counts


def _targets(root_pid: int) -> list[tuple[int, str]]:
    """(pid, title) of the Python processes worth dumping: the root and the children an engine titles
    (``Engine.child_title``: vLLM's ``VLLM::`` EngineCore and Workers)."""
    out = []
    try:
        root = psutil.Process(root_pid)
        procs = [root] + root.children(recursive=True)
    except psutil.Error:
        return []
    for p in procs:
        try:
            argv, name = p.cmdline(), p.name()
        except psutil.Error:
            continue
        title = next((t for e in registry.engines() if (t := e.child_title(argv, name)) is not None), None)
        if p.pid == root_pid or title is not None:
            out.append((p.pid, (title or name).strip()))
    return out


class StackSampler:
    """Background py-spy sampling of the engine's process tree."""

    def __init__(
        self,
        root_pid: Callable[[], int | None],
        interval_s: float = 2.0,
        py_spy: str | None = None,
        timeout_s: float = 3.0,
    ) -> None:
        self.root_pid = root_pid
        self.interval_s = interval_s
        self.py_spy = py_spy or find_py_spy()
        self.timeout_s = timeout_s
        self.error: str | None = None
        self._latest: dict[str, Any] | None = None
        self._events: list[dict[str, Any]] = []
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def start(self) -> None:
        if self.py_spy is None:
            self._fail("py-spy not found (pip install py-spy)")
            return
        self._thread = threading.Thread(target=self._run, name="pcie-tui-stacks", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=self.timeout_s + 1)

    def _fail(self, msg: str) -> None:
        with self._lock:
            self.error = msg
            self._events.append({"event": "stacks_unavailable", "t": time.time(), "reason": msg})

    def _run(self) -> None:
        while not self._stop.is_set():
            t0 = time.monotonic()
            self.sample_once()
            if self.error is not None:
                return
            self._stop.wait(max(0.2, self.interval_s - (time.monotonic() - t0)))

    def dump(self, pid: int) -> list[dict[str, Any]] | str:
        """One py-spy JSON dump of ``pid``, or the error text."""
        assert self.py_spy is not None
        argv = [self.py_spy, "dump", "--pid", str(pid), "--json", "--nonblocking"]
        try:
            r = subprocess.run(argv, capture_output=True, timeout=self.timeout_s, check=False)
        except subprocess.TimeoutExpired:
            return "py-spy timed out"
        except OSError as e:
            return f"py-spy failed to start: {e.strerror}"
        if r.returncode != 0:
            return (r.stderr or r.stdout).decode("utf-8", "replace").strip()[:300] or f"py-spy exited {r.returncode}"
        try:
            data = json.loads(r.stdout)
        except ValueError:
            return "py-spy printed no JSON"
        return data if isinstance(data, list) else "py-spy printed unexpected JSON"

    def sample_once(self) -> dict[str, Any] | None:
        """Dump every target once and update the summary (the thread calls this)."""
        root = self.root_pid()
        if root is None:
            self._fail("no engine pid to sample (attached by URL to a remote engine)")
            return None
        procs: list[dict[str, Any]] = []
        states: dict[str, int] = {}
        for pid, title in _targets(root):
            res = self.dump(pid)
            if isinstance(res, str):
                low = res.lower()
                if res.startswith("py-spy failed to start"):
                    self._fail(f"{res} ({self.py_spy}); pip install py-spy")
                    return None
                if "permission" in low or "operation not permitted" in low or "ptrace" in low:
                    self._fail(PTRACE_HINT.format(py_spy=self.py_spy))
                    return None
                if "python" in low and ("version" in low or "interpreter" in low):
                    if pid == root and not procs:
                        self._fail(f"pid {pid} is not a Python process; py-spy does not apply")
                        return None
                    continue
                procs.append({"pid": pid, "title": title, "state": None, "error": res[:120]})
                continue
            st, top, counts = summarize_dump(res)
            procs.append({"pid": pid, "title": title, "state": st, "top": top, "threads": counts})
            states[st] = states.get(st, 0) + 1
        summary = {"t": time.time(), "states": states, "procs": procs}
        with self._lock:
            self._latest = summary
        return summary

    def summary(self) -> dict[str, Any] | None:
        """Latest classification, or {"error": ...} once sampling gave up."""
        with self._lock:
            if self.error is not None:
                return {"error": self.error}
            return self._latest

    def drain_events(self) -> list[dict[str, Any]]:
        with self._lock:
            ev, self._events = self._events, []
        return ev
