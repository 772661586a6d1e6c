"""Everything doctor asks NVML, gathered into plain data.

The NVML module is a parameter (``pynvml`` by default) so tests can pass a
stand-in. Every read keeps its NVML error text instead of a value when it
fails: "Not Supported" is an answer, never a zero.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from pcie_tui.core.errors import NoGpuError
from pcie_tui.doctor.sysfs_pci import normalize_bdf
from pcie_tui.sources.nvml import load_nvml

# Field ids (nvml.h; ABI-stable), used when the module lacks the constant.
PCIE_COUNTER_FIELDS = {
    "replay": 94,
    "replay_rollover": 95,
    "l0_to_recovery": 169,
    "correctable_errors": 173,
    "naks_received": 174,
    "receiver_error": 175,
    "bad_tlp": 176,
    "naks_sent": 177,
    "bad_dllp": 178,
    "non_fatal_error": 179,
    "fatal_error": 180,
    "unsupported_req": 181,
    "lcrc_error": 182,
    "lane_error": 183,
}
FI_NVLINK_SPEED_MBPS_COMMON = 90
FI_NVLINK_LINK_COUNT = 91

P2P_CAPS = {"read": 0, "write": 1, "nvlink": 2}  # plain ints: pynvml's READ constant is a tuple
P2P_STATUS = {
    0: "OK",
    1: "chipset not supported",
    2: "GPU not supported",
    3: "IOH topology not supported",
    4: "disabled by regkey",
    5: "not supported",
    6: "unknown",
}
TOPOLOGY = {0: "X", 10: "PIX", 20: "PXB", 30: "PHB", 40: "NODE", 50: "SYS"}
TOPOLOGY_MEANING = {
    "PIX": "at most one PCIe switch between them",
    "PXB": "several PCIe switches, no host bridge",
    "PHB": "through a PCIe host bridge (the CPU)",
    "NODE": "across host bridges within one NUMA node",
    "SYS": "across the inter-socket link (SMP interconnect)",
}
NVLINK_VERSION = {1: "1.0", 2: "2.0", 3: "2.2", 4: "3.0", 5: "3.1", 6: "4.0", 7: "5.0", 8: "6.0"}


@dataclass
class Read:
    """One NVML answer: a value, or the error NVML gave instead."""

    value: Any = None
    error: str | None = None

    @property
    def ok(self) -> bool:
        return self.error is None

    def to_json(self) -> Any:
        return self.value if self.error is None else {"error": self.error}


@dataclass
class LinkRead:
    cur_gen: Read
    cur_width: Read
    max_gen: Read
    max_width: Read
    gpu_max_gen: Read

    def to_json(self) -> dict[str, Any]:
        return {k: getattr(self, k).to_json() for k in ("cur_gen", "cur_width", "max_gen", "max_width", "gpu_max_gen")}


@dataclass
class GpuFacts:
    index: int
    uuid: str
    name: str
    bdf: str
    link_idle: LinkRead
    numa_node: Read
    cpu_affinity: Read  # list[int] of CPUs
    nvlinks: list[dict[str, Any]] | None  # None: NVML says the GPU has no NVLink
    nvlink_error: str | None
    nvlink_speed_MBps: Read
    nvlink_count_field: Read
    pcie_counters_before: dict[str, Read]
    pids: Read
    gpm_supported: Read
    handle: Any = field(default=None, repr=False)

    def to_json(self) -> dict[str, Any]:
        return {
            "index": self.index,
            "uuid": self.uuid,
            "name": self.name,
            "pci_bus_id": self.bdf,
            "link_idle": self.link_idle.to_json(),
            "numa_node_nvml": self.numa_node.to_json(),
            "cpu_affinity": self.cpu_affinity.to_json(),
            "nvlinks": self.nvlinks,
            "nvlink_error": self.nvlink_error,
            "pcie_counters_before": {k: v.to_json() for k, v in self.pcie_counters_before.items()},
            "pids": self.pids.to_json(),
        }


def _err(e: BaseException) -> str:
    return str(e) or type(e).__name__


def _try(nvml: Any, fn: Callable[..., Any] | str | None, *args: Any) -> Read:
    """Call ``fn`` (or the NVML function of that name); NVML errors become a Read with the error."""
    if isinstance(fn, str):
        fn = getattr(nvml, fn, None)
    try:
        if fn is None:
            raise AttributeError("no such function")
        return Read(fn(*args))
    except nvml.NVMLError as e:
        return Read(error=_err(e))
    except (AttributeError, TypeError) as e:  # an older pynvml without this call
        return Read(error=f"unavailable in this pynvml ({_err(e)})")


def _text(v: Any) -> str:
    return v.decode() if isinstance(v, bytes) else str(v)


def open_nvml(nvml: Any | None = None) -> Any:
    """Import (unless given, through the one NVML wrapper: :func:`pcie_tui.sources.nvml.load_nvml`) and
    initialise NVML; NoGpuError with one clear line if impossible."""
    nvml = load_nvml(nvml)
    try:
        nvml.nvmlInit()
    except nvml.NVMLError as e:
        raise NoGpuError(f"no NVIDIA GPU reachable: NVML could not start ({_err(e)})") from e
    try:
        count = int(nvml.nvmlDeviceGetCount())
    except nvml.NVMLError as e:
        raise NoGpuError(f"no NVIDIA GPU reachable: {_err(e)}") from e
    if count == 0:
        nvml.nvmlShutdown()
        raise NoGpuError("NVML found no GPU on this machine")
    return nvml


def read_link(nvml: Any, h: Any) -> LinkRead:
    return LinkRead(
        cur_gen=_try(nvml, "nvmlDeviceGetCurrPcieLinkGeneration", h),
        cur_width=_try(nvml, "nvmlDeviceGetCurrPcieLinkWidth", h),
        max_gen=_try(nvml, "nvmlDeviceGetMaxPcieLinkGeneration", h),
        max_width=_try(nvml, "nvmlDeviceGetMaxPcieLinkWidth", h),
        gpu_max_gen=_try(nvml, "nvmlDeviceGetGpuMaxPcieLinkGeneration", h),
    )


def field_value(fv: Any) -> int | float:
    """Decode a c_nvmlFieldValue_t by its valueType."""
    vt = int(getattr(fv, "valueType", 3))
    v = fv.value
    return {
        0: lambda: v.dVal,
        1: lambda: v.uiVal,
        2: lambda: v.ulVal,
        3: lambda: v.ullVal,
        4: lambda: v.sllVal,
        5: lambda: v.siVal,
        6: lambda: v.usVal,
    }.get(vt, lambda: v.ullVal)()


def read_fields(nvml: Any, h: Any, ids: dict[str, int]) -> dict[str, Read]:
    names = list(ids)
    try:
        vals = nvml.nvmlDeviceGetFieldValues(h, [ids[n] for n in names])
    except nvml.NVMLError as e:
        return {n: Read(error=_err(e)) for n in names}
    out: dict[str, Read] = {}
    for n, fv in zip(names, vals, strict=False):
        ret = int(getattr(fv, "nvmlReturn", 0))
        if ret != 0:
            out[n] = Read(error=_err(nvml.NVMLError(ret)))
        else:
            out[n] = Read(field_value(fv))
    return out


def read_pcie_counters(nvml: Any, h: Any) -> dict[str, Read]:
    out = read_fields(nvml, h, PCIE_COUNTER_FIELDS)
    direct = _try(nvml, "nvmlDeviceGetPcieReplayCounter", h)
    if direct.ok or not out["replay"].ok:
        out["replay"] = direct if direct.ok else out["replay"]
    return out


def _affinity_cpus(mask: Any) -> list[int]:
    cpus = []
    for word_i, word in enumerate(mask):
        w = int(word)
        for bit in range(64):
            if w >> bit & 1:
                cpus.append(word_i * 64 + bit)
    return cpus


def _nvlinks(nvml: Any, h: Any) -> tuple[list[dict[str, Any]] | None, str | None]:
    """Active links with version and peer; None when the GPU has no NVLink at all."""
    links: list[dict[str, Any]] = []
    max_links = int(getattr(nvml, "NVML_NVLINK_MAX_LINKS", 18))
    for link in range(max_links):
        st = _try(nvml, "nvmlDeviceGetNvLinkState", h, link)
        if not st.ok:
            if link == 0:
                return None, st.error
            break  # past the device's last link
        entry: dict[str, Any] = {"link": link, "active": bool(st.value)}
        if st.value:
            ver = _try(nvml, "nvmlDeviceGetNvLinkVersion", h, link)
            entry["version"] = NVLINK_VERSION.get(ver.value, str(ver.value)) if ver.ok else None
            remote_fn = "nvmlDeviceGetNvLinkRemotePciInfo_v2"
            if getattr(nvml, remote_fn, None) is None:
                remote_fn = "nvmlDeviceGetNvLinkRemotePciInfo"
            rp = _try(nvml, remote_fn, h, link)
            entry["remote_bdf"] = normalize_bdf(_text(rp.value.busId)) if rp.ok else None
        links.append(entry)
    return links, None


def gather(nvml: Any) -> list[GpuFacts]:
    """Static facts of every GPU NVML sees (NVML already initialised)."""
    out = []
    cpu_words = max(1, ((os.cpu_count() or 64) + 63) // 64)
    for i in range(int(nvml.nvmlDeviceGetCount())):
        h = nvml.nvmlDeviceGetHandleByIndex(i)
        pci = nvml.nvmlDeviceGetPciInfo(h)
        links, nvl_err = _nvlinks(nvml, h)
        nvf = read_fields(nvml, h, {"speed": FI_NVLINK_SPEED_MBPS_COMMON, "count": FI_NVLINK_LINK_COUNT})
        aff = _try(nvml, "nvmlDeviceGetCpuAffinity", h, cpu_words)
        procs = _try(nvml, "nvmlDeviceGetComputeRunningProcesses", h)
        gpm_fn = "nvmlGpmQueryDeviceSupport"
        gpm = _try(nvml, gpm_fn, h)
        out.append(
            GpuFacts(
                index=i,
                uuid=_text(nvml.nvmlDeviceGetUUID(h)),
                name=_text(nvml.nvmlDeviceGetName(h)),
                bdf=normalize_bdf(_text(pci.busId)),
                link_idle=read_link(nvml, h),
                numa_node=_try(nvml, "nvmlDeviceGetNumaNodeId", h),
                cpu_affinity=Read(_affinity_cpus(aff.value)) if aff.ok else aff,
                nvlinks=links,
                nvlink_error=nvl_err,
                nvlink_speed_MBps=nvf["speed"],
                nvlink_count_field=nvf["count"],
                pcie_counters_before=read_pcie_counters(nvml, h),
                pids=Read([int(p.pid) for p in procs.value]) if procs.ok else procs,
                gpm_supported=Read(bool(getattr(gpm.value, "isSupportedDevice", 0))) if gpm.ok else gpm,
                handle=h,
            )
        )
    return out


def pair_facts(nvml: Any, gpus: list[GpuFacts]) -> dict[tuple[int, int], dict[str, Any]]:
    """P2P read/write/NVLink status and the common-ancestor level for each ordered GPU pair."""
    out: dict[tuple[int, int], dict[str, Any]] = {}
    for a in gpus:
        for b in gpus:
            if a.index == b.index:
                continue
            entry: dict[str, Any] = {}
            for cap, idx in P2P_CAPS.items():
                r = _try(nvml, "nvmlDeviceGetP2PStatus", a.handle, b.handle, idx)
                entry[cap] = P2P_STATUS.get(int(r.value), f"status {r.value}") if r.ok else f"error: {r.error}"
            topo = _try(nvml, "nvmlDeviceGetTopologyCommonAncestor", a.handle, b.handle)
            entry["topology"] = TOPOLOGY.get(int(topo.value), str(topo.value)) if topo.ok else None
            entry["topology_error"] = topo.error
            entry["nvlinks_to_peer"] = sum(
                1 for ln in (a.nvlinks or []) if ln.get("active") and ln.get("remote_bdf") == b.bdf
            )
            out[(a.index, b.index)] = entry
    return out
