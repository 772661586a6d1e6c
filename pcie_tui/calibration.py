"""Measured link ceilings: ``pcie-tui calibrate`` writes them, the monitor reads them.

Stored per host in ``$XDG_CONFIG_HOME/pcie-tui/calibration.json`` (default
``~/.config``), keyed by GPU UUID, with the link's gen x width at calibration.
Each direction keeps the timed payload rate of pinned copies (``payload_Bps``)
and what the GPU's own PCIe counter read during them (``counter_Bps``: GPM
``PCIE_RX/TX_PER_SEC`` where supported, and ``nvmlDeviceGetPcieThroughput``).
The counter includes protocol overhead (~5-8 % above payload on the H200), so
the monitor, which shows the counter, divides by the counter's saturated value.
"""

from __future__ import annotations

import contextlib
import json
import os
import socket
import time
from pathlib import Path
from typing import Any

from pcie_tui.model import pcie_capacity_Bps

FORMAT = "pcie-tui/calibration"
GPM_PCIE_TX_PER_SEC = 20  # MiB/s, leaving the GPU (nvml.h)
GPM_PCIE_RX_PER_SEC = 21  # MiB/s, into the GPU
MIB = 1 << 20


def config_path() -> Path:
    base = os.environ.get("XDG_CONFIG_HOME") or str(Path.home() / ".config")
    return Path(base) / "pcie-tui" / "calibration.json"


def load(path: Path | None = None) -> dict[str, Any]:
    p = path or config_path()
    try:
        data = json.loads(p.read_text())
    except (OSError, ValueError):
        return {"format": FORMAT, "version": 1, "gpus": {}}
    if not isinstance(data, dict) or not isinstance(data.get("gpus"), dict):
        return {"format": FORMAT, "version": 1, "gpus": {}}
    return data


def save_entries(entries: list[dict[str, Any]], path: Path | None = None) -> Path:
    p = path or config_path()
    data = load(p)
    for e in entries:
        data["gpus"][e["uuid"]] = e
    p.parent.mkdir(parents=True, exist_ok=True)
    tmp = p.with_suffix(".json.tmp")
    tmp.write_text(json.dumps(data, indent=1, sort_keys=True))
    tmp.replace(p)
    return p


def lookup_entry(uuid: str, path: Path | None = None) -> dict[str, Any] | None:
    e = load(path)["gpus"].get(uuid)
    return e if isinstance(e, dict) else None


def shape_matches(entry: dict[str, Any], gen: int | None, width: int | None) -> bool:
    """True when (gen, width) is the link the entry was measured on (its under-load or its max state)."""
    if gen is None or width is None:
        return False
    return (gen, width) in {(entry.get("gen"), entry.get("width")), (entry.get("max_gen"), entry.get("max_width"))}


def _applicable(
    uuid: str, gen: int | None, width: int | None, path: Path | None, max_gen: int | None, max_width: int | None
) -> dict[str, Any] | None:
    """This GPU's stored entry, when it was measured on the link it has now (its current or its max state).

    An idle link trains down (Gen1 at P8), so a current state that does not match still counts
    when the link's max (``max_gen``/``max_width``) is the calibrated max. None when never
    calibrated or when the link is another one (the machine changed shape; recalibrate).
    """
    e = lookup_entry(uuid, path)
    if e is None:
        return None
    same_max = max_gen is not None and (max_gen, max_width) == (e.get("max_gen"), e.get("max_width"))
    return e if shape_matches(e, gen, width) or same_max else None


def lookup(
    uuid: str,
    gen: int | None,
    width: int | None,
    path: Path | None = None,
    *,
    max_gen: int | None = None,
    max_width: int | None = None,
) -> float | None:
    """The counter's saturated reading on pinned copies (bytes/s per direction) for this GPU, or None."""
    e = _applicable(uuid, gen, width, path, max_gen, max_width)
    v = e and (e.get("counter_Bps") or e.get("payload_Bps"))
    return float(v) if v else None


def lookup_pageable(
    uuid: str,
    gen: int | None,
    width: int | None,
    path: Path | None = None,
    *,
    max_gen: int | None = None,
    max_width: int | None = None,
) -> float | None:
    """The counter's reading on pageable host->device copies (bytes/s), under the same rules as :func:`lookup`."""
    e = _applicable(uuid, gen, width, path, max_gen, max_width)
    v = e and (e.get("pageable_counter_Bps") or e.get("pageable_payload_Bps"))
    return float(v) if v else None


