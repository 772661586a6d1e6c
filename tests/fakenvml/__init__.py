"""A stand-in pynvml that replays NVML/GPM answers captured on the project's real H200.

Nothing here is invented: every number a function returns comes from a capture
file, in NVML's own units (utilisation %, bytes, mW, PCIe KB/s, GPM MiB/s and %).
Two sources:

* ``tests/fixtures/h200-nvml-capture.json``: written by ``capture.py`` on the H200
  (raw answers every ~95 ms through 7 labelled traffic phases, 543 GPM answers over
  20-130 ms windows, per-call costs, ground truth of each phase timed with CUDA syncs).
* ``tests/fixtures/h200-nvml-probe-2026-12-02.json``: the first probe, copied from
  ``../shared/data/`` (``from_probe``).

Real quirks modelled:

* GPM answers are picked by window length: the H200 answered NaN DRAM_BW_UTIL
  (and 0 for every rate) in 80 % of 20 ms windows, 56 % at 50 ms, 5 % at 100 ms,
  never at >= 120 ms, and the replay keeps those odds (``Capture.gpm_at``).
* NUMA, NVLink state/speed answer NotSupported, as captured (single GPU in a VM).
* ``nvmlDeviceGetPcieThroughput`` answers in KB/s and blocks for ``block_s``
  (20.6 ms measured) per call. Calls overlap, as on the H200 (TX and RX from two
  threads: 21.1 ms together); ``max_inflight`` records how many did.

Time: replies follow the capture's timeline on ``clock`` (injectable so tests
step it), looping at the end. Extra GPUs (``n_gpus`` > 1) are replicas of the
captured one with their own bus id, UUID suffix and an optional phase offset.
Constants, structs and error classes are the real pynvml's.
"""

from __future__ import annotations

import ctypes
import math
import threading
import time
from collections import Counter
from collections.abc import Callable
from typing import Any

import pynvml as _real

from .data import (
    CAPTURE,
    PROBE,
    Capture,
    HeatCapture,
    ManualClock,
    _raise_if_err,
    from_probe,
    load_capture,
    load_heat,
    probe_path,
)

__all__ = [
    "CAPTURE",
    "PROBE",
    "Capture",
    "FakeNvml",
    "HeatCapture",
    "ManualClock",
    "from_probe",
    "load_capture",
    "load_heat",
    "probe_path",
]


class _Handle:
    __slots__ = ("index",)

    def __init__(self, index: int) -> None:
        self.index = index

    def __repr__(self) -> str:
        return f"<fake nvmlDevice {self.index}>"


