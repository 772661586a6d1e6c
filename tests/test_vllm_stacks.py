"""py-spy stack classification on real Python processes (no engine needed), and the no-ptrace path."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import textwrap
import time

import pytest

from pcie_tui.engines.stacks import STATES, StackSampler, classify_thread, find_py_spy

PY_SPY = find_py_spy()
needs_py_spy = pytest.mark.skipif(PY_SPY is None, reason="py-spy not installed")

BUSY = textwrap.dedent(
    """
    import queue, threading, time
    def forward(x):            # named like a model's forward pass
        while True:
            x = (x * 1103515245 + 12345) % 2147483648
    def scheduler_loop(q):     # waits on a queue, like an idle scheduler
        while True:
            q.get()
    threading.Thread(target=scheduler_loop, args=(queue.Queue(),), daemon=True).start()
    threading.Thread(target=forward, args=(1,), daemon=True).start()
    print("ready", flush=True)
    time.sleep(120)
    """
)


@pytest.fixture
def busy_process():
    p = subprocess.Popen([sys.executable, "-c", BUSY], stdout=subprocess.PIPE)
    assert p.stdout is not None and p.stdout.readline().strip() == b"ready"
    yield p
    p.kill()
    p.wait()


@needs_py_spy
def test_classifies_threads_of_a_real_process(busy_process):
    sampler = StackSampler(lambda: busy_process.pid)
    s = sampler.sample_once()
    assert s is not None and sampler.error is None
    (proc,) = s["procs"]
    assert proc["pid"] == busy_process.pid
    assert proc["state"] == "model forward"  # the busiest thread wins
    assert "forward" in proc["top"]
    assert proc["threads"]["model forward"] == 1
    assert proc["threads"].get("scheduler", 0) == 1  # scheduler_loop, waiting in q.get
    assert set(proc["threads"]) <= set(STATES)


def test_classify_thread_rules():
    f = lambda *names: [{"name": n, "filename": "x.py"} for n in names]  # noqa: E731
    assert classify_thread(f("all_reduce", "forward"), True) == "all-reduce/NCCL"
    assert classify_thread(f("wait", "all_gather"), False) == "all-reduce/NCCL"
    assert classify_thread(f("matmul", "forward", "execute_model"), True) == "model forward"
    assert classify_thread(f("select", "run"), False) == "idle"
    assert classify_thread(f("select", "run"), True) == "idle"
    assert classify_thread(f("compute", "run"), True) == "other"
    # Frames as py-spy showed them in vLLM 0.32 (CPU) under load:
    worker_waiting = f(
        "sched_yield",
        "SpinCondition.wait",
        "MessageQueue.acquire_read",
        "MessageQueue.dequeue",
        "WorkerProc.worker_busy_loop",
    )
    assert classify_thread(worker_waiting, True) == "idle"
    core_stepping = f(
        "sched_yield", "SpinCondition.wait", "MessageQueue.dequeue", "FutureWrapper.result", "EngineCore.step"
    )
    assert classify_thread(core_stepping, True) == "model forward"
    worker_forward = f(
        "onednn_mm", "LogitsProcessor.forward", "GPUModelRunner.execute_model", "WorkerProc.worker_busy_loop"
    )
    assert classify_thread(worker_forward, True) == "model forward"


@needs_py_spy
@pytest.mark.skipif(
    os.geteuid() != 0 or shutil.which("setpriv") is None, reason="needs root and setpriv to drop ptrace"
)
def test_without_ptrace_permission_one_line_and_stop(busy_process, tmp_path):
    # A real py-spy run as 'nobody' against our process: the real permission error.
    wrapper = tmp_path / "py-spy-as-nobody"
    wrapper.write_text(f'#!/bin/sh\nexec setpriv --reuid=65534 --regid=65534 --clear-groups {PY_SPY} "$@"\n')
    wrapper.chmod(0o755)
    sampler = StackSampler(lambda: busy_process.pid, interval_s=0.2, py_spy=str(wrapper))
    sampler.start()
    deadline = time.monotonic() + 10
    while sampler.error is None and time.monotonic() < deadline:
        time.sleep(0.05)
    sampler.stop()
    assert sampler.error is not None and "CAP_SYS_PTRACE" in sampler.error and "root" in sampler.error
    assert "\n" not in sampler.error
    ev = sampler.drain_events()
    assert [e["event"] for e in ev] == ["stacks_unavailable"]
    assert sampler.summary() == {"error": sampler.error}
    assert sampler._thread is not None and not sampler._thread.is_alive()  # gave up, no retry storm


def test_missing_py_spy_is_one_line():
    sampler = StackSampler(lambda: os.getpid(), py_spy="/nonexistent/py-spy")
    assert sampler.sample_once() is None
    assert sampler.error.startswith("py-spy failed to start") and "\n" not in sampler.error
    sampler2 = StackSampler(lambda: None)
    assert sampler2.sample_once() is None and "no engine pid" in sampler2.error
