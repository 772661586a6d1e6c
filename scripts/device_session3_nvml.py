"""Raw NVML capture at 10 Hz around a sustained GPU load (run ON the GPU machine; issue 25's heat and
throttling facts). Writes JSON lines: a header (GPU, driver, power limits, temperature thresholds, max
clocks, link), then one sample a tick (temperature, SM/memory clocks, clock-event reasons, power, enforced
limit, fan, PCIe replay counter, link gen/width, PCIe TX/RX, utilisation, the phase), then a footer with the
load's achieved rate. The load is a separate process (python3 with torch): a bf16 8192^3 matmul loop.

usage: python3 scripts/device_session3_nvml.py --out FILE.jsonl [--idle-before 5] [--load 170] [--idle-after 15]
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time

import pynvml as N

LOAD = r"""
import sys, time, torch
secs = float(sys.argv[1]); n = 8192
a = torch.randn(n, n, device="cuda", dtype=torch.bfloat16); b = torch.randn(n, n, device="cuda", dtype=torch.bfloat16)
for _ in range(3): c = a @ b
torch.cuda.synchronize(); t0 = time.time(); it = 0
while time.time() - t0 < secs:
    for _ in range(50): c = a @ b
    torch.cuda.synchronize(); it += 50
dt = time.time() - t0
print(f"LOAD {it} matmuls in {dt:.1f} s: {2 * n**3 * it / dt / 1e12:.0f} TFLOP/s", flush=True)
"""


def _try(fn, *a):  # noqa: ANN001, ANN202 - any NVML getter
    try:
        v = fn(*a)
        return v.decode() if isinstance(v, bytes) else v
    except N.NVMLError as e:
        return {"error": str(e)}


def header(h) -> dict:  # noqa: ANN001
    thr = {}
    for name in dir(N):
        if name.startswith("NVML_TEMPERATURE_THRESHOLD_") and name != "NVML_TEMPERATURE_THRESHOLD_COUNT":
            thr[name.removeprefix("NVML_TEMPERATURE_THRESHOLD_").lower()] = _try(
                N.nvmlDeviceGetTemperatureThreshold, h, getattr(N, name)
            )
    reasons = {n: getattr(N, n) for n in dir(N) if n.startswith(("nvmlClocksEventReason", "nvmlClocksThrottleReason"))
               and isinstance(getattr(N, n), int)}  # fmt: skip
    clk = {"sm": N.NVML_CLOCK_SM, "mem": N.NVML_CLOCK_MEM, "graphics": N.NVML_CLOCK_GRAPHICS}
    return {
        "kind": "header", "t": time.time(), "name": _try(N.nvmlDeviceGetName, h),
        "driver": _try(N.nvmlSystemGetDriverVersion), "nvml": _try(N.nvmlSystemGetNVMLVersion),
        "cuda_driver": _try(N.nvmlSystemGetCudaDriverVersion), "uuid": _try(N.nvmlDeviceGetUUID, h),
        "power_limit_mw": _try(N.nvmlDeviceGetPowerManagementLimit, h),
        "power_default_limit_mw": _try(N.nvmlDeviceGetPowerManagementDefaultLimit, h),
        "power_constraints_mw": _try(N.nvmlDeviceGetPowerManagementLimitConstraints, h),
        "enforced_power_limit_mw": _try(N.nvmlDeviceGetEnforcedPowerLimit, h),
        "temperature_thresholds_c": thr,
        "max_clocks_mhz": {k: _try(N.nvmlDeviceGetMaxClockInfo, h, v) for k, v in clk.items()},
        "app_clocks_mhz": {k: _try(N.nvmlDeviceGetApplicationsClock, h, v) for k, v in clk.items()},
        "pcie_max": {"gen": _try(N.nvmlDeviceGetMaxPcieLinkGeneration, h),
                     "width": _try(N.nvmlDeviceGetMaxPcieLinkWidth, h)},  # fmt: skip
        "persistence": _try(N.nvmlDeviceGetPersistenceMode, h), "fan_count": _try(N.nvmlDeviceGetNumFans, h),
        "clock_event_reason_bits": reasons,
    }  # fmt: skip


def sample(h, phase: str) -> dict:  # noqa: ANN001
    reasons = getattr(N, "nvmlDeviceGetCurrentClocksEventReasons", None) or N.nvmlDeviceGetCurrentClocksThrottleReasons
    util = _try(N.nvmlDeviceGetUtilizationRates, h)
    return {
        "t": time.time(), "phase": phase,
        "temp_c": _try(N.nvmlDeviceGetTemperature, h, N.NVML_TEMPERATURE_GPU),
        "sm_mhz": _try(N.nvmlDeviceGetClockInfo, h, N.NVML_CLOCK_SM),
        "mem_mhz": _try(N.nvmlDeviceGetClockInfo, h, N.NVML_CLOCK_MEM),
        "reasons": _try(reasons, h), "power_mw": _try(N.nvmlDeviceGetPowerUsage, h),
        "enforced_limit_mw": _try(N.nvmlDeviceGetEnforcedPowerLimit, h), "fan_pct": _try(N.nvmlDeviceGetFanSpeed, h),
        "replay": _try(N.nvmlDeviceGetPcieReplayCounter, h),
        "gen": _try(N.nvmlDeviceGetCurrPcieLinkGeneration, h), "width": _try(N.nvmlDeviceGetCurrPcieLinkWidth, h),
        "tx_kbs": _try(N.nvmlDeviceGetPcieThroughput, h, N.NVML_PCIE_UTIL_TX_BYTES),
        "rx_kbs": _try(N.nvmlDeviceGetPcieThroughput, h, N.NVML_PCIE_UTIL_RX_BYTES),
        "util_gpu": util.gpu if hasattr(util, "gpu") else util, "util_mem": util.memory if hasattr(util, "memory") else None,
    }  # fmt: skip


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    ap.add_argument("--idle-before", type=float, default=5.0)
    ap.add_argument("--load", type=float, default=170.0)
    ap.add_argument("--idle-after", type=float, default=15.0)
    ap.add_argument("--interval", type=float, default=0.1)
    args = ap.parse_args()
    N.nvmlInit()
    h = N.nvmlDeviceGetHandleByIndex(0)
    t0 = time.time()
    load = None
    with open(args.out, "w") as f:
        f.write(json.dumps(header(h)) + "\n")
        total = args.idle_before + args.load + args.idle_after
        n = 0
        while (el := time.time() - t0) < total + 60:
            if load is None and el >= args.idle_before:
                load = subprocess.Popen([sys.executable, "-c", LOAD, str(args.load)], stdout=subprocess.PIPE, text=True)
            busy = load is not None and load.poll() is None
            if load is not None and not busy and el >= total:
                break
            f.write(json.dumps(sample(h, "load" if busy else "idle")) + "\n")
            n += 1
            time.sleep(max(0.0, t0 + n * args.interval - time.time()))
        out = load.communicate()[0] if load is not None else ""
        f.write(json.dumps({"kind": "footer", "t": time.time(), "samples": n, "load_stdout": out.strip(),
                            "load_rc": load.returncode if load else None}) + "\n")  # fmt: skip
    print(f"nvml: {n} samples; {out.strip()}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
