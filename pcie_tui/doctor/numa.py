"""NUMA placement of a process: /proc/PID/status and numa_maps, and sysfs node CPU lists."""

from __future__ import annotations

import re
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pcie_tui.core.errors import UserError


def parse_cpulist(text: str | None) -> set[int]:
    """``"0-3,8,10-11"`` -> {0,1,2,3,8,10,11}."""
    out: set[int] = set()
    if not text:
        return out
    for part in text.strip().split(","):
        part = part.strip()
        if not part:
            continue
        if "-" in part:
            a, b = part.split("-", 1)
            out.update(range(int(a), int(b) + 1))
        else:
            out.add(int(part))
    return out


def format_cpulist(cpus: set[int] | list[int]) -> str:
    """{0,1,2,3,8} -> ``"0-3,8"``."""
    s = sorted(set(cpus))
    parts = []
    i = 0
    while i < len(s):
        j = i
        while j + 1 < len(s) and s[j + 1] == s[j] + 1:
            j += 1
        parts.append(str(s[i]) if i == j else f"{s[i]}-{s[j]}")
        i = j + 1
    return ",".join(parts)


def node_cpus(sysfs_root: str | Path) -> dict[int, set[int]]:
    """NUMA node -> its CPUs, from ``devices/system/node/nodeN/cpulist``."""
    d = Path(sysfs_root) / "devices" / "system" / "node"
    out: dict[int, set[int]] = {}
    try:
        entries = sorted(d.iterdir())
    except OSError:
        return out
    for e in entries:
        m = re.fullmatch(r"node(\d+)", e.name)
        if m:
            try:
                out[int(m.group(1))] = parse_cpulist((e / "cpulist").read_text())
            except OSError:
                continue
    return out


@dataclass
class ProcPlacement:
    pid: int
    name: str | None
    cpus_allowed: set[int]
    mems_allowed: set[int]
    policies: dict[str, int] = field(default_factory=dict)  # numa_maps policy -> mappings
    pages_per_node: dict[int, int] = field(default_factory=dict)
    numa_maps_error: str | None = None

    def to_json(self) -> dict[str, Any]:
        return {
            "pid": self.pid,
            "name": self.name,
            "cpus_allowed": format_cpulist(self.cpus_allowed),
            "mems_allowed": format_cpulist(self.mems_allowed),
            "policies": self.policies,
            "pages_per_node": self.pages_per_node,
            "numa_maps_error": self.numa_maps_error,
        }


def read_placement(proc_root: str | Path, pid: int) -> ProcPlacement:
    """CPU and memory placement of ``pid``; UserError when the process does not exist."""
    base = Path(proc_root) / str(pid)
    try:
        status = (base / "status").read_text()
    except OSError as e:
        raise UserError(f"no process {pid} to check (cannot read {base / 'status'}: {e.strerror})") from e
    fields = dict(line.split(":", 1) for line in status.splitlines() if ":" in line)
    pl = ProcPlacement(
        pid=pid,
        name=fields.get("Name", "").strip() or None,
        cpus_allowed=parse_cpulist(fields.get("Cpus_allowed_list")),
        mems_allowed=parse_cpulist(fields.get("Mems_allowed_list")),
    )
    try:
        maps = (base / "numa_maps").read_text()
    except OSError as e:
        pl.numa_maps_error = e.strerror or str(e)
        return pl
    policies: Counter[str] = Counter()
    pages: Counter[int] = Counter()
    for line in maps.splitlines():
        toks = line.split()
        if len(toks) < 2:
            continue
        policies[toks[1]] += 1
        for t in toks[2:]:
            m = re.fullmatch(r"N(\d+)=(\d+)", t)
            if m:
                pages[int(m.group(1))] += int(m.group(2))
    pl.policies = dict(policies)
    pl.pages_per_node = dict(sorted(pages.items()))
    return pl
