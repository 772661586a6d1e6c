"""GPU Performance Monitoring (GPM, Hopper and newer): true DRAM bandwidth, PCIe and SM use.

GPM compares two opaque counter snapshots. nvml.h asks for the two snapshots to be
at least 100 ms apart. Measured on the project's H200 (tests/fixtures/h200-nvml-capture.json,
543 windows): DRAM_BW_UTIL came back NaN in 80 % of 20 ms windows, 56 % at 50 ms,
22 % at 80 ms, 5 % at 100 ms and never at >= 120 ms; in every one of those NaN
windows all the other metrics read exactly 0 (no counter update inside the window),
so a NaN DRAM_BW_UTIL voids the whole window rather than reporting false zeros.

So each device keeps a small ring of snapshots, and every tick computes its metrics
between the new snapshot and the most recent one at least ``MIN_WINDOW_S`` older
("rolled" windows); if that window is void, the next older snapshot is tried.
A 10 Hz sampler therefore reports, every tick, the last 100-200 ms.
"""

from __future__ import annotations

import contextlib
import math
from collections import deque
from dataclasses import dataclass
from typing import Any

MIN_WINDOW_S = 0.100
# Snapshots are stored no closer than this share of the window (12.5 ms), so the
# ring stays short however fast the sampler ticks; MAX_RING is only a safety cap.
STORE_EVERY = 1 / 8
MAX_RING = 32

# (field name in GpmReading, pynvml constant name). Units per nvml.h: *_PER_SEC in
# MiB/s, *_UTIL in percent.
METRICS: tuple[tuple[str, str], ...] = (
    ("pcie_tx_MiBps", "NVML_GPM_METRIC_PCIE_TX_PER_SEC"),
    ("pcie_rx_MiBps", "NVML_GPM_METRIC_PCIE_RX_PER_SEC"),
    ("nvlink_tx_MiBps", "NVML_GPM_METRIC_NVLINK_TOTAL_TX_PER_SEC"),
    ("nvlink_rx_MiBps", "NVML_GPM_METRIC_NVLINK_TOTAL_RX_PER_SEC"),
    ("dram_bw_pct", "NVML_GPM_METRIC_DRAM_BW_UTIL"),
    ("sm_util_pct", "NVML_GPM_METRIC_SM_UTIL"),
)


@dataclass(frozen=True, slots=True)
class GpmReading:
    """Raw GPM metrics over one window, in NVML's units; None = not returned / not finite."""

    window_s: float
    pcie_tx_MiBps: float | None
    pcie_rx_MiBps: float | None
    nvlink_tx_MiBps: float | None
    nvlink_rx_MiBps: float | None
    dram_bw_pct: float | None
    sm_util_pct: float | None


def gpm_supported(nvml: Any, handle: Any) -> bool:
    """True when NVML says this device supports GPM (any NVML error counts as no)."""
    fn = getattr(nvml, "nvmlGpmQueryDeviceSupport", None)
    if fn is None:
        return False
    try:
        return bool(fn(handle).isSupportedDevice)
    except nvml.NVMLError:
        return False


class GpmSampler:
    """One device's GPM snapshot ring. Not thread-safe: call ``tick`` from one thread."""

    def __init__(self, nvml: Any, handle: Any, min_window_s: float = MIN_WINDOW_S) -> None:
        self._nvml = nvml
        self._handle = handle
        self.min_window_s = min_window_s
        self._ring: deque[tuple[float, Any]] = deque()
        self._free: list[Any] = []
        self._ids: list[tuple[str, int]] = []
        for name, const in METRICS:
            mid = getattr(nvml, const, None)
            if mid is not None:
                self._ids.append((name, int(mid)))
        # One request struct per device, reused every tick: it holds NVML_GPM_METRIC_MAX
        # metric slots (~19 KB), too big to build 10 times a second per GPU.
        self._req = nvml.c_nvmlGpmMetricsGet_t()
        self._req.version = nvml.NVML_GPM_METRICS_GET_VERSION
        self._req.numMetrics = len(self._ids)
        for i, (_name, mid) in enumerate(self._ids):
            self._req.metrics[i].metricId = mid
        self._ok = int(nvml.NVML_SUCCESS)

    def _buffer(self) -> Any:
        return self._free.pop() if self._free else self._nvml.nvmlGpmSampleAlloc()

    def tick(self, now: float) -> GpmReading | None:
        """Take a snapshot at ``now`` (monotonic s); metrics over the rolled window, or None.

        None means no snapshot old enough exists yet (the first ~100 ms), or GPM
        failed this tick; NVML errors other than that are not raised.
        """
        nvml = self._nvml
        try:
            buf = self._buffer()
        except nvml.NVMLError:
            return None
        try:
            nvml.nvmlGpmSampleGet(self._handle, buf)
        except nvml.NVMLError:
            self._free.append(buf)
            return None
        ring = self._ring
        # Most recent stored snapshot that gives a long enough window.
        ref = -1
        for i in range(len(ring) - 1, -1, -1):
            if now - ring[i][0] >= self.min_window_s:
                ref = i
                break
        # Keep one snapshot older than the reference: the fallback for a void window.
        for _ in range(ref - 1):
            self._free.append(ring.popleft()[1])
        ref = min(ref, 1)
        got = None
        for i in range(ref, -1, -1):
            got = self._metrics(ring[i][1], buf, now - ring[i][0])
            if got is not None:
                break
        # Store at most one snapshot per STORE_EVERY of the window, so a fast
        # sampler keeps the ring short and its windows just over min_window_s.
        if not ring or now - ring[-1][0] >= self.min_window_s * STORE_EVERY:
            ring.append((now, buf))
            while len(ring) > MAX_RING:
                self._free.append(ring.popleft()[1])
        else:
            self._free.append(buf)
        return got

    def _metrics(self, s1: Any, s2: Any, window_s: float) -> GpmReading | None:
        """Metrics between two snapshots; None if NVML failed or the window is void."""
        nvml = self._nvml
        req = self._req
        req.sample1 = s1
        req.sample2 = s2
        try:
            nvml.nvmlGpmMetricsGet(req)
        except nvml.NVMLError:
            return None
        ok = self._ok
        vals: dict[str, float | None] = {}
        for i, (name, _mid) in enumerate(self._ids):
            m = req.metrics[i]
            if m.nvmlReturn == ok:
                v = float(m.value)
                if math.isfinite(v):
                    vals[name] = v
                elif name == "dram_bw_pct":
                    return None  # void window: the other metrics read a false 0
        get = vals.get
        return GpmReading(
            window_s=window_s,
            pcie_tx_MiBps=get("pcie_tx_MiBps"),
            pcie_rx_MiBps=get("pcie_rx_MiBps"),
            nvlink_tx_MiBps=get("nvlink_tx_MiBps"),
            nvlink_rx_MiBps=get("nvlink_rx_MiBps"),
            dram_bw_pct=get("dram_bw_pct"),
            sm_util_pct=get("sm_util_pct"),
        )

    def close(self) -> None:
        """Free every snapshot buffer (safe to call twice)."""
        bufs = [b for _t, b in self._ring] + self._free
        self._ring.clear()
        self._free = []
        for b in bufs:
            with contextlib.suppress(self._nvml.NVMLError):
                self._nvml.nvmlGpmSampleFree(b)
