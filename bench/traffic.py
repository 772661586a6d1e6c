"""Labelled GPU traffic phases with ground truth timed by CUDA syncs (needs torch + a GPU).

Used on the H200 by scripts/make_reference_session.py, tests/test_gpu.py,
tests/fakenvml/capture.py and bench/run.py. Rates are payload bytes per second
(GB = 1e9 B); a device-to-device copy counts bytes read plus bytes written.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Sequence
from typing import Any

# The phases, in recording order. "expect" is the verdict the analyzer must reach.
PHASES: tuple[tuple[str, str], ...] = (
    ("idle", "none"),
    ("h2d_pinned", "link"),
    ("d2h_pinned", "link"),
    ("d2d_copy", "memory"),
    ("matmul_bf16", "compute"),
    ("h2d_half_duty", "none"),
    ("h2d_pageable", "none"),
)
# Which PCIe direction each phase loads, seen from the GPU (RX = into the GPU).
DIRECTION = {"h2d_pinned": "rx", "d2h_pinned": "tx", "h2d_half_duty": "rx", "h2d_pageable": "rx"}

GiB = 1 << 30
MiB = 1 << 20


class Traffic:
    """Buffers allocated once; ``run(phase, seconds)`` drives one phase and times it."""

    def __init__(self, device: int = 0, copy_bytes: int = GiB, d2d_bytes: int = 4 * GiB, mm_n: int = 8192) -> None:
        import torch

        self.torch = torch
        self.dev = torch.device(f"cuda:{device}")
        torch.cuda.set_device(self.dev)
        self.copy_bytes = copy_bytes
        u8 = torch.uint8
        self.host_pinned = torch.ones(copy_bytes, dtype=u8, pin_memory=True)
        # Pageable: touched once so the first copy does not pay page faults.
        self.host_pageable = torch.ones(copy_bytes // 4, dtype=u8)
        self.dev_buf = torch.ones(copy_bytes, dtype=u8, device=self.dev)
        self.d2d_src = torch.ones(d2d_bytes, dtype=u8, device=self.dev)
        self.d2d_dst = torch.empty(d2d_bytes, dtype=u8, device=self.dev)
        self.mm_n = mm_n
        self.mm_a = torch.randn(mm_n, mm_n, dtype=torch.bfloat16, device=self.dev)
        self.mm_b = torch.randn(mm_n, mm_n, dtype=torch.bfloat16, device=self.dev)
        self.mm_c = torch.empty(mm_n, mm_n, dtype=torch.bfloat16, device=self.dev)
        half = copy_bytes // 2
        self.half_src = self.host_pinned[:half]
        self.half_dst = self.dev_buf[:half]
        # Warm every path once (cuBLAS handles, copy engines).
        for ph, _ in PHASES:
            self.run(ph, 0.0)

    def run(self, phase: str, seconds: float, stop: threading.Event | None = None) -> dict[str, Any]:
        """Drive ``phase`` for ``seconds``; returns the timed truth of what it moved."""
        torch = self.torch
        sync = torch.cuda.synchronize
        nbytes = 0
        iters = 0
        busy_s = 0.0
        flops = 0.0
        sync()
        t0 = time.perf_counter()
        end = t0 + seconds

        def more() -> bool:
            return (iters == 0 or time.perf_counter() < end) and not (stop is not None and stop.is_set())

        if phase == "idle":
            while time.perf_counter() < end and not (stop is not None and stop.is_set()):
                time.sleep(0.01)
        elif phase == "h2d_pinned":
            while more():
                self.dev_buf.copy_(self.host_pinned, non_blocking=True)
                sync()
                nbytes += self.copy_bytes
                iters += 1
        elif phase == "d2h_pinned":
            while more():
                self.host_pinned.copy_(self.dev_buf, non_blocking=True)
                sync()
                nbytes += self.copy_bytes
                iters += 1
        elif phase == "d2d_copy":
            while more():
                for _ in range(8):
                    self.d2d_dst.copy_(self.d2d_src)
                sync()
                nbytes += 8 * 2 * self.d2d_src.numel()
                iters += 8
        elif phase == "matmul_bf16":
            while more():
                for _ in range(10):
                    torch.matmul(self.mm_a, self.mm_b, out=self.mm_c)
                sync()
                iters += 10
            flops = 2.0 * self.mm_n**3 * iters
        elif phase == "h2d_half_duty":
            # ~10 ms copies, each followed by a sleep as long as it took: half duty
            # at a granularity well below GPM's 100 ms window.
            while more():
                c0 = time.perf_counter()
                self.half_dst.copy_(self.half_src, non_blocking=True)
                sync()
                c = time.perf_counter() - c0
                busy_s += c
                nbytes += self.half_src.numel()
                iters += 1
                time.sleep(c)
        elif phase == "h2d_pageable":
            n = self.host_pageable.numel()
            dst = self.dev_buf[:n]
            while more():
                dst.copy_(self.host_pageable)
                sync()
                nbytes += n
                iters += 1
        else:
            raise ValueError(f"unknown phase {phase!r}")
        sync()
        secs = time.perf_counter() - t0
        out: dict[str, Any] = {
            "secs": secs,
            "iters": iters,
            "bytes": nbytes,
            "GBps": nbytes / secs / 1e9 if secs else 0.0,
        }
        if phase in DIRECTION:
            out["direction"] = DIRECTION[phase]
        if flops:
            out["TFLOPs"] = flops / secs / 1e12
        if phase == "h2d_half_duty" and secs:
            out["duty"] = busy_s / secs
        return out


def sample_phases(
    read: Callable[[], Any],
    traffic: Traffic,
    phases: Sequence[str],
    seconds: float,
    interval_s: float = 0.1,
) -> tuple[list[tuple[float, str, Any]], dict[str, dict[str, Any]]]:
    """Run ``phases`` back to back in a thread while ``read()`` is called every ``interval_s``.

    Returns ([(unix_t, phase, reading)], {phase: truth}). Each reading is labelled
    with the phase running when it was taken.
    """
    state = {"phase": phases[0]}
    truth: dict[str, dict[str, Any]] = {}
    done = threading.Event()

    def drive() -> None:
        try:
            for ph in phases:
                state["phase"] = ph
                r = traffic.run(ph, seconds)
                r["start"], r["end"] = time.time() - r["secs"], time.time()
                truth[ph] = r
        finally:
            done.set()

    th = threading.Thread(target=drive, name="traffic", daemon=True)
    out: list[tuple[float, str, Any]] = []
    th.start()
    nxt = time.monotonic()
    while not done.is_set():
        ph = state["phase"]
        t = time.time()
        out.append((t, ph, read()))
        nxt += interval_s
        delay = nxt - time.monotonic()
        if delay > 0:
            done.wait(delay)
        else:
            nxt = time.monotonic()
    th.join()
    return out, truth
