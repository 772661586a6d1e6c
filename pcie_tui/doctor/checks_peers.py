"""Doctor's peer checks: P2P access between each GPU pair, NVLink state, and the topology matrix."""

from __future__ import annotations

from typing import Any

from pcie_tui.doctor.items import FAIL, PASS, WARN, Item
from pcie_tui.doctor.nvmlfacts import TOPOLOGY_MEANING, GpuFacts

_FIXABLE_P2P = {"chipset not supported", "IOH topology not supported", "disabled by regkey"}


def check_pair(a: GpuFacts, b: GpuFacts, ab: dict[str, Any], ba: dict[str, Any]) -> Item:
    ev = [
        f"GPU{a.index}->GPU{b.index}: read {ab['read']}, write {ab['write']}, NVLink {ab['nvlink']}",
        f"GPU{b.index}->GPU{a.index}: read {ba['read']}, write {ba['write']}, NVLink {ba['nvlink']}",
    ]
    topo = ab.get("topology")
    if ab.get("nvlinks_to_peer"):
        ev.append(f"{ab['nvlinks_to_peer']} NVLink(s) join them")
    if topo:
        ev.append(f"common ancestor {topo}: {TOPOLOGY_MEANING.get(topo, '')}")
    data = {"a_to_b": ab, "b_to_a": ba}
    bad = [s for s in (ab["read"], ab["write"], ba["read"], ba["write"]) if s != "OK"]
    pair = [a.index, b.index]
    if not bad:
        via = "NVLink" if ab["nvlink"] == "OK" else "PCIe"
        return Item(
            "p2p", PASS, f"GPU{a.index}<->GPU{b.index}: P2P read/write OK over {via}", "Nothing to do.", pair, ev, data
        )
    reason = bad[0]
    if reason in _FIXABLE_P2P:
        advice = {
            "chipset not supported": "A GPU behind the chipset cannot reach its peer directly: move both GPUs to CPU-attached slots.",
            "IOH topology not supported": "The GPUs hang off different root complexes or sockets: put both on one socket's slots.",
            "disabled by regkey": "P2P is disabled in the driver settings (registry key): re-enable it.",
        }[reason]
        status = FAIL
    else:
        advice = (
            "This GPU pair has no peer access (typical of GeForce cards): tensor-parallel all-reduces bounce "
            "through host memory and vLLM's custom all-reduce is off; prefer NVLink, or pipeline parallelism."
        )
        status = WARN
    return Item("p2p", status, f"GPU{a.index}<->GPU{b.index}: no P2P ({reason})", advice, pair, ev, data)


def topology_matrix(gpus: list[GpuFacts], pairs: dict[tuple[int, int], dict[str, Any]]) -> list[list[str]]:
    """``nvidia-smi topo -m``-style cells: X, NV#, PIX, PXB, PHB, NODE, SYS (n/a when NVML would not say)."""
    rows = []
    for a in gpus:
        row = []
        for b in gpus:
            if a.index == b.index:
                row.append("X")
                continue
            p = pairs.get((a.index, b.index), {})
            nv = p.get("nvlinks_to_peer") or 0
            row.append(f"NV{nv}" if nv else (p.get("topology") or "n/a"))
        rows.append(row)
    return rows


def check_nvlink(g: GpuFacts) -> Item:
    if g.nvlinks is None:
        return Item(
            "nvlink",
            PASS,
            "no NVLink (PCIe only)",
            "Nothing to do.",
            g.index,
            [f"nvmlDeviceGetNvLinkState: {g.nvlink_error}"],
            {"links": None},
        )
    active = [ln for ln in g.nvlinks if ln["active"]]
    speed = g.nvlink_speed_MBps.value if g.nvlink_speed_MBps.ok else None
    ev = [
        f"{len(active)} of {len(g.nvlinks)} NVLink(s) active"
        + (f", version {active[0].get('version')}" if active else ""),
        f"link speed (NVML field NVLINK_SPEED_MBPS_COMMON): {f'{speed} MB/s per link' if speed else 'n/a (' + str(g.nvlink_speed_MBps.error) + ')'}",
    ]
    peers = sorted({str(ln["remote_bdf"]) for ln in active if ln.get("remote_bdf")})
    if peers:
        ev.append("peers: " + ", ".join(peers))
    data = {
        "active": len(active),
        "links": g.nvlinks,
        "speed_MBps": speed,
        "total_Bps": speed * 1e6 * len(active) if speed else None,
    }
    if active and len(active) < len(g.nvlinks):
        return Item(
            "nvlink",
            WARN,
            f"{len(g.nvlinks) - len(active)} of {len(g.nvlinks)} NVLinks down",
            "Reseat the NVLink bridge: a partly trained bridge carries a fraction of its bandwidth.",
            g.index,
            ev,
            data,
        )
    title = f"{len(active)} NVLink(s) active" if active else "NVLink present, no link active (no bridge)"
    return Item("nvlink", PASS, title, "Nothing to do.", g.index, ev, data)
