"""A stand-in pynvml that replays NVML/GPM answers captured on the project's real H200.

Nothing here is invented: every number a function returns comes from a capture
file, in NVML's own units (utilisation %, bytes, mW, PCIe KB/s, GPM MiB/s and %).
Two sources:

* ``tests/fixtures/h200-nvml-capture.json``: written by ``capture.py`` on the H200
  (raw answers per ~150 ms tick, GPM over >= 100 ms windows and over 20-80 ms
  windows, per-call costs, ground truth of each traffic phase).
* ``../shared/data/h200-nvml-probe-2026-12-02.json``: the first probe (``from_probe``).

Real quirks modelled:

* GPM answers are picked by window length: the H200 answered NaN DRAM_BW_UTIL
  (and 0 for every rate) in 80 % of 20 ms windows, 56 % at 50 ms, 5 % at 100 ms,
  never at >= 120 ms, and the replay keeps those odds (``Capture.gpm_at``).
* NUMA, NVLink state/speed answer NotSupported, as captured (single GPU in a VM).
* ``nvmlDeviceGetPcieThroughput`` answers in KB/s and blocks for ``block_s``
  (20 ms measured) per call; ``max_inflight`` records how many overlapped.

Time: replies follow the capture's timeline on ``clock`` (injectable so tests
step it), looping at the end. Extra GPUs (``n_gpus`` > 1) are replicas of the
captured one with their own bus id, UUID suffix and an optional phase offset.
Constants, structs and error classes are the real pynvml's.
"""

from __future__ import annotations

import bisect
import ctypes
import json
import math
import threading
import time
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pynvml as _real

ROOT = Path(__file__).resolve().parents[2]
CAPTURE = ROOT / "tests" / "fixtures" / "h200-nvml-capture.json"
PROBE = ROOT.parent / "shared" / "data" / "h200-nvml-probe-2026-12-02.json"
PROBE_COPY = ROOT / "tests" / "fixtures" / "h200-nvml-probe-2026-12-02.json"

NVMLError = _real.NVMLError


def _raise_if_err(v: Any) -> Any:
    """Captured errors are stored as "ret N" (the nvmlReturn code)."""
    if isinstance(v, str) and v.startswith("ret "):
        raise _real.NVMLError(int(v[4:]))
    return v


class ManualClock:
    """A monotonic clock that only moves when told (for deterministic GPM windows)."""

    def __init__(self, t: float = 1000.0) -> None:
        self.t = t

    def __call__(self) -> float:
        return self.t

    def advance(self, dt: float) -> None:
        self.t += dt


