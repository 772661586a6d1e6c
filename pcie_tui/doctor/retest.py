"""``pcie-tui doctor --since BASELINE``: what changed since a baseline, and is a retest due.

Every change is one line ending in ``retest`` (a calibration or benchmark taken
on the old machine no longer describes this one) or ``no retest (cosmetic)``.
The rules and why are in docs/doctor.md. Idle links train down (Gen1 at P8), so a
link is compared by its max gen/width and, where both sides read it under load,
by its under-load state; never by its idle state.
"""

from __future__ import annotations

import argparse
from dataclasses import dataclass
from typing import Any

from pcie_tui.core.errors import NoGpuError
from pcie_tui.core.units import gib
from pcie_tui.doctor import fingerprint as fpm

MEMORY_TOLERANCE = 0.01  # MemTotal moves by a few MiB with kernel reservations


@dataclass
class Change:
    what: str  # "gpu", "link", "chain", "numa", "driver", "cpu", "memory", "hostname", "engine", ...
    message: str
    retest: bool

    def line(self) -> str:
        return f"{self.message}: {'retest' if self.retest else 'no retest (cosmetic)'}"


def _link(gen: Any, width: Any) -> str:
    return f"Gen{gen if gen is not None else '?'} x{width if width is not None else '?'}"


def _na(v: Any) -> str:
    return "n/a" if v is None else str(v)


def _trained(now: dict[str, Any], base: dict[str, Any]) -> str:
    """Only the parts that differ: ``x8 instead of x16``, ``Gen4 instead of Gen5``, or both."""
    if now["gen"] == base["gen"]:
        return f"x{now['width']} instead of x{base['width']}"
    if now["width"] == base["width"]:
        return f"Gen{now['gen']} instead of Gen{base['gen']}"
    return f"{_link(now['gen'], now['width'])} instead of {_link(base['gen'], base['width'])}"


def compare(base: dict[str, Any], now: dict[str, Any]) -> dict[str, Any]:
    """Changes between two fingerprints, and which states were compared."""
    when = str(base.get("created") or "")[:10] or "unknown date"
    changes: list[Change] = []
    compared: list[str] = []
    bg, ng = base.get("gpus") or [], now.get("gpus") or []
    if bg and not ng and now.get("gpu_error"):
        changes.append(Change("gpu", f"no GPU visible now ({now['gpu_error']}); the baseline had {len(bg)}", True))
    now_by_uuid = {g.get("uuid"): g for g in ng}
    now_by_bdf = {g.get("pci_bus_id"): g for g in ng}
    matched: set[str] = set()
    for b in bg:
        n = now_by_uuid.get(b.get("uuid"))
        if n is None:
            other = now_by_bdf.get(b.get("pci_bus_id"))
            if other is not None and other.get("uuid") not in {x.get("uuid") for x in bg}:
                matched.add(other.get("uuid"))
                changes.append(
                    Change(
                        "gpu",
                        f"GPU {b.get('pci_bus_id')} replaced (UUID changed: {b.get('name')} "
                        f"{b.get('uuid')} -> {other.get('name')} {other.get('uuid')})",
                        True,
                    )
                )
            elif ng or not now.get("gpu_error"):
                changes.append(
                    Change("gpu", f"GPU {b.get('pci_bus_id')} ({b.get('name')}, {b.get('uuid')}) is gone", True)
                )
            continue
        matched.add(n.get("uuid"))
        _compare_gpu(b, n, when, changes, compared)
    for n in ng:
        if n.get("uuid") not in matched:
            changes.append(
                Change(
                    "gpu",
                    f"GPU {n.get('index')} added at {n.get('pci_bus_id')} ({n.get('name')}, {n.get('uuid')})",
                    True,
                )
            )
    _compare_host(base.get("host") or {}, now.get("host") or {}, changes, compared)
    _compare_engine(base.get("engine"), now.get("engine"), changes, compared)
    return {
        "baseline": {
            "path": base.get("path"),
            "created": base.get("created"),
            "source": base.get("source"),
            "host": (base.get("host") or {}).get("hostname"),
        },
        "now": {"path": now.get("path"), "created": now.get("created"), "source": now.get("source")},
        "since": when,
        "changes": [{"what": c.what, "message": c.message, "retest": c.retest, "line": c.line()} for c in changes],
        "compared": compared,
        "retest": any(c.retest for c in changes),
    }


