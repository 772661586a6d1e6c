"""``pcie-tui calibrate``: time pinned and pageable copies per GPU and store them as link ceilings.

The measuring half of :mod:`pcie_tui.core.calibration` (which only stores and looks
entries up): copies run on a copy backend (:mod:`pcie_tui.doctor.copybench`)
while both PCIe counters are read (GPM ``PCIE_RX/TX_PER_SEC`` where supported,
and ``nvmlDeviceGetPcieThroughput``). Also doctor's calibration item: is the
stored ceiling still valid for the link each GPU has now?
"""

from __future__ import annotations

import argparse
import contextlib
import socket
import sys
import time
from typing import Any

from pcie_tui.core.errors import UserError
from pcie_tui.core.model import pcie_capacity_Bps

GPM_PCIE_TX_PER_SEC = 20  # MiB/s, leaving the GPU (nvml.h)
GPM_PCIE_RX_PER_SEC = 21  # MiB/s, into the GPU
MIB = 1 << 20


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

    count = int(nvml.nvmlDeviceGetCount())
    if gpu is not None and not 0 <= gpu < count:
        raise UserError(f"no GPU {gpu}: NVML sees {count} (0..{count - 1})")
    infos = _nvml_gpus(nvml, count)
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
        dirs = _time_copies(nvml, h, gpm, backend, dev, size, duration_s, pinned=True)
        # Pageable host memory (what an engine's mmapped weights are): the driver stages each copy
        # through pinned buffers, so the link idles part of the time. Its ceiling is the rate that
        # tells "transfer-bound below link capacity" from "host-bound".
        pageable = _time_copies(nvml, h, gpm, backend, dev, size, duration_s, pinned=False)
        entries.append(_entry(nvml, h, i, bdf, backend.name, size_mib, dirs, pageable))
    if gpu is None and len(infos) > 1:
        by_index = {e["index"]: e for e in entries}
        for a, _, abdf in infos:
            for b, _, bbdf in infos:
                if a != b and abdf in devmap and bbdf in devmap:
                    rate = backend.peer_rate(devmap[abdf], devmap[bbdf], size, duration_s / 2)
                    by_index[a]["peers"][by_index[b]["uuid"]] = rate
    return entries


def _nvml_gpus(nvml: Any, count: int) -> list[tuple[int, Any, str]]:
    """(index, NVML handle, normalised PCI bus id) of each of the ``count`` GPUs NVML sees."""
    from pcie_tui.doctor.sysfs_pci import normalize_bdf

    infos = []
    for i in range(count):
        h = nvml.nvmlDeviceGetHandleByIndex(i)
        bus = nvml.nvmlDeviceGetPciInfo(h).busId
        infos.append((i, h, normalize_bdf(bus.decode() if isinstance(bus, bytes) else str(bus))))
    return infos


def _time_copies(
    nvml: Any, h: Any, gpm: bool, backend: Any, dev: Any, size: int, duration_s: float, pinned: bool
) -> dict[str, dict[str, Any]]:
    """Host-to-device then device-to-host copies from pinned (or pageable) host memory, each timed
    while the GPU's PCIe counters in its direction are read: a result per direction."""
    extra = {} if pinned else {"pinned": False}
    out = {}
    for d, key in (("h2d", "rx"), ("d2h", "tx")):
        payload, counters = backend.copy_rate(
            dev, d, size, duration_s, lambda h=h, gpm=gpm: read_counters(nvml, h, gpm), **extra
        )
        out[d] = _direction_result(payload, counters, key)
    return out


