"""Pinned host<->device and device<->device copies, timed on the GPU.

Two backends, tried in order: PyTorch (when installed) and cuda-python (the
``calibrate`` extra). Copies are queued on a stream between two timing events,
so the host is free while they run: the caller's ``during`` hook reads NVML
counters inside the copy window. Nothing here imports either library at
module import time.
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable
from typing import Any

from pcie_tui.core.errors import UserError

MISSING_BACKEND = (
    "calibrate needs PyTorch with CUDA or cuda-python: pip install 'pcie-tui[calibrate]' (installs cuda-python)"
)


def _norm_bus(b: str) -> str:
    b = b.strip().lower()
    dom, rest = b.split(":", 1) if b.count(":") == 2 else ("0000", b)
    return f"{dom[-4:]}:{rest}"


class _Beside:
    """Runs ``during`` in a thread while the caller issues copies that block the host (pageable memory)."""

    def __init__(self, during: Callable[[], Any] | None) -> None:
        self.result: Any = None
        self.thread = threading.Thread(target=self._run, args=(during,), daemon=True) if during else None
        if self.thread is not None:
            self.thread.start()

    def _run(self, during: Callable[[], Any]) -> None:
        self.result = during()

    def join(self) -> Any:
        if self.thread is not None:
            self.thread.join()
        return self.result


class TorchBackend:
    name = "torch"

    def __init__(self) -> None:
        os.environ.setdefault("CUDA_DEVICE_ORDER", "PCI_BUS_ID")
        import torch

        if not torch.cuda.is_available():
            raise RuntimeError("torch sees no CUDA device")
        self.torch = torch

    def device_count(self) -> int:
        return int(self.torch.cuda.device_count())

    def bus_id(self, dev: int) -> str | None:
        p = self.torch.cuda.get_device_properties(dev)
        dom, bus, slot = (getattr(p, k, None) for k in ("pci_domain_id", "pci_bus_id", "pci_device_id"))
        if bus is None or slot is None:
            return None
        return f"{int(dom or 0):04x}:{int(bus):02x}:{int(slot):02x}.0"

    def copy_rate(
        self,
        dev: int,
        direction: str,
        size_bytes: int,
        duration_s: float,
        during: Callable[[], Any] | None = None,
        pinned: bool = True,
    ) -> tuple[float, Any]:
        """Payload bytes/s of back-to-back copies ('h2d' or 'd2h') from pinned or pageable host memory,
        and what ``during`` returned. Pageable copies go through the driver's staging buffers, the path
        an engine takes when its host weights are mmapped."""
        t = self.torch
        with t.cuda.device(dev):
            host = t.empty(size_bytes, dtype=t.uint8, pin_memory=pinned)
            host.fill_(1)  # touch every page: an untouched pageable buffer would fault during the copy
            gpu = t.empty(size_bytes, dtype=t.uint8, device=f"cuda:{dev}")
            stream = t.cuda.Stream(dev)
            dst, src = (gpu, host) if direction == "h2d" else (host, gpu)

            def one() -> None:
                dst.copy_(src, non_blocking=True)

            with t.cuda.stream(stream):
                for _ in range(2):
                    one()
                stream.synchronize()
                t0 = time.perf_counter()
                one()
                stream.synchronize()
                n = max(4, int(duration_s / max(time.perf_counter() - t0, 1e-4)))
                start, end = t.cuda.Event(enable_timing=True), t.cuda.Event(enable_timing=True)
                # Pageable copies hold the host until each is staged: read the counters beside them.
                reader = _Beside(during) if not pinned else None
                start.record(stream)
                for _ in range(n):
                    one()
                end.record(stream)
            got = reader.join() if reader is not None else during() if during is not None else None
            end.synchronize()
            secs = start.elapsed_time(end) / 1e3
        del host, gpu
        return n * size_bytes / secs, got

    def peer_rate(self, src: int, dst: int, size_bytes: int, duration_s: float) -> float:
        t = self.torch
        a = t.empty(size_bytes, dtype=t.uint8, device=f"cuda:{src}")
        b = t.empty(size_bytes, dtype=t.uint8, device=f"cuda:{dst}")
        b.copy_(a)
        t.cuda.synchronize(src)
        t.cuda.synchronize(dst)
        n = 0
        t0 = time.perf_counter()
        while time.perf_counter() - t0 < duration_s:
            for _ in range(4):
                b.copy_(a, non_blocking=True)
            n += 4
            t.cuda.synchronize(src)
            t.cuda.synchronize(dst)
        return n * size_bytes / (time.perf_counter() - t0)

    def background_load(self, devs: list[int], stop: threading.Event, size_bytes: int = 64 << 20) -> None:
        """Copy host->device and back on each GPU until ``stop`` is set (runs in a thread)."""
        t = self.torch
        bufs = []
        for d in devs:
            with t.cuda.device(d):
                bufs.append(
                    (
                        d,
                        t.empty(size_bytes, dtype=t.uint8, pin_memory=True),
                        t.empty(size_bytes, dtype=t.uint8, device=f"cuda:{d}"),
                    )
                )
        while not stop.is_set():
            for _d, h, g in bufs:
                g.copy_(h, non_blocking=True)
                h.copy_(g, non_blocking=True)
            for d, _, _ in bufs:
                t.cuda.synchronize(d)


class CudaPythonBackend:
    name = "cuda-python"

    def __init__(self) -> None:
        os.environ.setdefault("CUDA_DEVICE_ORDER", "PCI_BUS_ID")
        try:
            from cuda.bindings import runtime as cudart  # cuda-python >= 12.6
        except ImportError:
            from cuda import cudart  # type: ignore[no-redef]
        self.rt = cudart
        if self.device_count() == 0:
            raise RuntimeError("cuda-python sees no CUDA device")

    def _ck(self, res: Any) -> Any:
        err, *rest = res if isinstance(res, tuple) else (res,)
        if int(err) != 0:
            raise RuntimeError(f"CUDA error {err}")
        return rest[0] if len(rest) == 1 else rest

    def device_count(self) -> int:
        return int(self._ck(self.rt.cudaGetDeviceCount()))

    def bus_id(self, dev: int) -> str | None:
        raw = self._ck(self.rt.cudaDeviceGetPCIBusId(32, dev))
        text = raw.decode() if isinstance(raw, bytes) else str(raw)
        return _norm_bus(text.split("\x00", 1)[0])

    def copy_rate(
        self,
        dev: int,
        direction: str,
        size_bytes: int,
        duration_s: float,
        during: Callable[[], Any] | None = None,
        pinned: bool = True,
    ) -> tuple[float, Any]:
        rt = self.rt
        self._ck(rt.cudaSetDevice(dev))
        pageable = None
        if pinned:
            host = self._ck(rt.cudaMallocHost(size_bytes))
        else:
            import numpy as np

            pageable = np.ones(size_bytes, dtype=np.uint8)  # ordinary (pageable) memory, every page touched
            host = pageable.ctypes.data
        gpu = self._ck(rt.cudaMalloc(size_bytes))
        stream = self._ck(rt.cudaStreamCreate())
        ev0, ev1 = self._ck(rt.cudaEventCreate()), self._ck(rt.cudaEventCreate())
        kind = (
            rt.cudaMemcpyKind.cudaMemcpyHostToDevice if direction == "h2d" else rt.cudaMemcpyKind.cudaMemcpyDeviceToHost
        )
        dst, src = (gpu, host) if direction == "h2d" else (host, gpu)
        try:
            for _ in range(2):
                self._ck(rt.cudaMemcpyAsync(dst, src, size_bytes, kind, stream))
            self._ck(rt.cudaStreamSynchronize(stream))
            t0 = time.perf_counter()
            self._ck(rt.cudaMemcpyAsync(dst, src, size_bytes, kind, stream))
            self._ck(rt.cudaStreamSynchronize(stream))
            n = max(4, int(duration_s / max(time.perf_counter() - t0, 1e-4)))
            reader = _Beside(during) if not pinned else None
            self._ck(rt.cudaEventRecord(ev0, stream))
            for _ in range(n):
                self._ck(rt.cudaMemcpyAsync(dst, src, size_bytes, kind, stream))
            self._ck(rt.cudaEventRecord(ev1, stream))
            got = reader.join() if reader is not None else during() if during is not None else None
            self._ck(rt.cudaEventSynchronize(ev1))
            ms = float(self._ck(rt.cudaEventElapsedTime(ev0, ev1)))
        finally:
            rt.cudaEventDestroy(ev0)
            rt.cudaEventDestroy(ev1)
            rt.cudaStreamDestroy(stream)
            rt.cudaFree(gpu)
            if pageable is None:
                rt.cudaFreeHost(host)
        return n * size_bytes / (ms / 1e3), got

    def peer_rate(self, src: int, dst: int, size_bytes: int, duration_s: float) -> float:
        rt = self.rt
        self._ck(rt.cudaSetDevice(src))
        a = self._ck(rt.cudaMalloc(size_bytes))
        self._ck(rt.cudaSetDevice(dst))
        b = self._ck(rt.cudaMalloc(size_bytes))
        try:
            n = 0
            t0 = time.perf_counter()
            while time.perf_counter() - t0 < duration_s:
                for _ in range(4):
                    self._ck(rt.cudaMemcpyPeerAsync(b, dst, a, src, size_bytes, 0))
                n += 4
                self._ck(rt.cudaDeviceSynchronize())
            return n * size_bytes / (time.perf_counter() - t0)
        finally:
            rt.cudaFree(b)
            self._ck(rt.cudaSetDevice(src))
            rt.cudaFree(a)

    def background_load(self, devs: list[int], stop: threading.Event, size_bytes: int = 64 << 20) -> None:
        while not stop.is_set():
            for d in devs:
                self.copy_rate(d, "h2d", size_bytes, 0.05)


def load_backend(prefer: str | None = None) -> TorchBackend | CudaPythonBackend:
    """The first copy backend that imports and sees a GPU; UserError naming the extra otherwise."""
    errors = []
    order: list[type[TorchBackend] | type[CudaPythonBackend]] = [TorchBackend, CudaPythonBackend]
    if prefer == "cuda-python":
        order.reverse()
    for cls in order:
        try:
            return cls()
        except ImportError as e:
            errors.append(f"{cls.name}: not installed ({e.name or e})")
        except Exception as e:  # CUDA init failures come in many types
            errors.append(f"{cls.name}: {e}")
    raise UserError(f"{MISSING_BACKEND} [{'; '.join(errors)}]")


def map_devices(backend: Any, bdfs: list[str]) -> dict[str, int]:
    """NVML bus id -> backend device index (by PCI bus id; by order when the backend cannot say)."""
    out: dict[str, int] = {}
    n = backend.device_count()
    for d in range(n):
        try:
            b = backend.bus_id(d)
        except Exception:
            b = None
        if b is not None:
            out[_norm_bus(b)] = d
    if not out and n == len(bdfs):
        out = {b: i for i, b in enumerate(bdfs)}
    return out
