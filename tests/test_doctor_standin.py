"""A small explicit NVML stand-in for doctor tests on fixture layouts.

Its answers are NVML return codes and enums (link generation/width, P2P status,
topology level, NVLink state/version, bus ids), as a real driver would give for
the parts in tests/fixtures/sysfs/: no throughput or bandwidth numbers are made
up. Counter fields answer NVML_ERROR_NOT_SUPPORTED unless a test passes values
captured on real hardware. ``pynvml`` is imported only for NVMLError and its
constants; it needs no driver for that.
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass, field
from typing import Any

import pynvml

NOT_SUPPORTED = pynvml.NVML_ERROR_NOT_SUPPORTED
INVALID_ARGUMENT = pynvml.NVML_ERROR_INVALID_ARGUMENT


@dataclass
class Gpu:
    bus_id: str  # NVML form: 00000000:01:00.0
    name: str
    idle: tuple[int, int]  # (gen, width) when idle
    loaded: tuple[int, int]  # (gen, width) while traffic flows
    max: tuple[int, int]  # NVML max link gen/width (card and slot)
    gpu_max_gen: int
    numa: int | None = None  # None: NOT_SUPPORTED (as in VMs)
    affinity: list[int] = field(default_factory=lambda: [0xFFFF])
    nvlinks: list[tuple[int, int, str]] | None = None  # (active, version enum, remote bus id); None: NOT_SUPPORTED
    pids: list[int] = field(default_factory=list)
    fields: dict[int, tuple[int, int]] = field(default_factory=dict)  # field id -> (valueType, value)
    replay: int | None = None
    gpm: bool = False
    uuid: str | None = None  # None: GPU-standin-<index>


class _V:
    def __init__(self, value_type: int, value: int | float) -> None:
        self.uiVal = self.ulVal = self.ullVal = self.sllVal = self.siVal = self.usVal = int(value)
        self.dVal = float(value)


class _FV:
    def __init__(self, field_id: int, ret: int, value_type: int = 1, value: int | float = 0) -> None:
        self.fieldId = field_id
        self.nvmlReturn = ret
        self.valueType = value_type
        self.value = _V(value_type, value)


class _Pci:
    def __init__(self, bus_id: str) -> None:
        self.busId = bus_id.encode()


class _Proc:
    def __init__(self, pid: int) -> None:
        self.pid = pid
        self.usedGpuMemory = None


class StandInNvml:
    """Enough of pynvml's API for doctor; GPUs are indexed in list order."""

    NVMLError = pynvml.NVMLError
    NVML_NVLINK_MAX_LINKS = pynvml.NVML_NVLINK_MAX_LINKS

    def __init__(
        self,
        gpus: list[Gpu],
        p2p: dict[tuple[int, int], tuple[int, int, int]] | None = None,
        topo: dict[tuple[int, int], int] | None = None,
    ) -> None:
        self.gpus = gpus
        self.p2p = p2p or {}
        self.topo = topo or {}
        self.loaded = False
        self.inited = 0
        self.driver = "580.159.04"  # the project's H200 driver; tests change it

    # -- lifecycle
    def nvmlInit(self) -> None:
        self.inited += 1

    def nvmlShutdown(self) -> None:
        self.inited -= 1

    def nvmlDeviceGetCount(self) -> int:
        return len(self.gpus)

    def nvmlDeviceGetHandleByIndex(self, i: int) -> int:
        if not 0 <= i < len(self.gpus):
            raise pynvml.NVMLError(INVALID_ARGUMENT)
        return i

    def nvmlSystemGetDriverVersion(self) -> str:
        return self.driver

    # -- identity
    def nvmlDeviceGetPciInfo(self, h: int) -> _Pci:
        return _Pci(self.gpus[h].bus_id)

    def nvmlDeviceGetUUID(self, h: int) -> str:
        return self.gpus[h].uuid or f"GPU-standin-{h}"

    def nvmlDeviceGetName(self, h: int) -> str:
        return self.gpus[h].name

    # -- link
    def _state(self, h: int) -> tuple[int, int]:
        g = self.gpus[h]
        return g.loaded if self.loaded else g.idle

    def nvmlDeviceGetCurrPcieLinkGeneration(self, h: int) -> int:
        return self._state(h)[0]

    def nvmlDeviceGetCurrPcieLinkWidth(self, h: int) -> int:
        return self._state(h)[1]

    def nvmlDeviceGetMaxPcieLinkGeneration(self, h: int) -> int:
        return self.gpus[h].max[0]

    def nvmlDeviceGetMaxPcieLinkWidth(self, h: int) -> int:
        return self.gpus[h].max[1]

    def nvmlDeviceGetGpuMaxPcieLinkGeneration(self, h: int) -> int:
        return self.gpus[h].gpu_max_gen

    # -- placement
    def nvmlDeviceGetNumaNodeId(self, h: int) -> int:
        if self.gpus[h].numa is None:
            raise pynvml.NVMLError(NOT_SUPPORTED)
        return self.gpus[h].numa

    def nvmlDeviceGetCpuAffinity(self, h: int, n: int) -> list[int]:
        return (self.gpus[h].affinity + [0] * n)[:n]

    def nvmlDeviceGetComputeRunningProcesses(self, h: int) -> list[_Proc]:
        return [_Proc(p) for p in self.gpus[h].pids]

    def nvmlDeviceGetUtilizationRates(self, h: int) -> Any:
        raise pynvml.NVMLError(NOT_SUPPORTED)

    def nvmlGpmQueryDeviceSupport(self, h: int) -> Any:
        class S:
            isSupportedDevice = int(self.gpus[h].gpm)

        return S()

    # -- NVLink
    def _link(self, h: int, link: int) -> tuple[int, int, str]:
        links = self.gpus[h].nvlinks
        if links is None:
            raise pynvml.NVMLError(NOT_SUPPORTED)
        if link >= len(links):
            raise pynvml.NVMLError(INVALID_ARGUMENT)
        return links[link]

    def nvmlDeviceGetNvLinkState(self, h: int, link: int) -> int:
        return self._link(h, link)[0]

    def nvmlDeviceGetNvLinkVersion(self, h: int, link: int) -> int:
        return self._link(h, link)[1]

    def nvmlDeviceGetNvLinkRemotePciInfo_v2(self, h: int, link: int) -> _Pci:
        return _Pci(self._link(h, link)[2])

    # -- counters
    def nvmlDeviceGetFieldValues(self, h: int, ids: list[int]) -> list[_FV]:
        out = []
        for fid in ids:
            got = self.gpus[h].fields.get(fid)
            out.append(_FV(fid, 0, *got) if got is not None else _FV(fid, NOT_SUPPORTED))
        return out

    def nvmlDeviceGetPcieReplayCounter(self, h: int) -> int:
        if self.gpus[h].replay is None:
            raise pynvml.NVMLError(NOT_SUPPORTED)
        return self.gpus[h].replay

    # -- pairs
    def nvmlDeviceGetP2PStatus(self, a: int, b: int, index: Any) -> int:
        if not isinstance(index, int):
            raise TypeError("P2P capability index must be a plain int (pynvml's READ constant is a tuple)")
        return self.p2p.get((a, b), (NOT_SUPPORTED_P2P,) * 3)[index]

    def nvmlDeviceGetTopologyCommonAncestor(self, a: int, b: int) -> int:
        if (a, b) not in self.topo:
            raise pynvml.NVMLError(NOT_SUPPORTED)
        return self.topo[(a, b)]


NOT_SUPPORTED_P2P = pynvml.NVML_P2P_STATUS_NOT_SUPPORTED


def symmetric(pairs: dict[tuple[int, int], Any]) -> dict[tuple[int, int], Any]:
    out = dict(pairs)
    for (a, b), v in pairs.items():
        out.setdefault((b, a), v)
    return out


class StandInLoad:
    """Doctor's load generator for tests: while it 'runs', the stand-in answers its under-load link state."""

    name = "stand-in load"

    def __init__(self, nvml: StandInNvml, fail: bool = False) -> None:
        self.nvml = nvml
        self.fail = fail

    def device_count(self) -> int:
        return len(self.nvml.gpus)

    def background_load(self, devs: list[int], stop: threading.Event) -> None:
        if self.fail:
            raise RuntimeError("copy failed")
        self.nvml.loaded = True
        while not stop.is_set():
            time.sleep(0.01)
        self.nvml.loaded = False