# ---- measuring --------------------------------------------------------------------


def _gpm_pair(nvml: Any, h: Any, gap_s: float) -> dict[str, Any]:
    """PCIe TX/RX bytes/s from two GPM samples ``gap_s`` apart (>= 0.1 s per nvml.h)."""
    s1 = s2 = None
    try:
        s1, s2 = nvml.nvmlGpmSampleAlloc(), nvml.nvmlGpmSampleAlloc()
        nvml.nvmlGpmSampleGet(h, s1)
        time.sleep(gap_s)
        nvml.nvmlGpmSampleGet(h, s2)
        mg = nvml.c_nvmlGpmMetricsGet_t()
        mg.version = nvml.NVML_GPM_METRICS_GET_VERSION
        mg.numMetrics = 2
        mg.sample1, mg.sample2 = s1, s2
        mg.metrics[0].metricId = GPM_PCIE_TX_PER_SEC
        mg.metrics[1].metricId = GPM_PCIE_RX_PER_SEC
        nvml.nvmlGpmMetricsGet(mg)
        out: dict[str, Any] = {}
        for i, k in ((0, "tx"), (1, "rx")):
            m = mg.metrics[i]
            ok = int(m.nvmlReturn) == 0 and m.value == m.value  # NaN check
            out[k] = float(m.value) * MIB if ok else None
        return out
    except Exception as e:  # GPM unsupported or refused: the NVML throughput counter still answers
        return {"tx": None, "rx": None, "error": f"{type(e).__name__}: {e}"}
    finally:
        for s in (s1, s2):
            if s is not None:
                with contextlib.suppress(Exception):
                    nvml.nvmlGpmSampleFree(s)


def _nvml_throughput(nvml: Any, h: Any) -> dict[str, float | None]:
    out: dict[str, float | None] = {}
    for k, counter in (("tx", 0), ("rx", 1)):  # NVML_PCIE_UTIL_TX_BYTES / RX_BYTES
        try:
            out[k] = float(nvml.nvmlDeviceGetPcieThroughput(h, counter)) * 1024  # KB/s
        except Exception:
            out[k] = None
    return out


def read_counters(nvml: Any, h: Any, gpm: bool, settle_s: float = 0.15, gap_s: float = 0.4) -> dict[str, Any]:
    """Both PCIe counters and the link state, read while copies run (called inside the copy window)."""
    time.sleep(settle_s)
    out: dict[str, Any] = {"gpm": _gpm_pair(nvml, h, gap_s) if gpm else None, "nvml": _nvml_throughput(nvml, h)}
    for k, fn in (("gen", "nvmlDeviceGetCurrPcieLinkGeneration"), ("width", "nvmlDeviceGetCurrPcieLinkWidth")):
        try:
            out[k] = int(getattr(nvml, fn)(h))
        except Exception:
            out[k] = None
    return out


def _direction_result(payload_Bps: float, counters: dict[str, Any], key: str) -> dict[str, Any]:
    gpm = (counters.get("gpm") or {}).get(key)
    nv = (counters.get("nvml") or {}).get(key)
    src, val = ("gpm", gpm) if gpm else (("nvml_throughput", nv) if nv else (None, None))
    return {
        "payload_Bps": payload_Bps,
        "counter_Bps": val,
        "counter_source": src,
        "counters": {"gpm_Bps": gpm, "nvml_throughput_Bps": nv, "gpm_error": (counters.get("gpm") or {}).get("error")},
        "link_during": {"gen": counters.get("gen"), "width": counters.get("width")},
    }


