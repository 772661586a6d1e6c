"""Capture raw NVML/GPM answers on a real GPU for the stand-in pynvml (run ON the GPU machine).

Every value is what NVML returned, in NVML's own units, with errors kept as
"ret N" (the nvmlReturn code). Traffic phases come from bench/traffic.py and
are timed with CUDA syncs, so the fixture also carries their ground truth.

usage: PYTHONPATH=. python3 tests/fakenvml/capture.py OUT.json [seconds_per_phase]
"""

from __future__ import annotations

import json
import os
import socket
import sys
import threading
import time
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

import pynvml as nv  # noqa: E402

from bench.traffic import PHASES, Traffic  # noqa: E402

GPM_METRICS = (
    "NVML_GPM_METRIC_PCIE_TX_PER_SEC",
    "NVML_GPM_METRIC_PCIE_RX_PER_SEC",
    "NVML_GPM_METRIC_NVLINK_TOTAL_TX_PER_SEC",
    "NVML_GPM_METRIC_NVLINK_TOTAL_RX_PER_SEC",
    "NVML_GPM_METRIC_DRAM_BW_UTIL",
    "NVML_GPM_METRIC_SM_UTIL",
    "NVML_GPM_METRIC_SM_OCCUPANCY",
    "NVML_GPM_METRIC_GRAPHICS_UTIL",
)
SHORT_WINDOWS_S = (0.02, 0.05, 0.08)


def ans(fn: Any, *args: Any) -> Any:
    try:
        return fn(*args)
    except nv.NVMLError as e:
        return f"ret {e.value}"


def txt(v: Any) -> Any:
    return v.decode() if isinstance(v, bytes) else v


def gpm_metrics(s1: Any, s2: Any) -> dict[str, Any]:
    req = nv.c_nvmlGpmMetricsGet_t()
    req.version = nv.NVML_GPM_METRICS_GET_VERSION
    req.numMetrics = len(GPM_METRICS)
    req.sample1, req.sample2 = s1, s2
    for i, name in enumerate(GPM_METRICS):
        req.metrics[i].metricId = getattr(nv, name)
    try:
        nv.nvmlGpmMetricsGet(req)
    except nv.NVMLError as e:
        return {"call": f"ret {e.value}"}
    out: dict[str, Any] = {}
    for i, name in enumerate(GPM_METRICS):
        m = req.metrics[i]
        out[name] = m.value if m.nvmlReturn == nv.NVML_SUCCESS else f"ret {m.nvmlReturn}"
    return out


def procs(fn: Any, h: Any) -> Any:
    r = ans(fn, h)
    return r if isinstance(r, str) else [[p.pid, p.usedGpuMemory] for p in r]


def pcie_mps(bdf: str) -> dict[str, Any]:
    """Max payload / read request size from PCIe config space (DevCtl), if readable."""
    dom, bus, devfn = bdf.lower().split(":")[-3:] if bdf.count(":") >= 2 else ("", "", "")
    path = Path(f"/sys/bus/pci/devices/{dom[-4:]}:{bus}:{devfn}/config")
    try:
        cfg = path.read_bytes()
    except OSError as e:
        return {"error": f"{path}: {e.strerror}"}
    ptr = cfg[0x34] if len(cfg) > 0x34 else 0
    seen = 0
    while ptr and seen < 48 and ptr + 10 < len(cfg):
        if cfg[ptr] == 0x10:  # PCI Express capability
            devctl = int.from_bytes(cfg[ptr + 8 : ptr + 10], "little")
            devcap = int.from_bytes(cfg[ptr + 4 : ptr + 8], "little")
            return {
                "path": str(path),
                "max_payload_bytes": 128 << ((devctl >> 5) & 7),
                "max_read_request_bytes": 128 << ((devctl >> 12) & 7),
                "max_payload_supported_bytes": 128 << (devcap & 7),
            }
        ptr = cfg[ptr + 1]
        seen += 1
    return {"error": "no PCIe capability found", "len": len(cfg)}


def timing(fn: Any, n: int) -> dict[str, float]:
    c0, w0 = time.process_time(), time.perf_counter()
    for _ in range(n):
        fn()
    return {"cpu_ms": (time.process_time() - c0) / n * 1e3, "wall_ms": (time.perf_counter() - w0) / n * 1e3, "n": n}


