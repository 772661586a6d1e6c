"""The PCIe bridge chain above each GPU, read from sysfs.

``realpath /sys/bus/pci/devices/<bdf>`` gives the path from the host bridge
(``pci0000:00``) through every root port and switch port down to the device.
Each device's ``current_link_*`` describes the link to its parent (a root
port's describes the link to its child), so the chain gives one link per hop;
the narrowest hop is the real ceiling, and every device below that hop shares
it.

Classification (heuristics, each reported with its evidence):

* ``cpu``: the GPU's root port is a CPU root port and no chipset sits between.
* ``switch``: a PCIe switch (upstream + downstream port pair) with an uplink
  at least as wide as the GPU's own link.
* ``chipset``: behind an Intel PCH root port (bus 0, device 0x1b/0x1c/0x1d of
  vendor 0x8086, whose DMI uplink to the CPU is invisible in sysfs) or behind an
  AMD chipset (a 0x1022 switch below a CPU root port, known chipset ids or an
  x4-or-narrower uplink), or any switch whose uplink is x4 or narrower.
* ``direct``: on the root bus with no bridge visible (VMs and integrated
  devices): the physical chain is hidden from this OS.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pcie_tui.core.model import pcie_capacity_Bps
from pcie_tui.doctor.sysfs_pci import BDF_RE, PciNode, device_path, normalize_bdf, read_node, walk_nodes

VENDOR_NVIDIA = 0x10DE
VENDOR_INTEL = 0x8086
VENDOR_AMD = 0x1022
# Switch silicon makers (PLX/Broadcom, Microchip/Microsemi, Pericom/Diodes, ASMedia).
SWITCH_VENDORS = {0x10B5: "Broadcom/PLX", 0x1000: "Broadcom", 0x11F8: "Microchip", 0x12D8: "Pericom", 0x1B21: "ASMedia"}
# AMD chipset (Promontory) switch ports: X570/B550 (Matisse), 400-series, 600/800-series (Promontory 21).
AMD_CHIPSET_DEVICE_IDS = {0x57AD, 0x57A3, 0x57A4, 0x43C6, 0x43C7, 0x43E9, 0x43EA, 0x43EB, 0x43F4, 0x43F5}
# Intel client PCH root ports sit at these device numbers on bus 0.
INTEL_PCH_ROOT_SLOTS = {0x1B, 0x1C, 0x1D}


@dataclass(frozen=True, slots=True)
class Hop:
    """The link between ``upper`` and ``lower`` (lower = the device one step closer to the GPU)."""

    upper: PciNode
    lower: PciNode
    role: str  # "root port -> device", "root port -> switch", "switch -> device", ...
    cur_gen: int | None
    cur_width: int | None
    max_gen: int | None
    max_width: int | None

    @property
    def cur_Bps(self) -> float | None:
        return pcie_capacity_Bps(self.cur_gen, self.cur_width)

    @property
    def max_Bps(self) -> float | None:
        return pcie_capacity_Bps(self.max_gen, self.max_width)

    def label(self) -> str:
        return f"{self.upper.bdf} -> {self.lower.bdf}"

    def to_json(self) -> dict[str, Any]:
        return {
            "upper": self.upper.bdf,
            "lower": self.lower.bdf,
            "role": self.role,
            "cur_gen": self.cur_gen,
            "cur_width": self.cur_width,
            "max_gen": self.max_gen,
            "max_width": self.max_width,
            "cur_Bps": self.cur_Bps,
            "max_Bps": self.max_Bps,
        }


@dataclass
class Chain:
    """Everything sysfs says about where one device hangs."""

    bdf: str
    found: bool
    nodes: list[PciNode] = field(default_factory=list)  # root port first, device last
    hops: list[Hop] = field(default_factory=list)
    attach: str = "unknown"  # cpu | switch | chipset | direct | unknown
    evidence: list[str] = field(default_factory=list)
    narrowest: Hop | None = None
    # Devices (other than the GPU's own functions) below the narrowest hop.
    sharers: list[PciNode] = field(default_factory=list)
    numa_node: int | None = None
    hidden_uplink: str | None = None  # e.g. Intel DMI: exists but sysfs cannot show it

    @property
    def device(self) -> PciNode | None:
        return self.nodes[-1] if self.nodes else None

    def to_json(self) -> dict[str, Any]:
        return {
            "bdf": self.bdf,
            "found": self.found,
            "realpath": self.nodes[-1].path if self.nodes else None,
            "attach": self.attach,
            "evidence": self.evidence,
            "chain": [n.to_json() for n in self.nodes],
            "hops": [h.to_json() for h in self.hops],
            "narrowest": self.narrowest.to_json() if self.narrowest else None,
            "sharers": [{"bdf": n.bdf, "what": n.kind_name} for n in self.sharers],
            "numa_node": self.numa_node,
            "hidden_uplink": self.hidden_uplink,
        }


def _min(a: int | None, b: int | None) -> int | None:
    if a is None:
        return b
    if b is None:
        return a
    return min(a, b)


def read_chain(sysfs_root: str | Path, bdf: str) -> Chain:
    """Walk from the host bridge down to ``bdf`` and classify the attachment."""
    bdf = normalize_bdf(bdf)
    chain = Chain(bdf=bdf, found=False)
    real = device_path(sysfs_root, bdf)
    if real is None:
        chain.evidence.append(f"{bdf} not found under {Path(sysfs_root) / 'bus/pci/devices'}")
        return chain
    chain.found = True
    parts: list[Path] = []
    p = real
    while BDF_RE.match(p.name):
        parts.append(p)
        p = p.parent
    parts.reverse()
    chain.nodes = [read_node(x) for x in parts]
    dev = chain.nodes[-1]
    chain.numa_node = dev.numa_node if dev.numa_node is not None and dev.numa_node >= 0 else None
    _build_hops(chain)
    _classify(chain)
    _find_sharers(chain, Path(parts[0]).parent)
    return chain


def _build_hops(chain: Chain) -> None:
    """One physical link per pair: root -> X, then (switch down -> X) per switch level.

    Nodes alternate root port, (switch upstream, switch downstream)*, device; the
    upstream -> downstream step inside a switch is not a link. The link state is
    read from the lower end (a root/downstream port mirrors it).
    """
    nodes = chain.nodes
    last = len(nodes) - 1
    for i in range(1, len(nodes), 2):
        upper, lower = nodes[i - 1], nodes[i]
        upper_role = "root port" if i == 1 else "switch downstream port"
        lower_role = "device" if i == last else "switch upstream port"
        chain.hops.append(
            Hop(
                upper,
                lower,
                f"{upper_role} -> {lower_role}",
                lower.cur_gen if lower.cur_gen is not None else upper.cur_gen,
                lower.cur_width if lower.cur_width is not None else upper.cur_width,
                _min(upper.max_gen, lower.max_gen),
                _min(upper.max_width, lower.max_width),
            )
        )
    known = [h for h in chain.hops if (h.max_Bps or h.cur_Bps) is not None]
    if known:
        # Narrowest by what the link can do (max: idle links train down), the hop
        # closest to the CPU winning ties because it is the one shared.
        chain.narrowest = min(known, key=lambda h: h.max_Bps or h.cur_Bps or 0.0)


def _classify(chain: Chain) -> None:
    nodes = chain.nodes
    ev = chain.evidence
    if len(nodes) == 1:
        chain.attach = "direct"
        ev.append(
            f"{nodes[0].bdf} sits on the root bus with no bridge visible (a VM or an integrated device): "
            "the physical slot wiring is hidden from this OS"
        )
        return
    root = nodes[0]
    switches = [n for n in nodes[1:-1] if n.is_bridge]
    if root.vendor == VENDOR_INTEL and root.bus == 0 and root.slot in INTEL_PCH_ROOT_SLOTS:
        chain.attach = "chipset"
        ev.append(
            f"root port {root.bdf} [{root.vendor:04x}:{root.device or 0:04x}] is an Intel PCH port "
            f"(device 0x{root.slot:02x} on bus 0), not a CPU port"
        )
        chain.hidden_uplink = "Intel DMI (PCH -> CPU), typically Gen3 x4 or Gen4 x8, shared by all chipset devices"
        return
    for n in switches:
        if n.vendor == VENDOR_AMD and n.device in AMD_CHIPSET_DEVICE_IDS:
            chain.attach = "chipset"
            ev.append(f"bridge {n.bdf} [{n.vendor:04x}:{n.device:04x}] is an AMD chipset (Promontory) port")
            return
    if switches:
        up = nodes[1]
        up_hop = chain.hops[0] if chain.hops else None
        w = up_hop.max_width if up_hop else None
        if w is not None and w <= 4:
            chain.attach = "chipset"
            ev.append(
                f"bridge {up.bdf} [{up.vendor or 0:04x}:{up.device or 0:04x}] hangs off root port {root.bdf} "
                f"over an x{w} uplink: a chipset or x4 switch"
            )
            return
        chain.attach = "switch"
        vend = SWITCH_VENDORS.get(up.vendor or -1, f"vendor 0x{up.vendor or 0:04x}")
        ev.append(f"PCIe switch {up.bdf} ({vend}) between root port {root.bdf} and the GPU")
        return
    chain.attach = "cpu"
    ev.append(f"root port {root.bdf} [{root.vendor or 0:04x}:{root.device or 0:04x}] connects the GPU directly")


def _find_sharers(chain: Chain, host_bridge_dir: Path) -> None:
    """Every device below the shared bottleneck that is not one of this GPU's own functions."""
    dev = chain.device
    if dev is None:
        return
    if chain.hidden_uplink is not None:
        # Intel PCH: the shared uplink is DMI; every device behind any PCH port and the
        # PCH's own functions (USB, SATA, LPC... at device >= 0x14 on bus 0) share it.
        nodes = [n for n in walk_nodes(host_bridge_dir) if _is_pch_side(n)]
    elif chain.narrowest is not None:
        nodes = walk_nodes(Path(chain.narrowest.upper.path))
    else:
        return
    chain.sharers = [n for n in nodes if not _same_device(n, dev) and not n.is_bridge]


def _is_pch_side(n: PciNode) -> bool:
    if n.vendor == VENDOR_INTEL and n.bus == 0 and n.slot >= 0x14:
        return True
    for part in Path(n.path).parts:
        if BDF_RE.match(part) and part != n.bdf:
            _, bus, devfn = part.split(":")
            if int(bus, 16) == 0 and int(devfn.split(".")[0], 16) in INTEL_PCH_ROOT_SLOTS:
                return True
    return False


def _same_device(a: PciNode, b: PciNode) -> bool:
    """Functions of one device (GPU + its audio function) share its link; they are not 'others'."""
    return a.bdf.rsplit(".", 1)[0] == b.bdf.rsplit(".", 1)[0]