def measure(
    nvml: Any,
    backend: Any,
    gpu: int | None = None,
    size_mib: int = 256,
    duration_s: float = 1.5,
) -> list[dict[str, Any]]:
    """Time H2D and D2H (and device-to-device) copies per GPU; one calibration entry per GPU."""
    from pcie_tui.doctor.copybench import map_devices
    from pcie_tui.doctor.topology import normalize_bdf
    from pcie_tui.errors import UserError

    count = int(nvml.nvmlDeviceGetCount())
    if gpu is not None and not 0 <= gpu < count:
        raise UserError(f"no GPU {gpu}: NVML sees {count} (0..{count - 1})")
    infos = []
    for i in range(count):
        h = nvml.nvmlDeviceGetHandleByIndex(i)
        bus = nvml.nvmlDeviceGetPciInfo(h).busId
        infos.append((i, h, normalize_bdf(bus.decode() if isinstance(bus, bytes) else str(bus))))
    devmap = map_devices(backend, [b for _, _, b in infos])
    size = size_mib * MIB
    entries = []
    for i, h, bdf in infos:
        if gpu is not None and i != gpu:
            continue
        if bdf not in devmap:
            raise UserError(f"GPU {i} ({bdf}) is not visible to {backend.name} (check CUDA_VISIBLE_DEVICES)")
        dev = devmap[bdf]
        try:
            gpm = bool(nvml.nvmlGpmQueryDeviceSupport(h).isSupportedDevice)
        except Exception:
            gpm = False
        dirs = {}
        for d, key in (("h2d", "rx"), ("d2h", "tx")):
            payload, counters = backend.copy_rate(
                dev, d, size, duration_s, lambda h=h, gpm=gpm: read_counters(nvml, h, gpm)
            )
            dirs[d] = _direction_result(payload, counters, key)
        # Pageable host memory (what an engine's mmapped weights are): the driver stages each copy
        # through pinned buffers, so the link idles part of the time. Its ceiling is the rate that
        # tells "transfer-bound below link capacity" from "host-bound".
        pageable = {}
        for d, key in (("h2d", "rx"), ("d2h", "tx")):
            payload, counters = backend.copy_rate(
                dev, d, size, duration_s, lambda h=h, gpm=gpm: read_counters(nvml, h, gpm), pinned=False
            )
            pageable[d] = _direction_result(payload, counters, key)
        uuid = nvml.nvmlDeviceGetUUID(h)
        uuid = uuid.decode() if isinstance(uuid, bytes) else str(uuid)
        name = nvml.nvmlDeviceGetName(h)
        gen = dirs["h2d"]["link_during"]["gen"]
        width = dirs["h2d"]["link_during"]["width"]
        max_gen: int | None = None
        max_width: int | None = None
        with contextlib.suppress(Exception):
            max_gen, max_width = (
                int(nvml.nvmlDeviceGetMaxPcieLinkGeneration(h)),
                int(nvml.nvmlDeviceGetMaxPcieLinkWidth(h)),
            )
        counters = [dirs[d]["counter_Bps"] for d in dirs if dirs[d]["counter_Bps"]]
        entries.append(
            {
                "uuid": uuid,
                "index": i,
                "name": name.decode() if isinstance(name, bytes) else str(name),
                "pci_bus_id": bdf,
                "host": socket.gethostname(),
                "time": time.time(),
                "backend": backend.name,
                "size_mib": size_mib,
                "gen": gen,
                "width": width,
                "max_gen": max_gen,
                "max_width": max_width,
                "theoretical_Bps": pcie_capacity_Bps(gen, width),
                "h2d": dirs["h2d"],
                "d2h": dirs["d2h"],
                "h2d_pageable": pageable["h2d"],
                "d2h_pageable": pageable["d2h"],
                # One ceiling per GPU for the monitor: the larger direction, so neither reads above 100 %.
                "counter_Bps": max(counters) if counters else None,
                "payload_Bps": max(dirs[d]["payload_Bps"] for d in dirs),
                # Pageable: host->device, the direction engines stream host weights and KV in (what a
                # transfer-bound phase is compared with); device->host is kept above for the record.
                "pageable_counter_Bps": pageable["h2d"]["counter_Bps"],
                "pageable_payload_Bps": pageable["h2d"]["payload_Bps"],
                "peers": {},
            }
        )
    if gpu is None and len(infos) > 1:
        by_index = {e["index"]: e for e in entries}
        for a, _, abdf in infos:
            for b, _, bbdf in infos:
                if a != b and abdf in devmap and bbdf in devmap:
                    rate = backend.peer_rate(devmap[abdf], devmap[bbdf], size, duration_s / 2)
                    by_index[a]["peers"][by_index[b]["uuid"]] = rate
    return entries