class FakeNvml:
    """The stand-in module. Pass an instance wherever pynvml is expected."""

    def __init__(
        self,
        capture: Capture | None = None,
        n_gpus: int = 1,
        *,
        clock: Callable[[], float] = time.monotonic,
        block_s: float = 0.020,
        offsets_s: list[float] | None = None,
        init_error: int | None = None,
        gpm_supported: bool | None = None,
        heat: HeatCapture | None = None,
        replay_fault: tuple[float, float] | None = None,
    ) -> None:
        self.capture = capture or load_capture()
        self.n_gpus = n_gpus
        self.clock = clock
        self.t0 = clock()
        self.block_s = block_s
        self.offsets_s = offsets_s or [0.0] * n_gpus
        self.init_error = init_error
        self.gpm_override = gpm_supported
        self.inits = 0
        self.calls: Counter[str] = Counter()
        self.inflight = 0
        self.max_inflight = 0
        self._lock = threading.Lock()
        self._bufs: dict[int, Any] = {}
        self._stamps: dict[int, tuple[int, float]] = {}
        self.windows: list[float] = []  # every GPM window asked for, seconds
        self.void_answers = 0  # GPM answers replayed with NaN DRAM_BW_UTIL
        # Heat and clocks: a capture from a real GPU under sustained load (none: those calls answer
        # NotSupported, as for a capture that did not read them); its power and, where it has them, its
        # utilisation replace the main capture's, so the load and its heat come from one GPU. ``replay_fault`` = (from s, replays per s):
        # fault injection, a link that starts replaying packets (the count is chosen, not captured).
        self.heat = heat
        self.replay_fault = replay_fault

    def __getattr__(self, name: str) -> Any:
        # Constants, structs, error classes: the real module's. NVML functions the
        # capture does not cover do not exist here (AttributeError), like an old pynvml.
        if name.startswith("nvml") and callable(getattr(_real, name, None)):
            raise AttributeError(f"fake NVML does not model {name}")
        return getattr(_real, name)

    # ---- plumbing --------------------------------------------------------

    def _enter(self, name: str, h: Any = None) -> _Handle | None:
        self.calls[name] += 1
        if self.inits <= 0:
            raise _real.NVMLError(_real.NVML_ERROR_UNINITIALIZED)
        if h is not None and not (isinstance(h, _Handle) and 0 <= h.index < self.n_gpus):
            raise _real.NVMLError(_real.NVML_ERROR_INVALID_ARGUMENT)
        return h

    def now(self, index: int = 0) -> float:
        """Replay time of GPU ``index`` (seconds into the capture timeline)."""
        return self.clock() - self.t0 + self.offsets_s[index]

    def _tick(self, h: _Handle) -> dict[str, Any]:
        return self.capture.tick_at(self.now(h.index))

    @property
    def static(self) -> dict[str, Any]:
        return self.capture.static

    # ---- init ------------------------------------------------------------

    def nvmlInit(self) -> None:
        self.calls["nvmlInit"] += 1
        if self.init_error is not None:
            raise _real.NVMLError(self.init_error)
        self.inits += 1

    def nvmlShutdown(self) -> None:
        self._enter("nvmlShutdown")
        self.inits -= 1

    def nvmlDeviceGetCount(self) -> int:
        self._enter("nvmlDeviceGetCount")
        return self.n_gpus

    def nvmlDeviceGetHandleByIndex(self, index: int) -> _Handle:
        self._enter("nvmlDeviceGetHandleByIndex")
        if not 0 <= index < self.n_gpus:
            raise _real.NVMLError(_real.NVML_ERROR_INVALID_ARGUMENT)
        return _Handle(index)

    # ---- static ----------------------------------------------------------

    def nvmlSystemGetDriverVersion(self) -> str:
        self._enter("nvmlSystemGetDriverVersion")
        if "driver" not in self.capture.meta:  # the first probe did not record it
            raise _real.NVMLError(_real.NVML_ERROR_NOT_SUPPORTED)
        return str(self.capture.meta["driver"])

    def nvmlDeviceGetName(self, h: _Handle) -> str:
        self._enter("nvmlDeviceGetName", h)
        return str(self.static["name"])

    def nvmlDeviceGetUUID(self, h: _Handle) -> str:
        self._enter("nvmlDeviceGetUUID", h)
        uuid = str(self.static["uuid"])
        return uuid if h.index == 0 else f"{uuid[:-2]}{h.index:02x}"

    def nvmlDeviceGetPciInfo(self, h: _Handle) -> Any:
        self._enter("nvmlDeviceGetPciInfo", h)
        bus = str(self.static["pci_bus_id"])
        if h.index:
            dom, b, devfn = bus.split(":")
            dev = int(devfn.split(".")[0], 16) + h.index
            bus = f"{dom}:{b}:{dev:02X}.0"
        info = _real.nvmlPciInfo_t()
        info.busId = bus.encode()
        return info

    def _static(self, name: str, h: _Handle, key: str) -> Any:
        self._enter(name, h)
        return _raise_if_err(self.static[key])

    def nvmlDeviceGetMaxPcieLinkGeneration(self, h: _Handle) -> int:
        return int(self._static("nvmlDeviceGetMaxPcieLinkGeneration", h, "max_gen"))

    def nvmlDeviceGetMaxPcieLinkWidth(self, h: _Handle) -> int:
        return int(self._static("nvmlDeviceGetMaxPcieLinkWidth", h, "max_width"))

    def nvmlDeviceGetGpuMaxPcieLinkGeneration(self, h: _Handle) -> int:
        return int(self._static("nvmlDeviceGetGpuMaxPcieLinkGeneration", h, "gpu_max_gen"))

    def nvmlDeviceGetNumaNodeId(self, h: _Handle) -> int:
        return int(
            self._static("nvmlDeviceGetNumaNodeId", h, "numa_node")
            if "numa_node" in self.static
            else _raise_if_err("ret 3")
        )

    def nvmlDeviceGetNvLinkState(self, h: _Handle, link: int) -> int:
        self._enter("nvmlDeviceGetNvLinkState", h)
        states = self.static["nvlink_state"]
        return int(_raise_if_err(states[min(link, len(states) - 1)]))

    def nvmlDeviceGetFieldValues(self, h: _Handle, field_ids: list[Any]) -> Any:
        self._enter("nvmlDeviceGetFieldValues", h)
        arr = (_real.c_nvmlFieldValue_t * len(field_ids))()
        for i, fid in enumerate(field_ids):
            arr[i].fieldId = fid
            v = (
                self.static.get("nvlink_speed_field")
                if fid
                in (
                    _real.NVML_FI_DEV_NVLINK_SPEED_MBPS_COMMON,
                    _real.NVML_FI_DEV_NVLINK_GET_SPEED,
                )
                else "ret 3"
            )
            if isinstance(v, str):
                arr[i].nvmlReturn = int(v[4:])
            else:
                arr[i].nvmlReturn = _real.NVML_SUCCESS
                arr[i].valueType = _real.NVML_VALUE_TYPE_UNSIGNED_INT
                arr[i].value.uiVal = int(v)
        return arr

    def _procs(self, name: str, h: _Handle, key: str) -> list[Any]:
        self._enter(name, h)
        got = _raise_if_err(self.static.get(key, []))
        return [_real.nvmlFriendlyObject({"pid": p[0], "usedGpuMemory": p[1]}) for p in got]

    def nvmlDeviceGetComputeRunningProcesses(self, h: _Handle) -> list[Any]:
        return self._procs("nvmlDeviceGetComputeRunningProcesses", h, "procs_compute")

    def nvmlDeviceGetGraphicsRunningProcesses(self, h: _Handle) -> list[Any]:
        return self._procs("nvmlDeviceGetGraphicsRunningProcesses", h, "procs_graphics")

    # ---- per tick --------------------------------------------------------

    def nvmlDeviceGetCurrPcieLinkGeneration(self, h: _Handle) -> int:
        self._enter("nvmlDeviceGetCurrPcieLinkGeneration", h)
        return int(_raise_if_err(self._tick(h).get("link", [self.static["curr_gen"]])[0]))

    def nvmlDeviceGetCurrPcieLinkWidth(self, h: _Handle) -> int:
        self._enter("nvmlDeviceGetCurrPcieLinkWidth", h)
        return int(_raise_if_err(self._tick(h).get("link", [0, self.static["curr_width"]])[1]))

    def nvmlDeviceGetUtilizationRates(self, h: _Handle) -> Any:
        self._enter("nvmlDeviceGetUtilizationRates", h)
        heat = self.heat.tick_at(self.now(h.index)) if self.heat is not None else {}
        u = _raise_if_err(heat["util"] if "util" in heat else self._tick(h)["util"])
        return _real.c_nvmlUtilization_t(gpu=u[0], memory=u[1])

    def nvmlDeviceGetMemoryInfo(self, h: _Handle, version: Any = None) -> Any:
        self._enter("nvmlDeviceGetMemoryInfo", h)
        m = _raise_if_err(self._tick(h).get("mem", self.static["mem"]))
        return _real.c_nvmlMemory_t(total=m[0], free=m[1], used=m[2])

    def nvmlDeviceGetPowerUsage(self, h: _Handle) -> int:
        self._enter("nvmlDeviceGetPowerUsage", h)
        if self.heat is not None:  # power against its limit: both from the heat capture
            return int(_raise_if_err(self.heat.tick_at(self.now(h.index))["power_mw"]))
        return int(_raise_if_err(self._tick(h)["power_mw"]))

    def nvmlDeviceGetPcieThroughput(self, h: _Handle, counter: int) -> int:
        """KB/s over a 20 ms window; blocks for that window like the real call."""
        self._enter("nvmlDeviceGetPcieThroughput", h)
        with self._lock:
            self.inflight += 1
            self.max_inflight = max(self.max_inflight, self.inflight)
        try:
            time.sleep(self.block_s)
            v = self._tick(h)["pcie_kBps"][0 if counter == _real.NVML_PCIE_UTIL_TX_BYTES else 1]
            return int(_raise_if_err(v))
        finally:
            with self._lock:
                self.inflight -= 1

    # ---- heat, clocks, link health ----------------------------------------

    def _heat(self, name: str, h: _Handle, key: str) -> Any:
        self._enter(name, h)
        if self.heat is None:
            raise _real.NVMLError(_real.NVML_ERROR_NOT_SUPPORTED)
        return _raise_if_err(self.heat.tick_at(self.now(h.index)).get(key, "ret 3"))

    def nvmlDeviceGetTemperature(self, h: _Handle, sensor: int) -> int:
        return int(self._heat("nvmlDeviceGetTemperature", h, "temp_C"))

    def nvmlDeviceGetClockInfo(self, h: _Handle, clock: int) -> int:
        return int(self._heat("nvmlDeviceGetClockInfo", h, "sm_MHz" if clock == _real.NVML_CLOCK_SM else "mem_MHz"))

    def nvmlDeviceGetMaxClockInfo(self, h: _Handle, clock: int) -> int:
        self._enter("nvmlDeviceGetMaxClockInfo", h)
        if self.heat is None:
            raise _real.NVMLError(_real.NVML_ERROR_NOT_SUPPORTED)
        key = "sm_max_MHz" if clock == _real.NVML_CLOCK_SM else "mem_max_MHz"
        return int(_raise_if_err(self.heat.static.get(key, "ret 3")))

    def nvmlDeviceGetCurrentClocksEventReasons(self, h: _Handle) -> int:
        return int(self._heat("nvmlDeviceGetCurrentClocksEventReasons", h, "reasons"))

    def nvmlDeviceGetEnforcedPowerLimit(self, h: _Handle) -> int:
        return int(self._heat("nvmlDeviceGetEnforcedPowerLimit", h, "limit_mw"))

    def nvmlDeviceGetFanSpeed(self, h: _Handle) -> int:
        return int(self._heat("nvmlDeviceGetFanSpeed", h, "fan_pct"))

    def nvmlDeviceGetPcieReplayCounter(self, h: _Handle) -> int:
        if self.heat is None and self.replay_fault is not None:  # the injected count alone
            self._enter("nvmlDeviceGetPcieReplayCounter", h)
            v = 0
        else:
            v = int(self._heat("nvmlDeviceGetPcieReplayCounter", h, "replays"))
        if self.replay_fault is not None:
            start, per_s = self.replay_fault
            v += int(max(0.0, self.now(h.index) - start) * per_s)
        return v

    # ---- GPM -------------------------------------------------------------

    def nvmlGpmQueryDeviceSupport(self, h: _Handle) -> Any:
        self._enter("nvmlGpmQueryDeviceSupport", h)
        sup = self.static["gpm_supported"] if self.gpm_override is None else int(self.gpm_override)
        return _real.c_nvmlGpmSupport_t(version=_real.NVML_GPM_SUPPORT_VERSION, isSupportedDevice=sup)

    def nvmlGpmSampleAlloc(self) -> Any:
        self._enter("nvmlGpmSampleAlloc")
        raw = ctypes.create_string_buffer(8)
        ptr = ctypes.cast(raw, _real.c_nvmlGpmSample_t)
        self._bufs[ctypes.addressof(raw)] = raw
        return ptr

    def _addr(self, sample: Any) -> int:
        addr = ctypes.cast(sample, ctypes.c_void_p).value
        if addr is None or addr not in self._bufs:
            raise _real.NVMLError(_real.NVML_ERROR_INVALID_ARGUMENT)
        return addr

    def nvmlGpmSampleFree(self, sample: Any) -> None:
        self._enter("nvmlGpmSampleFree")
        addr = self._addr(sample)
        del self._bufs[addr]
        self._stamps.pop(addr, None)

    def nvmlGpmSampleGet(self, h: _Handle, sample: Any) -> Any:
        self._enter("nvmlGpmSampleGet", h)
        self._stamps[self._addr(sample)] = (h.index, self.now(h.index))
        return sample

    def nvmlGpmMetricsGet(self, req: Any) -> Any:
        self._enter("nvmlGpmMetricsGet")
        if req.version != _real.NVML_GPM_METRICS_GET_VERSION:
            raise _real.NVMLError(_real.NVML_ERROR_ARGUMENT_VERSION_MISMATCH)
        a, b = self._stamps.get(self._addr(req.sample1)), self._stamps.get(self._addr(req.sample2))
        if a is None or b is None or a[0] != b[0] or b[1] <= a[1]:
            raise _real.NVMLError(_real.NVML_ERROR_INVALID_ARGUMENT)
        window = b[1] - a[1]
        self.windows.append(window)
        answers = self.capture.gpm_at(b[1], window)
        dram = (answers or {}).get("NVML_GPM_METRIC_DRAM_BW_UTIL")
        if isinstance(dram, float) and not math.isfinite(dram):
            self.void_answers += 1
        names = _metric_names()
        for i in range(req.numMetrics):
            m = req.metrics[i]
            v = (answers or {}).get(names.get(m.metricId, ""), "ret 3")
            if isinstance(v, str):
                m.nvmlReturn, m.value = int(v[4:]), 0.0
            else:
                m.nvmlReturn, m.value = _real.NVML_SUCCESS, float(v)
        return req


_NAMES: dict[int, str] = {}


def _metric_names() -> dict[int, str]:
    if not _NAMES:
        for k in dir(_real):
            if k.startswith("NVML_GPM_METRIC_") and k != "NVML_GPM_METRIC_MAX":
                _NAMES.setdefault(int(getattr(_real, k)), k)
    return _NAMES