class Capture:
    """Replay data for one GPU: static answers, a timeline of per-tick answers, GPM readings.

    ``gpm`` holds every captured GPM answer as {t, phase, window_s, metrics}.
    """

    def __init__(
        self, static: dict[str, Any], ticks: list[dict[str, Any]], gpm: list[dict[str, Any]], meta: dict[str, Any]
    ):
        self.static = static
        self.ticks = ticks
        self.meta = meta
        t0 = float(ticks[0]["t"])
        self.times = [float(t["t"]) - t0 for t in ticks]
        gaps = sorted(b - a for a, b in zip(self.times, self.times[1:], strict=False)) or [0.1]
        self.period = self.times[-1] + gaps[len(gaps) // 2]
        self.gpm = [{**g, "t": float(g["t"]) - t0} for g in gpm]
        self.truth: dict[str, Any] = meta.get("truth", {})

    def index_at(self, t: float) -> int:
        return max(0, bisect.bisect_right(self.times, t % self.period) - 1)

    def tick_at(self, t: float) -> dict[str, Any]:
        return self.ticks[self.index_at(t)]

    def gpm_at(self, t: float, window_s: float) -> dict[str, Any] | None:
        """The captured GPM answer for a window of ``window_s`` ending at ``t``.

        Among readings of the phase running at ``t``: those whose window was within
        15 ms of the asked one (so short windows come back NaN as often as they did
        on the H200), nearest in time; else the nearest window length.
        """
        if not self.gpm:
            return None
        phase = self.tick_at(t)["phase"]
        tt = t % self.period
        cands = [g for g in self.gpm if g["phase"] == phase] or self.gpm
        close = [g for g in cands if abs(g["window_s"] - window_s) <= 0.015]
        if close:
            best = min(close, key=lambda g: abs(g["t"] - tt))
        else:
            best = min(cands, key=lambda g: (abs(g["window_s"] - window_s), abs(g["t"] - tt)))
        return dict(best["metrics"])

    def phase_spans(self) -> dict[str, tuple[float, float]]:
        """Phase -> (first, last) tick time on the replay timeline."""
        out: dict[str, tuple[float, float]] = {}
        for t, tick in zip(self.times, self.ticks, strict=True):
            a, _b = out.get(tick["phase"], (t, t))
            out[tick["phase"]] = (a, t)
        return out


def load_capture(path: str | Path = CAPTURE) -> Capture:
    """A capture written by tests/fakenvml/capture.py."""
    d = json.loads(Path(path).read_text())
    gpm = [{"t": t["t"], "phase": t["phase"], **t["gpm"]} for t in d["ticks"] if "gpm" in t]
    gpm += d.get("gpm_short", [])
    meta = {**d.get("meta", {}), "truth": d.get("truth", {}), "cost": d.get("cost", {})}
    return Capture(d["static"], d["ticks"], gpm, meta)


def probe_path() -> Path:
    return PROBE if PROBE.exists() else PROBE_COPY


def from_probe(path: str | Path | None = None) -> Capture:
    """The shared first probe, mapped onto the capture layout.

    The probe read GPM every ~147 ms but alternated its sample pair so that every
    other reading came back NaN/0: those NaN readings become the short-window
    answers, the finite ones the long-window answers (held until the next one).
    Per-tick memory, power and link were not probed: the static reads stand in.
    """
    d = json.loads(Path(path or probe_path()).read_text())
    st = d["static"]
    idle = st.get("gpm_idle", {})
    static = {
        "count": st["count"],
        "name": st["name"],
        "uuid": st.get("uuid", "GPU-h200-probe"),
        "pci_bus_id": st["pci_bus_id"],
        "curr_gen": st["curr_gen"],
        "curr_width": st["curr_width"],
        "max_gen": st["max_gen"],
        "max_width": st["max_width"],
        "gpu_max_gen": st["gpu_max_gen"],
        "mem": [st["mem"][0], st["mem"][0] - st["mem"][1], st["mem"][1]],
        "gpm_supported": st["gpm_supported"],
        "nvlink_state": [_errstr(st["nvlink0_state"])],
        "nvlink_speed_field": st["fields"].get("NVML_FI_DEV_NVLINK_GET_SPEED", "ret 3"),
        "procs_compute": st.get("procs", []),
        "procs_graphics": [],
        "numa_node": _errstr(st["numa_node"]),
    }
    ticks: list[dict[str, Any]] = []
    gpm: list[dict[str, Any]] = []
    for s in d["samples"]:
        g = s["gpm"]
        dram = g.get("NVML_GPM_METRIC_DRAM_BW_UTIL")
        valid = isinstance(dram, float) and math.isfinite(dram)
        nvl = {k: v for k, v in idle.items() if k.startswith("NVML_GPM_METRIC_NVLINK_TOTAL")}
        # The probe's own cadence for valid readings; its notes put the NaN ones at ~50 ms.
        gpm.append({"t": s["t"], "phase": s["phase"], "window_s": 0.147 if valid else 0.05, "metrics": {**nvl, **g}})
        ticks.append(
            {
                "t": s["t"],
                "phase": s["phase"],
                "util": s["util"],
                "mem": static["mem"],
                "power_mw": st["power_mw"],
                "link": [st["curr_gen"], st["curr_width"]],
                "pcie_kBps": [s["tx"], s["rx"]],
            }
        )
    return Capture(static, ticks, gpm, {"source": str(path or probe_path()), "truth": d.get("results", {})})


def _errstr(v: Any) -> Any:
    """The probe wrote errors as 'ERR NVMLError_NotSupported(3)'."""
    if isinstance(v, str) and v.startswith("ERR") and v.endswith(")"):
        return f"ret {int(v[v.rindex('(') + 1 : -1])}"
    return v


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
        u = _raise_if_err(self._tick(h)["util"])
        return _real.c_nvmlUtilization_t(gpu=u[0], memory=u[1])

    def nvmlDeviceGetMemoryInfo(self, h: _Handle, version: Any = None) -> Any:
        self._enter("nvmlDeviceGetMemoryInfo", h)
        m = _raise_if_err(self._tick(h).get("mem", self.static["mem"]))
        return _real.c_nvmlMemory_t(total=m[0], free=m[1], used=m[2])

    def nvmlDeviceGetPowerUsage(self, h: _Handle) -> int:
        self._enter("nvmlDeviceGetPowerUsage", h)
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