def main(out: str, seconds: float = 3.0) -> None:
    nv.nvmlInit()
    h = nv.nvmlDeviceGetHandleByIndex(0)
    traffic = Traffic(0)
    bdf = txt(nv.nvmlDeviceGetPciInfo(h).busId)
    mem = nv.nvmlDeviceGetMemoryInfo(h)
    links = []
    for link in range(nv.NVML_NVLINK_MAX_LINKS):
        a = ans(nv.nvmlDeviceGetNvLinkState, h, link)
        links.append(a)
        if isinstance(a, str):
            break
    fv = ans(nv.nvmlDeviceGetFieldValues, h, [nv.NVML_FI_DEV_NVLINK_SPEED_MBPS_COMMON])
    static = {
        "count": nv.nvmlDeviceGetCount(),
        "name": txt(nv.nvmlDeviceGetName(h)),
        "uuid": txt(nv.nvmlDeviceGetUUID(h)),
        "pci_bus_id": bdf,
        "curr_gen": ans(nv.nvmlDeviceGetCurrPcieLinkGeneration, h),
        "curr_width": ans(nv.nvmlDeviceGetCurrPcieLinkWidth, h),
        "max_gen": ans(nv.nvmlDeviceGetMaxPcieLinkGeneration, h),
        "max_width": ans(nv.nvmlDeviceGetMaxPcieLinkWidth, h),
        "gpu_max_gen": ans(nv.nvmlDeviceGetGpuMaxPcieLinkGeneration, h),
        "mem": [mem.total, mem.free, mem.used],
        "gpm_supported": nv.nvmlGpmQueryDeviceSupport(h).isSupportedDevice,
        "nvlink_state": links,
        "nvlink_speed_field": fv
        if isinstance(fv, str)
        else (f"ret {fv[0].nvmlReturn}" if fv[0].nvmlReturn else fv[0].value.uiVal),
        "procs_compute": procs(nv.nvmlDeviceGetComputeRunningProcesses, h),
        "procs_graphics": procs(nv.nvmlDeviceGetGraphicsRunningProcesses, h),
        "own_pid": os.getpid(),
        "pcie_config": pcie_mps(bdf),
    }
    bufs = [nv.nvmlGpmSampleAlloc() for _ in range(4)]
    ticks: list[dict[str, Any]] = []
    short: list[dict[str, Any]] = []
    truth: dict[str, Any] = {}
    state = {"phase": "idle", "stop": False}

    def drive() -> None:
        for ph, _ in PHASES:
            state["phase"] = ph
            truth[ph] = traffic.run(ph, seconds)
        state["stop"] = True

    th = threading.Thread(target=drive, daemon=True)
    t0 = time.monotonic()
    prev: tuple[float, Any] | None = None
    k = 0
    th.start()
    while not state["stop"]:
        ph = state["phase"]
        tick: dict[str, Any] = {"t": round(time.monotonic() - t0, 4), "phase": ph}
        u = ans(nv.nvmlDeviceGetUtilizationRates, h)
        tick["util"] = u if isinstance(u, str) else [u.gpu, u.memory]
        m = ans(nv.nvmlDeviceGetMemoryInfo, h)
        tick["mem"] = m if isinstance(m, str) else [m.total, m.free, m.used]
        tick["power_mw"] = ans(nv.nvmlDeviceGetPowerUsage, h)
        tick["link"] = [ans(nv.nvmlDeviceGetCurrPcieLinkGeneration, h), ans(nv.nvmlDeviceGetCurrPcieLinkWidth, h)]
        w0 = time.perf_counter()
        tick["pcie_kBps"] = [
            ans(nv.nvmlDeviceGetPcieThroughput, h, nv.NVML_PCIE_UTIL_TX_BYTES),
            ans(nv.nvmlDeviceGetPcieThroughput, h, nv.NVML_PCIE_UTIL_RX_BYTES),
        ]
        tick["pcie_call_s"] = round(time.perf_counter() - w0, 4)
        # A short window first (the quirk), then the long one ending at the same snapshot.
        a, b = bufs[k % 2], bufs[2 + k % 2]
        w = SHORT_WINDOWS_S[k % len(SHORT_WINDOWS_S)]
        nv.nvmlGpmSampleGet(h, a)
        ta = time.monotonic()
        time.sleep(w)
        nv.nvmlGpmSampleGet(h, b)
        tb = time.monotonic()
        short.append({"t": round(tb - t0, 4), "phase": ph, "window_s": round(tb - ta, 4), "metrics": gpm_metrics(a, b)})
        if prev is not None:
            tick["gpm"] = {"window_s": round(tb - prev[0], 4), "metrics": gpm_metrics(prev[1], b)}
        prev = (tb, b)
        ticks.append(tick)
        k += 1
    th.join()
    # Per-call cost, idle GPU.
    s1, s2 = bufs[0], bufs[1]
    nv.nvmlGpmSampleGet(h, s1)
    time.sleep(0.15)
    nv.nvmlGpmSampleGet(h, s2)
    req = nv.c_nvmlGpmMetricsGet_t()
    req.version, req.numMetrics, req.sample1, req.sample2 = nv.NVML_GPM_METRICS_GET_VERSION, 6, s1, s2
    for i, name in enumerate(GPM_METRICS[:6]):
        req.metrics[i].metricId = getattr(nv, name)
    cost = {
        "nvmlDeviceGetUtilizationRates": timing(lambda: nv.nvmlDeviceGetUtilizationRates(h), 300),
        "nvmlDeviceGetMemoryInfo": timing(lambda: nv.nvmlDeviceGetMemoryInfo(h), 300),
        "nvmlDeviceGetPowerUsage": timing(lambda: nv.nvmlDeviceGetPowerUsage(h), 300),
        "nvmlDeviceGetCurrPcieLinkGeneration": timing(lambda: nv.nvmlDeviceGetCurrPcieLinkGeneration(h), 300),
        "nvmlDeviceGetCurrPcieLinkWidth": timing(lambda: nv.nvmlDeviceGetCurrPcieLinkWidth(h), 300),
        "nvmlGpmSampleGet": timing(lambda: nv.nvmlGpmSampleGet(h, s2), 300),
        "nvmlGpmMetricsGet(6)": timing(lambda: nv.nvmlGpmMetricsGet(req), 300),
        "nvmlDeviceGetComputeRunningProcesses": timing(lambda: nv.nvmlDeviceGetComputeRunningProcesses(h), 100),
        "nvmlDeviceGetPcieThroughput": timing(
            lambda: nv.nvmlDeviceGetPcieThroughput(h, nv.NVML_PCIE_UTIL_TX_BYTES), 10
        ),
    }
    # Do two PcieThroughput calls on one device overlap, or does NVML serialise them?
    pair: list[float] = []
    for _ in range(5):
        t1 = threading.Thread(target=nv.nvmlDeviceGetPcieThroughput, args=(h, nv.NVML_PCIE_UTIL_TX_BYTES))
        t2 = threading.Thread(target=nv.nvmlDeviceGetPcieThroughput, args=(h, nv.NVML_PCIE_UTIL_RX_BYTES))
        w0 = time.perf_counter()
        t1.start()
        t2.start()
        t1.join()
        t2.join()
        pair.append(time.perf_counter() - w0)
    cost["pcie_tx_rx_two_threads_wall_ms"] = {"wall_ms": sorted(pair)[2] * 1e3, "n": 5}
    for b in bufs:
        nv.nvmlGpmSampleFree(b)
    doc = {
        "meta": {
            "what": "raw NVML/GPM answers captured by tests/fakenvml/capture.py; errors as 'ret N' (nvmlReturn)",
            "created": datetime.now(timezone.utc).isoformat(),
            "host": socket.gethostname(),
            "driver": txt(nv.nvmlSystemGetDriverVersion()),
            "nvml_version": txt(nv.nvmlSystemGetNVMLVersion()),
            "nvidia_ml_py": getattr(nv, "__version__", None) or _dist_version(),
            "seconds_per_phase": seconds,
            "units": "util %, mem bytes, power mW, pcie_kBps KB/s, GPM *_PER_SEC MiB/s, GPM *_UTIL %",
        },
        "static": static,
        "ticks": ticks,
        "gpm_short": short,
        "cost": cost,
        "truth": truth,
    }
    nv.nvmlShutdown()
    Path(out).write_text(json.dumps(doc, indent=None, separators=(",", ":")))
    print(f"captured {len(ticks)} ticks, {len(short)} short GPM windows -> {out}")


def _dist_version() -> str | None:
    try:
        from importlib.metadata import version

        return version("nvidia-ml-py")
    except Exception:
        return None


if __name__ == "__main__":
    main(sys.argv[1], float(sys.argv[2]) if len(sys.argv) > 2 else 3.0)
