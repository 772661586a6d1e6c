"""NVML collector: per-GPU PCIe/NVLink rates, DRAM bandwidth, utilisation, one tick at a time.

Where GPM is supported (Hopper and newer) one GPM snapshot pair per tick gives PCIe,
NVLink, DRAM bandwidth and SM use (H200, paced at 10 Hz: 0.48 ms CPU and wall per
GPU-tick, all calls included; bench/results.md). Elsewhere PCIe comes from
``nvmlDeviceGetPcieThroughput``, which waits out a 20 ms window per call and
direction, so those calls run in a thread pool, all GPUs and directions at once
(they overlap on the H200: 21 ms per tick instead of 42).

``nvml`` is injectable (a pynvml-like module), so tests drive this class with
readings replayed from a real H200 (tests/fakenvml).
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field, replace
from typing import Any

from pcie_tui.core.errors import NoGpuError, UserError
from pcie_tui.core.model import GpuInfo, GpuSample, LinkInfo, pcie_capacity_Bps
from pcie_tui.recording.validate import Tally, clean_gpu_sample
from pcie_tui.sources.aer import SYSFS_DEVICES, read_aer
from pcie_tui.sources.gpm import GpmReading, GpmSampler, gpm_supported

MiB = 1 << 20
DEMO_HINT = "try `pcie-tui demo` to replay a recorded session"

# Errors after which a call is never retried on that device: the answer will not change.
_PERMANENT = ("NVML_ERROR_NOT_SUPPORTED", "NVML_ERROR_FUNCTION_NOT_FOUND")
# Errors that mean the GPU, the driver or NVML itself stopped answering (not one metric refused), in words.
GONE = {
    "NVML_ERROR_GPU_IS_LOST": "the GPU fell off the bus (NVML: GPU is lost)",
    "NVML_ERROR_UNINITIALIZED": "NVML was shut down or unloaded under pcie-tui",
    "NVML_ERROR_DRIVER_NOT_LOADED": "the NVIDIA driver is no longer loaded",
    "NVML_ERROR_LIB_RM_VERSION_MISMATCH": "the NVIDIA driver was changed under NVML (a reboot is needed)",
    "NVML_ERROR_RESET_REQUIRED": "the GPU needs a reset (NVML: reset required)",
    "NVML_ERROR_UNKNOWN": "NVML answers 'unknown error' for this GPU",
}


def load_nvml(nvml: Any = None) -> Any:
    """The given module, else ``pynvml``; NoGpuError naming the package when it is missing."""
    if nvml is not None:
        return nvml
    try:
        import pynvml
    except ImportError:
        raise NoGpuError(
            f"the NVML Python bindings are not installed (pip install nvidia-ml-py, module pynvml); {DEMO_HINT}"
        ) from None
    return pynvml


def _text(v: Any) -> str:
    return v.decode(errors="replace") if isinstance(v, bytes) else str(v)


def nvml_unavailable_reason(nvml: Any = None) -> str | None:
    """Why live GPU collection cannot start (one line), or None when NVML sees a GPU."""
    try:
        NvmlCollector(nvml=nvml, gpm=False).close()
    except UserError as e:
        return str(e)
    return None


@dataclass
class _Device:
    index: int
    handle: Any
    gpm: GpmSampler | None
    nvlink_count: int | None
    unsupported: set[str] = field(default_factory=set)
    link: tuple[int | None, int | None] = (None, None)
    link_t: float = float("-inf")
    # This tick: whether any call answered, and the last error that means the GPU or NVML went away.
    answered: bool = False
    fatal: str | None = None
    bus_id: str = ""
    health_t: float = float("-inf")


class NvmlCollector:
    """Reads the selected GPUs (all when ``indices`` is None). Call ``close`` when done.

    ``clock`` is the monotonic clock used for GPM windows (injectable for tests).
    ``link_refresh_s``: how often each GPU's current PCIe gen/width is re-read;
    the link state changes on power-state transitions, not per tick.
    ``health_refresh_s``: how often the link's error counters are read (the PCIe replay
    counter, and AER counts from sysfs under ``sysfs_root``); ticks between leave them out.
    Temperature, clocks, clock-event reasons, power limit and fan are read every tick: NVML answers
    them from the driver's state, with no sampling window to wait out (unlike
    ``nvmlDeviceGetPcieThroughput``); scripts/heat_session.py times each call on a GPU.
    """

    def __init__(
        self,
        indices: Sequence[int] | None = None,
        nvml: Any = None,
        *,
        gpm: bool = True,
        clock: Callable[[], float] = time.monotonic,
        link_refresh_s: float = 1.0,
        health_refresh_s: float = 1.0,
        sysfs_root: str = SYSFS_DEVICES,
    ) -> None:
        self.nvml = nv = load_nvml(nvml)
        self.clock = clock
        self.link_refresh_s = link_refresh_s
        self.health_refresh_s = health_refresh_s
        self.sysfs_root = sysfs_root
        self._pool: ThreadPoolExecutor | None = None
        self._closed = False
        self.tally = Tally("NVML")  # readings the validation rules turned into "unavailable"
        try:
            nv.nvmlInit()
        except nv.NVMLError as e:
            raise NoGpuError(
                f"NVML could not start ({e}): is the NVIDIA driver installed and loaded? {DEMO_HINT}"
            ) from None
        try:
            count = int(nv.nvmlDeviceGetCount())
            if count == 0:
                raise NoGpuError(f"NVML is running but sees no NVIDIA GPU; {DEMO_HINT}")
            wanted = list(range(count)) if indices is None else list(indices)
            bad = [i for i in wanted if not 0 <= i < count]
            if bad or not wanted:
                raise UserError(f"no GPU with index {bad or wanted}: NVML sees {count} GPU(s), indices 0..{count - 1}")
            self.devices: list[_Device] = []
            for i in wanted:
                h = nv.nvmlDeviceGetHandleByIndex(i)
                sampler = GpmSampler(nv, h) if gpm and gpm_supported(nv, h) else None
                pci = self._call(None, "nvmlDeviceGetPciInfo", h)
                bus = _text(pci.busId) if pci is not None else ""
                self.devices.append(_Device(i, h, sampler, self._nvlink_count(h), bus_id=bus))
        except nv.NVMLError as e:
            self._shutdown()
            raise NoGpuError(f"NVML failed while listing GPUs ({e}); {DEMO_HINT}") from None
        except UserError:
            self._shutdown()
            raise

    # ---- helpers ---------------------------------------------------------

    def _shutdown(self) -> None:
        with contextlib.suppress(self.nvml.NVMLError):
            self.nvml.nvmlShutdown()

    def _call(self, dev: _Device | None, name: str, *args: Any) -> Any:
        """NVML call by name; None on any NVML error. Permanent refusals are remembered."""
        if dev is not None and name in dev.unsupported:
            return None
        nv = self.nvml
        try:
            out = getattr(nv, name)(*args)
        except nv.NVMLError as e:
            code = getattr(e, "value", None)
            if dev is not None and any(code == getattr(nv, c, -1) for c in _PERMANENT):
                dev.unsupported.add(name)
            elif dev is not None:
                dev.fatal = next((why for c, why in GONE.items() if code == getattr(nv, c, -2)), dev.fatal)
            return None
        except AttributeError:  # an older pynvml without this function
            if dev is not None:
                dev.unsupported.add(name)
            return None
        if dev is not None:
            dev.answered = True
        return out

    def _nvlink_count(self, handle: Any) -> int | None:
        """Active NVLinks, or None when the GPU has none (or NVML cannot say)."""
        nv = self.nvml
        active = 0
        for link in range(int(getattr(nv, "NVML_NVLINK_MAX_LINKS", 18))):
            try:
                if nv.nvmlDeviceGetNvLinkState(handle, link) == nv.NVML_FEATURE_ENABLED:
                    active += 1
            except nv.NVMLError:
                break  # NotSupported on link 0 = no NVLink; InvalidArgument = past the last link
        return active or None

    def _nvlink_speed_Bps(self, handle: Any) -> float | None:
        """Per-link, per-direction NVLink rate (NVML's common speed field, MBps = 1e6 B/s)."""
        nv = self.nvml
        fid = getattr(nv, "NVML_FI_DEV_NVLINK_SPEED_MBPS_COMMON", None)
        if fid is None:
            return None
        try:
            v = nv.nvmlDeviceGetFieldValues(handle, [fid])[0]
        except nv.NVMLError:
            return None
        if v.nvmlReturn != nv.NVML_SUCCESS:
            return None
        mbps = float(v.value.uiVal)
        return mbps * 1e6 if mbps > 0 else None

    def _pool_get(self) -> ThreadPoolExecutor:
        if self._pool is None:
            self._pool = ThreadPoolExecutor(max_workers=2 * len(self.devices), thread_name_prefix="pcie-tui-nvml")
        return self._pool

    # ---- static facts ----------------------------------------------------

    def gpu_infos(self) -> tuple[GpuInfo, ...]:
        """Name, UUID, bus id, PCIe link (current and max), memory and NVLink of each GPU."""
        out = []
        for d in self.devices:
            h = d.handle
            gen = self._call(d, "nvmlDeviceGetCurrPcieLinkGeneration", h)
            width = self._call(d, "nvmlDeviceGetCurrPcieLinkWidth", h)
            link = LinkInfo(
                gen=gen,
                width=width,
                max_gen=self._call(d, "nvmlDeviceGetMaxPcieLinkGeneration", h),
                max_width=self._call(d, "nvmlDeviceGetMaxPcieLinkWidth", h),
                capacity_Bps=pcie_capacity_Bps(gen, width),
            )
            pci = self._call(d, "nvmlDeviceGetPciInfo", h)
            sm_max = self._call(d, "nvmlDeviceGetMaxClockInfo", h, self.nvml.NVML_CLOCK_SM)
            mem = self._call(d, "nvmlDeviceGetMemoryInfo", h)
            speed = self._nvlink_speed_Bps(h) if d.nvlink_count else None
            out.append(
                GpuInfo(
                    index=d.index,
                    uuid=_text(self._call(d, "nvmlDeviceGetUUID", h) or ""),
                    name=_text(self._call(d, "nvmlDeviceGetName", h) or ""),
                    pci_bus_id=_text(pci.busId) if pci is not None else "",
                    link=link,
                    memory_total_bytes=int(mem.total) if mem is not None else None,
                    nvlink_count=d.nvlink_count,
                    nvlink_capacity_Bps=d.nvlink_count * speed if d.nvlink_count and speed else None,
                    metrics_source="gpm" if d.gpm is not None else "nvml",
                    sm_clock_max_MHz=float(sm_max) if sm_max else None,
                )
            )
        return tuple(out)

    # ---- one tick --------------------------------------------------------

    def read(self) -> tuple[GpuSample, ...]:
        """One reading of every selected GPU. Missing metrics are None, never 0."""
        pool = None
        for d in self.devices:
            d.answered, d.fatal = False, None
        pcie: dict[int, tuple[Future[Any], Future[Any]]] = {}
        fallback = [d for d in self.devices if d.gpm is None]
        if fallback:
            pool = self._pool_get()
            nv = self.nvml
            for d in fallback:
                pcie[d.index] = (
                    pool.submit(self._call, d, "nvmlDeviceGetPcieThroughput", d.handle, nv.NVML_PCIE_UTIL_TX_BYTES),
                    pool.submit(self._call, d, "nvmlDeviceGetPcieThroughput", d.handle, nv.NVML_PCIE_UTIL_RX_BYTES),
                )
        # The cheap reads run here while the pool waits out the PCIe windows.
        out = [self._read_device(d) for d in self.devices]
        if pool is None:
            return self._checked(out)
        res = []
        for s in out:
            f = pcie.get(s.index)
            if f is None:
                res.append(s)
                continue
            tx_kBps, rx_kBps = f[0].result(), f[1].result()
            res.append(_with_pcie(s, tx_kBps, rx_kBps))
        return self._checked(res)

    def not_answering(self) -> dict[int, str]:
        """GPUs that answered no call of the last read, with why in words (an error meaning the GPU, the
        driver or NVML went away); a GPU that merely lacks some metrics is not here."""
        return {d.index: d.fatal for d in self.devices if not d.answered and d.fatal is not None}

    def _checked(self, out: list[GpuSample]) -> tuple[GpuSample, ...]:
        """Every reading through the validation rules (GPM can return NaN; a driver can return junk); a GPU
        that answered nothing this tick (it, the driver or NVML went away) has no readings at all, not
        the ones its GPM or link state left from before."""
        gone = self.not_answering()
        return tuple(GpuSample(index=s.index) if s.index in gone else clean_gpu_sample(s, self.tally) for s in out)

    def _read_device(self, d: _Device) -> GpuSample:
        h = d.handle
        g: GpmReading | None = d.gpm.tick(self.clock()) if d.gpm is not None else None
        util = self._call(d, "nvmlDeviceGetUtilizationRates", h)
        mem = self._call(d, "nvmlDeviceGetMemoryInfo", h)
        power_mW = self._call(d, "nvmlDeviceGetPowerUsage", h)
        now = self.clock()
        if now - d.link_t >= self.link_refresh_s:
            d.link = (
                self._call(d, "nvmlDeviceGetCurrPcieLinkGeneration", h),
                self._call(d, "nvmlDeviceGetCurrPcieLinkWidth", h),
            )
            d.link_t = now
        if d.gpm is not None:
            sm = _pct(g.sm_util_pct) if g is not None else None
        else:
            sm = util.gpu / 100.0 if util is not None else None
        nvl = g is not None and d.nvlink_count is not None
        return GpuSample(
            index=d.index,
            pcie_tx_Bps=_mib(g.pcie_tx_MiBps) if g is not None else None,
            pcie_rx_Bps=_mib(g.pcie_rx_MiBps) if g is not None else None,
            nvlink_tx_Bps=_mib(g.nvlink_tx_MiBps) if nvl and g is not None else None,
            nvlink_rx_Bps=_mib(g.nvlink_rx_MiBps) if nvl and g is not None else None,
            dram_bw_util=_pct(g.dram_bw_pct) if g is not None else None,
            mem_busy=util.memory / 100.0 if util is not None else None,
            sm_util=sm,
            mem_used_bytes=int(mem.used) if mem is not None else None,
            power_W=power_mW / 1000.0 if power_mW is not None else None,
            link_gen=d.link[0],
            link_width=d.link[1],
            **self._heat(d),
            **self._health(d, now),
        )

    def _heat(self, d: _Device) -> dict[str, Any]:
        """Temperature, clocks, clock-event reasons, power limit and fan; what the GPU does not report is None."""
        h, nv = d.handle, self.nvml
        reasons = self._call(d, "nvmlDeviceGetCurrentClocksEventReasons", h)
        if reasons is None and "nvmlDeviceGetCurrentClocksEventReasons" in d.unsupported:
            reasons = self._call(d, "nvmlDeviceGetCurrentClocksThrottleReasons", h)  # drivers before 535
        limit_mW = self._call(d, "nvmlDeviceGetEnforcedPowerLimit", h)
        fan_pct = self._call(d, "nvmlDeviceGetFanSpeed", h)
        return {
            "temp_C": _float(self._call(d, "nvmlDeviceGetTemperature", h, nv.NVML_TEMPERATURE_GPU)),
            "sm_clock_MHz": _float(self._call(d, "nvmlDeviceGetClockInfo", h, nv.NVML_CLOCK_SM)),
            "mem_clock_MHz": _float(self._call(d, "nvmlDeviceGetClockInfo", h, nv.NVML_CLOCK_MEM)),
            "clock_events": int(reasons) if reasons is not None else None,
            "power_limit_W": limit_mW / 1000.0 if limit_mW else None,
            "fan_util": fan_pct / 100.0 if fan_pct is not None else None,
        }

    def _health(self, d: _Device, now: float) -> dict[str, Any]:
        """The link's error counters, once per ``health_refresh_s`` (an empty dict in the ticks between)."""
        if now - d.health_t < self.health_refresh_s:
            return {}
        d.health_t = now
        replays = self._call(d, "nvmlDeviceGetPcieReplayCounter", d.handle)
        aer = read_aer(d.bus_id, self.sysfs_root) if d.bus_id else {}
        return {"pcie_replays": int(replays) if replays is not None else None} | {f"aer_{k}": v for k, v in aer.items()}

    # ---- processes -------------------------------------------------------

    def running_pids(self) -> dict[int, list[int]]:
        """GPU index -> sorted pids of compute and graphics processes on it."""
        out: dict[int, list[int]] = {}
        for d in self.devices:
            pids: set[int] = set()
            for fn in ("nvmlDeviceGetComputeRunningProcesses", "nvmlDeviceGetGraphicsRunningProcesses"):
                for p in self._call(d, fn, d.handle) or ():
                    pids.add(int(p.pid))
            out[d.index] = sorted(pids)
        return out

    def close(self) -> None:
        """Free GPM buffers, stop the pool, shut NVML down (idempotent)."""
        if self._closed:
            return
        self._closed = True
        if self._pool is not None:
            self._pool.shutdown(wait=True)
            self._pool = None
        for d in self.devices:
            if d.gpm is not None:
                d.gpm.close()
        self._shutdown()

    def __enter__(self) -> NvmlCollector:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _float(v: Any) -> float | None:
    return float(v) if v is not None else None


def _mib(v: float | None) -> float | None:
    return v * MiB if v is not None else None


def _pct(v: float | None) -> float | None:
    return v / 100.0 if v is not None else None


def _with_pcie(s: GpuSample, tx_kBps: int | None, rx_kBps: int | None) -> GpuSample:
    """nvmlDeviceGetPcieThroughput answers in KB/s (x1024, per nvml.h)."""
    return replace(
        s,
        pcie_tx_Bps=tx_kBps * 1024.0 if tx_kBps is not None else None,
        pcie_rx_Bps=rx_kBps * 1024.0 if rx_kBps is not None else None,
    )