def _entry(
    nvml: Any,
    h: Any,
    i: int,
    bdf: str,
    backend_name: str,
    size_mib: int,
    dirs: dict[str, dict[str, Any]],
    pageable: dict[str, dict[str, Any]],
) -> dict[str, Any]:
    """One GPU's calibration entry from its timed pinned (``dirs``) and pageable copies: its identity,
    the link it ran at and could run at, and the ceilings the monitor reads (``peers`` still empty)."""
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
    return {
        "uuid": uuid,
        "index": i,
        "name": name.decode() if isinstance(name, bytes) else str(name),
        "pci_bus_id": bdf,
        "host": socket.gethostname(),
        "time": time.time(),
        "backend": backend_name,
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


def calibrate_main(args: argparse.Namespace, nvml: Any = None) -> int:
    from pcie_tui.core import calibration
    from pcie_tui.doctor.copybench import load_backend
    from pcie_tui.doctor.nvmlfacts import open_nvml
    from pcie_tui.doctor.render import print_json, render_calibration

    if args.size_mib <= 0 or args.seconds <= 0:
        raise UserError("--size-mib and --seconds must be positive")
    nv = open_nvml(nvml)
    try:
        backend = load_backend(args.backend)
        entries = measure(nv, backend, gpu=args.gpu, size_mib=args.size_mib, duration_s=args.seconds)
    finally:
        with contextlib.suppress(Exception):
            nv.nvmlShutdown()
    path = None if args.no_save else str(calibration.save_entries(entries))
    result = {
        "format": "pcie-tui/calibrate-run",
        "path": path,
        "backend": backend.name,
        "size_mib": args.size_mib,
        "gpus": entries,
    }
    if path is not None:
        result["baseline"] = _save_calibration_baseline(args, nvml, entries, path)
    if args.json:
        print_json(result)
    else:
        print(render_calibration(result))
    return 0


def _save_calibration_baseline(
    args: argparse.Namespace, nvml: Any, entries: list[dict[str, Any]], path: str
) -> str | None:
    """The machine's fingerprint beside the calibration file, links under the calibration's copies."""
    from pathlib import Path

    from pcie_tui.doctor import fingerprint as fpm

    try:
        fp = fpm.snapshot(nvml, getattr(args, "sysfs_root", "/sys"), getattr(args, "proc_root", "/proc"), entries)
        return str(fpm.write(fp, Path(path).parent))
    except UserError as e:  # the calibration itself is saved; say so and go on
        print(f"pcie-tui: warning: {e}", file=sys.stderr)
        return None


def add_calibration_items(report: dict[str, Any]) -> None:
    """One item per GPU: is the stored ceiling still valid for this link?"""
    from pcie_tui.core.calibration import lookup_entry, shape_matches
    from pcie_tui.core.units import rate as fmt_gbs

    for g in report["gpus"]:
        links = report["load"]["links"]
        link = links.get(g["index"]) or links.get(str(g["index"])) or g["link_idle"]
        gen, width = link.get("cur_gen"), link.get("cur_width")
        mgen, mwidth = link.get("max_gen"), link.get("max_width")
        e = lookup_entry(g["uuid"])
        item: tuple[str, str, str, list[str]]
        if e is None:
            item = (
                "pass",
                "not calibrated: the monitor uses the theoretical link rate",
                "Run pcie-tui calibrate once so link % is shown against what this link really achieves.",
                [],
            )
        elif shape_matches(
            e, gen if isinstance(gen, int) else None, width if isinstance(width, int) else None
        ) or shape_matches(e, mgen if isinstance(mgen, int) else None, mwidth if isinstance(mwidth, int) else None):
            item = (
                "pass",
                f"calibrated ceiling {fmt_gbs(e.get('counter_Bps'))} (counter) on Gen{e.get('gen')} x{e.get('width')}",
                "Nothing to do.",
                [f"calibrated {_when(e.get('time'))} with {e.get('backend')}: payload {fmt_gbs(e.get('payload_Bps'))}"],
            )
        else:
            item = (
                "warn",
                "machine changed shape, recalibrate",
                "Run pcie-tui calibrate again: the stored ceiling was measured on a different link.",
                [
                    f"calibrated on Gen{e.get('gen')} x{e.get('width')}, link now Gen{gen} x{width} (max Gen{mgen} x{mwidth})"
                ],
            )
        status, title, advice, ev = item
        report["items"].append(
            {
                "check": "calibration",
                "gpu": g["index"],
                "status": status,
                "title": title,
                "evidence": ev,
                "advice": advice,
                "data": {"entry": e},
            }
        )
        report["summary"][status] += 1
    report["ok"] = report["summary"]["fail"] == 0


def _when(t: Any) -> str:
    from datetime import datetime, timezone

    try:
        return datetime.fromtimestamp(float(t), timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    except (TypeError, ValueError):
        return "at an unknown time"
