"""A sustained bf16 matmul load on one GPU, recorded by the real `pcie-tui record --headless`, with its truth.

Run on a GPU machine (scripts/device_heat.sh): idle ``--idle`` s, then ``--load`` s of back-to-back 8192^3
bf16 matmuls (long enough for the power cap or heat to act; no device setting is changed), then idle again,
while ``pcie-tui record`` writes OUT/<name>.jsonl.gz at 10 Hz. Beside it:

* ``<name>.truth.json``: the load's own throughput, timed with CUDA syncs every ~0.5 s (TFLOP/s per
  interval, unix times), the NVML per-call costs of the heat and link-health reads (so the collector's
  rate can be judged), the GPU, driver and power limit;
* ``<name>-heat.json``: the raw NVML answers at ~10 Hz over the whole run in NVML's own units (the stand-in
  NVML's heat capture, tests/fakenvml ``load_heat``): temperature, SM/memory clocks, clock-event reasons,
  power, enforced limit, fan (an error as "ret N") and the PCIe replay counter.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any


def _ret(nv: Any, fn: Any, *args: Any) -> Any:
    try:
        return fn(*args)
    except nv.NVMLError as e:
        return f"ret {e.value}"


def heat_tick(nv: Any, h: Any, t0: float) -> dict[str, Any]:
    return {
        "t": round(time.time() - t0, 4),
        "temp_C": _ret(nv, nv.nvmlDeviceGetTemperature, h, nv.NVML_TEMPERATURE_GPU),
        "sm_MHz": _ret(nv, nv.nvmlDeviceGetClockInfo, h, nv.NVML_CLOCK_SM),
        "mem_MHz": _ret(nv, nv.nvmlDeviceGetClockInfo, h, nv.NVML_CLOCK_MEM),
        "reasons": _ret(nv, nv.nvmlDeviceGetCurrentClocksEventReasons, h),
        "power_mw": _ret(nv, nv.nvmlDeviceGetPowerUsage, h),
        "limit_mw": _ret(nv, nv.nvmlDeviceGetEnforcedPowerLimit, h),
        "fan_pct": _ret(nv, nv.nvmlDeviceGetFanSpeed, h),
        "replays": _ret(nv, nv.nvmlDeviceGetPcieReplayCounter, h),
        "util": _ret(nv, lambda x: [(u := nv.nvmlDeviceGetUtilizationRates(x)).gpu, u.memory], h),
    }


def call_costs(nv: Any, h: Any, n: int = 300) -> dict[str, dict[str, float]]:
    """Microseconds per call (CPU and wall), each call alone, n times."""
    calls = {
        "nvmlDeviceGetTemperature": lambda: nv.nvmlDeviceGetTemperature(h, nv.NVML_TEMPERATURE_GPU),
        "nvmlDeviceGetClockInfo(SM)": lambda: nv.nvmlDeviceGetClockInfo(h, nv.NVML_CLOCK_SM),
        "nvmlDeviceGetClockInfo(MEM)": lambda: nv.nvmlDeviceGetClockInfo(h, nv.NVML_CLOCK_MEM),
        "nvmlDeviceGetCurrentClocksEventReasons": lambda: nv.nvmlDeviceGetCurrentClocksEventReasons(h),
        "nvmlDeviceGetEnforcedPowerLimit": lambda: nv.nvmlDeviceGetEnforcedPowerLimit(h),
        "nvmlDeviceGetFanSpeed": lambda: nv.nvmlDeviceGetFanSpeed(h),
        "nvmlDeviceGetPcieReplayCounter": lambda: nv.nvmlDeviceGetPcieReplayCounter(h),
        "nvmlDeviceGetPowerUsage": lambda: nv.nvmlDeviceGetPowerUsage(h),
    }
    out = {}
    for name, fn in calls.items():
        c0, w0 = time.process_time(), time.perf_counter()
        ok = 0
        for _ in range(n):
            try:
                fn()
                ok += 1
            except nv.NVMLError:
                pass
        out[name] = {
            "cpu_us": (time.process_time() - c0) / n * 1e6,
            "wall_us": (time.perf_counter() - w0) / n * 1e6,
            "answered": ok / n,
        }
    return out


def sample_heat(nv: Any, h: Any, t0: float, stop: threading.Event, out: list[dict[str, Any]]) -> None:
    while not stop.is_set():
        out.append(heat_tick(nv, h, t0))
        stop.wait(0.1)


def matmul_load(seconds: float) -> list[list[float]]:
    """Back-to-back bf16 8192^3 matmuls; [unix time at the end of an interval, TFLOP/s over it], ~0.5 s each."""
    import torch

    n = 8192
    a = torch.randn(n, n, device="cuda", dtype=torch.bfloat16)
    b = torch.randn(n, n, device="cuda", dtype=torch.bfloat16)
    flop = 2 * n**3
    out: list[list[float]] = []
    end = time.time() + seconds
    torch.cuda.synchronize()
    while time.time() < end:
        t0 = time.perf_counter()
        k = 0
        while time.perf_counter() - t0 < 0.5:
            for _ in range(20):
                a @ b
            torch.cuda.synchronize()
            k += 20
        dt = time.perf_counter() - t0
        out.append([time.time(), k * flop / dt / 1e12])
    return out


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    ap.add_argument("--name", default="h100-heat")
    ap.add_argument("--idle", type=float, default=5.0)
    ap.add_argument("--load", type=float, default=230.0)
    args = ap.parse_args()
    out = Path(args.out)
    import pynvml as nv

    nv.nvmlInit()
    h = nv.nvmlDeviceGetHandleByIndex(0)
    costs = call_costs(nv, h)
    total = 2 * args.idle + args.load
    rec_path = out / f"{args.name}.jsonl.gz"
    rec = subprocess.Popen(
        [sys.executable, "-m", "pcie_tui", "record", "--headless", "--no-engine", "--interval", "0.1",
         "--duration", f"{total:g}", "--out", str(rec_path)],
        stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    t0 = time.time()
    stop, heat = threading.Event(), []
    th = threading.Thread(target=sample_heat, args=(nv, h, t0, stop, heat), daemon=True)
    th.start()
    time.sleep(args.idle)
    load_start = time.time()
    tflops = matmul_load(args.load)
    load_end = time.time()
    _, err = rec.communicate(timeout=total + 60)
    stop.set()
    th.join()
    static = {
        "sm_max_MHz": _ret(nv, nv.nvmlDeviceGetMaxClockInfo, h, nv.NVML_CLOCK_SM),
        "mem_max_MHz": _ret(nv, nv.nvmlDeviceGetMaxClockInfo, h, nv.NVML_CLOCK_MEM),
    }
    meta = {
        "what": "raw NVML answers at ~10 Hz during scripts/heat_session.py (NVML units; errors as 'ret N')",
        "gpu": nv.nvmlDeviceGetName(h),
        "driver": nv.nvmlSystemGetDriverVersion(),
        "created": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(t0)),
        "t0_unix": t0,
        "load": f"bf16 8192^3 matmuls back to back from +{load_start - t0:.1f} s to +{load_end - t0:.1f} s",
    }
    (out / f"{args.name}-heat.json").write_text(json.dumps({"meta": meta, "static": static, "ticks": heat}))
    truth = {
        "session": args.name,
        "what": "sustained bf16 matmul load; throughput timed with CUDA syncs every ~0.5 s",
        "gpu": meta["gpu"],
        "driver": meta["driver"],
        "load_start": load_start,
        "load_end": load_end,
        "tflops": tflops,
        "nvml_call_cost": costs,
        "record_rc": rec.returncode,
        "record_stderr": err[-2000:],
    }
    (out / f"{args.name}.truth.json").write_text(json.dumps(truth, indent=1))
    nv.nvmlShutdown()
    print(json.dumps({k: v for k, v in truth.items() if k != "tflops"}, indent=1))
    print("heat ticks", len(heat), "tflops intervals", len(tflops))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