def _compare_gpu(b: dict[str, Any], n: dict[str, Any], when: str, changes: list[Change], compared: list[str]) -> None:
    label = f"GPU {n.get('index')}"
    if b.get("pci_bus_id") != n.get("pci_bus_id"):
        changes.append(
            Change("gpu", f"{label} ({n.get('uuid')}) moved from {b.get('pci_bus_id')} to {n.get('pci_bus_id')}", True)
        )
    if b.get("index") != n.get("index"):
        changes.append(Change("gpu", f"{label} at {n.get('pci_bus_id')} was NVML index {b.get('index')}", False))
    if b.get("name") != n.get("name"):
        changes.append(Change("gpu", f"{label} name {b.get('name')!r} -> {n.get('name')!r} (same UUID)", False))
    bl, nl = b.get("link") or {}, n.get("link") or {}
    bmax, nmax = (bl.get("max_gen"), bl.get("max_width")), (nl.get("max_gen"), nl.get("max_width"))
    states = []
    if None in bmax or None in nmax:
        states.append("not by max (max n/a " + ("in the baseline" if None in bmax else "now") + ")")
    else:
        states.append("by max")
        if bmax != nmax:
            changes.append(
                Change("link", f"{label} max link {_link(*bmax)} -> {_link(*nmax)} since the baseline ({when})", True)
            )
    bu, nu = b.get("under_load"), n.get("under_load")
    if bu and nu:
        states.append(f"under load (baseline: {bu.get('how')}, now: {nu.get('how')})")
        if (bu.get("gen"), bu.get("width")) != (nu.get("gen"), nu.get("width")):
            changes.append(
                Change("link", f"{label} trained {_trained(nu, bu)} under load since the baseline ({when})", True)
            )
    else:
        why = "no under-load reading " + ("in the baseline" if not bu else "now")
        states.append(f"not under load ({why}; idle links train down, so the idle state is not compared)")
    compared.append(f"{label} link compared " + " and ".join(states))
    bc, nc = b.get("chain") or {}, n.get("chain") or {}
    if bc.get("found") and nc.get("found"):
        if bc.get("attach") != nc.get("attach"):
            changes.append(
                Change("chain", f"{label} now attached via {nc.get('attach')} instead of {bc.get('attach')}", True)
            )
        bn, nn = bc.get("narrowest"), nc.get("narrowest")
        if bn and nn:
            bnl, nnl = (bn.get("max_gen"), bn.get("max_width")), (nn.get("max_gen"), nn.get("max_width"))
            if bnl != nnl:
                msg = f"{label} narrowest link on the bridge chain {_link(*bnl)} -> {_link(*nnl)} ({nn.get('hop')})"
                changes.append(Change("chain", msg, True))
    else:
        compared.append(
            f"{label} bridge chain not compared (not in sysfs {'in the baseline' if not bc.get('found') else 'now'})"
        )
    if b.get("numa_node") != n.get("numa_node"):
        changes.append(
            Change("numa", f"{label} NUMA node {_na(b.get('numa_node'))} -> {_na(n.get('numa_node'))}", True)
        )


def _compare_host(b: dict[str, Any], n: dict[str, Any], changes: list[Change], compared: list[str]) -> None:
    rows = (("driver_version", "driver", True), ("cpu_model", "CPU model", True), ("cpu_count", "logical CPUs", True))
    for key, name, trigger in rows:
        bv, nv = b.get(key), n.get(key)
        if bv is None or nv is None:
            compared.append(f"{name} not compared (not recorded {'in the baseline' if bv is None else 'now'})")
        elif bv != nv:
            changes.append(Change(key, f"{name} {bv} -> {nv}", trigger))
    bm, nm = b.get("memory_bytes"), n.get("memory_bytes")
    if bm is None or nm is None:
        compared.append(f"host memory not compared (not recorded {'in the baseline' if bm is None else 'now'})")
    elif bm != nm:
        big = abs(nm - bm) > MEMORY_TOLERANCE * bm
        vm = b.get("virtual_machine") or n.get("virtual_machine")
        note = (
            " (a VM: MemTotal follows the guest's use)"
            if vm
            else ""
            if big
            else (f" (under {MEMORY_TOLERANCE:.0%}: kernel reservations)")
        )
        big = big and not vm
        a, z = (gib(bm), gib(nm)) if gib(bm) != gib(nm) else (f"{bm / 2**20:.0f} MiB", f"{nm / 2**20:.0f} MiB")
        changes.append(Change("memory", f"host memory {a} -> {z}{note}", big))
    if b.get("hostname") != n.get("hostname"):
        changes.append(Change("hostname", f"hostname {_na(b.get('hostname'))} -> {_na(n.get('hostname'))}", False))


