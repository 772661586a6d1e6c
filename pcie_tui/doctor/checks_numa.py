"""Doctor's NUMA check: are the GPU's processes placed on the GPU's node (CPUs and memory)?"""

from __future__ import annotations

from typing import Any

from pcie_tui.doctor.items import FAIL, PASS, WARN, DoctorData, Item
from pcie_tui.doctor.numa import ProcPlacement, format_cpulist
from pcie_tui.doctor.nvmlfacts import GpuFacts
from pcie_tui.doctor.topology import Chain


def check_numa(g: GpuFacts, chain: Chain | None, d: DoctorData) -> Item:
    node, src = _gpu_node(g, chain)
    ev = [
        f"GPU NUMA node: {node if node is not None else 'n/a'} ({src or 'NVML: ' + str(g.numa_node.error) + '; sysfs: -1/absent'})"
    ]
    if g.cpu_affinity.ok:
        ev.append(f"NVML ideal CPU affinity: {format_cpulist(g.cpu_affinity.value)}")
    data: dict[str, Any] = {
        "gpu_node": node,
        "node_source": src,
        "nodes": {k: format_cpulist(v) for k, v in d.node_cpus.items()},
    }
    pids = [p for p, gl in d.pid_gpus.items() if g.index in gl]
    for p in pids:
        if p in d.pid_errors:
            ev.append(f"pid {p}: {d.pid_errors[p]}")
    placements = [d.placements[p] for p in pids if p in d.placements]
    data["processes"] = [pl.to_json() for pl in placements]
    for pl in placements:
        allowed_nodes = sorted(n for n, c in d.node_cpus.items() if c & pl.cpus_allowed)
        ev.append(
            f"pid {pl.pid} ({pl.name}): Cpus_allowed_list {format_cpulist(pl.cpus_allowed)} (nodes {allowed_nodes}), "
            f"Mems_allowed_list {format_cpulist(pl.mems_allowed)}, numa_maps policy {pl.policies or 'n/a'}, "
            f"pages per node {pl.pages_per_node or 'n/a'}"
        )
    if len(d.node_cpus) <= 1 or node is None:
        return Item(
            "numa",
            PASS,
            "single NUMA node: placement cannot be wrong" if len(d.node_cpus) <= 1 else "GPU reports no NUMA node",
            "Nothing to do.",
            g.index,
            ev,
            data,
        )
    if not placements:
        return Item(
            "numa",
            PASS,
            f"GPU on node {node}; no process to check",
            "Pass --pid (or attach to the engine) to check its CPU and memory placement.",
            g.index,
            ev,
            data,
        )
    worst, title, advice = _placement_verdict(node, placements, d.node_cpus)
    return Item("numa", worst, title, advice, g.index, ev, data)


def _gpu_node(g: GpuFacts, chain: Chain | None) -> tuple[int | None, str | None]:
    """The GPU's NUMA node and where it was read: NVML, else the sysfs numa_node of its PCIe chain."""
    nvml_node = (
        g.numa_node.value if g.numa_node.ok and g.numa_node.value is not None and g.numa_node.value >= 0 else None
    )
    node = nvml_node if nvml_node is not None else (chain.numa_node if chain else None)
    src = "NVML" if nvml_node is not None else ("sysfs numa_node" if node is not None else None)
    return node, src


def _placement_verdict(
    node: int, placements: list[ProcPlacement], node_cpus: dict[int, set[int]]
) -> tuple[str, str, str]:
    """Status, title and advice for processes placed against the GPU's NUMA ``node``: the worst of them decides."""
    near = node_cpus.get(node, set())
    worst, title, advice = PASS, f"processes placed on the GPU's node {node}", "Nothing to do."
    for pl in placements:
        allowed_nodes = sorted(n for n, c in node_cpus.items() if c & pl.cpus_allowed)
        far_pages = sum(v for k, v in pl.pages_per_node.items() if k != node)
        total_pages = sum(pl.pages_per_node.values())
        if not (pl.cpus_allowed & near) or (pl.mems_allowed and node not in pl.mems_allowed):
            worst, title = FAIL, f"NUMA mismatch: pid {pl.pid} is confined away from the GPU's node {node}"
            advice = f"Start the engine with numactl --cpunodebind={node} --membind={node} so its pinned buffers and threads sit next to the GPU."
        elif total_pages and far_pages > total_pages / 2 and worst != FAIL:
            worst, title = WARN, f"most of pid {pl.pid}'s memory ({far_pages}/{total_pages} pages) is off node {node}"
            advice = (
                f"Bind memory with numactl --membind={node}: host<->GPU copies from the far node cross the socket link."
            )
        elif len(allowed_nodes) > 1 and worst == PASS:
            worst, title = WARN, f"pid {pl.pid} may run on nodes {allowed_nodes}, the GPU is on node {node}"
            advice = f"Pin the engine with numactl --cpunodebind={node} --membind={node} (or taskset) to keep it next to the GPU."
    return worst, title, advice
