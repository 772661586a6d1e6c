"""Runs every doctor check and returns one JSON-ready report.

``nvml`` is the NVML module (``pynvml`` when None) so tests pass a stand-in;
``sysfs_root`` / ``proc_root`` point at fake trees in tests.
"""

from __future__ import annotations

import contextlib
import socket
import time
from collections.abc import Callable
from typing import Any

from pcie_tui.core.errors import UserError
from pcie_tui.doctor.checks import run_checks
from pcie_tui.doctor.checks_peers import topology_matrix
from pcie_tui.doctor.fingerprint import driver_version
from pcie_tui.doctor.items import FAIL, PASS, WARN, DoctorData, Item
from pcie_tui.doctor.load import read_under_load
from pcie_tui.doctor.numa import ProcPlacement, node_cpus, read_placement
from pcie_tui.doctor.nvmlfacts import gather, open_nvml, pair_facts, read_pcie_counters
from pcie_tui.doctor.topology import read_chain


def _default_backend() -> Any:
    from pcie_tui.doctor.copybench import load_backend

    return load_backend()


def run_doctor(
    nvml: Any | None = None,
    sysfs_root: str = "/sys",
    proc_root: str = "/proc",
    pid: int | None = None,
    load_s: float = 3.0,
    backend_factory: Callable[[], Any] | None = _default_backend,
) -> dict[str, Any]:
    """Gather, load, check. Raises NoGpuError when NVML or a GPU is missing, UserError for a bad --pid."""
    nv = open_nvml(nvml)
    try:
        gpus = gather(nv)
        pairs = pair_facts(nv, gpus)
        chains = {g.index: read_chain(sysfs_root, g.bdf) for g in gpus}
        placements: dict[int, ProcPlacement] = {}
        pid_gpus: dict[int, list[int]] = {}
        pid_errors: dict[int, str] = {}
        if pid is not None:
            placements[pid] = read_placement(proc_root, pid)  # UserError when the pid does not exist
            using = [g.index for g in gpus if g.pids.ok and pid in (g.pids.value or [])]
            pid_gpus[pid] = using or [g.index for g in gpus]
        else:
            for g in gpus:
                for p in g.pids.value or [] if g.pids.ok else []:
                    pid_gpus.setdefault(p, []).append(g.index)
            for p in list(pid_gpus):
                try:
                    placements[p] = read_placement(proc_root, p)
                except UserError as e:
                    # NVML lists host pids; inside a container they may not exist here.
                    pid_errors[p] = str(e)
        t0 = time.time()
        load = read_under_load(nv, gpus, sysfs_root, load_s, backend_factory)
        after = {g.index: read_pcie_counters(nv, g.handle) for g in gpus}
        data = DoctorData(gpus, pairs, chains, load, after, node_cpus(sysfs_root), placements, pid_gpus, pid_errors)
        items = run_checks(data)
        report = build_report(data, items, t0)
        report["driver_version"] = driver_version(nv)
        return report
    finally:
        with contextlib.suppress(Exception):
            nv.nvmlShutdown()


def build_report(d: DoctorData, items: list[Item], t0: float) -> dict[str, Any]:
    counts = {s: sum(1 for i in items if i.status == s) for s in (PASS, WARN, FAIL)}
    return {
        "format": "pcie-tui/doctor",
        "version": 1,
        "host": socket.gethostname(),
        "time": t0,
        "load": d.load.to_json(),
        "gpus": [g.to_json() for g in d.gpus],
        "chains": {str(i): c.to_json() for i, c in d.chains.items()},
        "topology": {
            "gpus": [f"GPU{g.index}" for g in d.gpus],
            "matrix": topology_matrix(d.gpus, d.pairs),
            "pairs": {f"{a}-{b}": v for (a, b), v in d.pairs.items()},
        },
        "items": [i.to_json() for i in items],
        "summary": counts,
        "ok": counts[FAIL] == 0,
    }