def _flag(v: Any) -> str:
    if v is None:
        return "unset"
    if v is True:
        return "set"
    return " ".join(map(str, v)) if isinstance(v, list) else str(v)


def _compare_engine(
    b: dict[str, Any] | None, n: dict[str, Any] | None, changes: list[Change], compared: list[str]
) -> None:
    if not b or not n:
        if b and not n:
            compared.append("engine layout not compared (no engine now: pass --pid or --recording)")
        elif n and not b:
            compared.append("engine layout not compared (no engine recorded in the baseline)")
        return
    if b.get("kind") != n.get("kind"):
        changes.append(Change("engine", f"engine {b.get('kind')} -> {n.get('kind')}", True))
        return
    kind = n.get("kind")
    if b.get("version") != n.get("version"):
        changes.append(Change("engine", f"{kind} version {_na(b.get('version'))} -> {_na(n.get('version'))}", True))
    bf, nf = b.get("flags") or {}, n.get("flags") or {}
    for k in sorted(set(bf) | set(nf)):
        if bf.get(k) != nf.get(k):
            changes.append(Change("engine", f"{kind} {k} {_flag(bf.get(k))} -> {_flag(nf.get(k))}", True))
    bm, nm = b.get("model") or {}, n.get("model") or {}
    if bm.get("name") != nm.get("name"):
        changes.append(Change("engine", f"model {_na(bm.get('name'))} -> {_na(nm.get('name'))}", True))
    elif None not in (bm.get("size_bytes"), nm.get("size_bytes")) and bm.get("size_bytes") != nm.get("size_bytes"):
        changes.append(
            Change("engine", f"model {nm.get('name')} size {bm['size_bytes']} -> {nm['size_bytes']} bytes", True)
        )
    compared.append(f"engine layout compared ({kind})")


def render(result: dict[str, Any]) -> str:
    b, n = result["baseline"], result["now"]
    now_label = f"{n['path']} ({n['created']})" if n.get("path") else "this machine now"
    lines = [f"since baseline {b['path']} ({b['created']}, {b['source']} on {_na(b['host'])}) vs {now_label}"]
    lines += [c["line"] for c in result["changes"]]
    lines += [f"  - {c}" for c in result["compared"]]
    due = [c for c in result["changes"] if c["retest"]]
    if due:
        lines.append(f"retest due: {len(due)} change(s) since the baseline ({result['since']})")
    else:
        what = "only cosmetic changes" if result["changes"] else "nothing changed"
        lines.append(f"no retest due: {what} since the baseline ({result['since']})")
    return "\n".join(lines)


def since_main(args: argparse.Namespace, nvml: Any = None) -> int:
    """Compare a baseline with this machine (or ``--now FILE``); exit 1 when a retest is due."""
    import json
    import sys

    base = fpm.load(args.since)  # UserError (exit 2) before anything touches NVML
    engine = None
    if getattr(args, "recording", None):
        engine = fpm.engine_from_recording(args.recording)
    if args.now:
        now = fpm.load(args.now)
    else:
        if engine is None and args.pid is not None:
            engine = fpm.engine_from_pid(args.pid)
        now = measure_now(args, nvml, engine)
    result = compare(base, now)
    if args.json:
        json.dump(result, sys.stdout, indent=1, sort_keys=True)
        sys.stdout.write("\n")
    else:
        print(render(result))
    return 1 if result["retest"] else 0


def measure_now(
    args: argparse.Namespace, nvml: Any, engine: dict[str, Any] | None, source: str = "doctor"
) -> dict[str, Any]:
    """Doctor's own readings (links under its generated load) as a fingerprint; no GPU gives one saying why."""
    from pcie_tui.doctor.run import run_doctor

    host = fpm.host_facts(args.proc_root)
    try:
        report = run_doctor(
            nvml=nvml, sysfs_root=args.sysfs_root, proc_root=args.proc_root, pid=args.pid, load_s=args.load_s
        )
    except NoGpuError as e:
        return fpm.no_gpu(str(e), host, engine, source)
    host["driver_version"] = report.get("driver_version")
    return fpm.from_report(report, host, engine, source)
