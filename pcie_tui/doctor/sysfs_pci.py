"""PCI functions as sysfs describes them: ids, class, link state, NUMA node.

``/sys/bus/pci/devices/<bdf>`` links to the function's real directory, below
its host bridge and every bridge above it; each directory holds ``vendor``,
``device``, ``class``, ``current_link_speed``/``_width``,
``max_link_speed``/``_width`` and ``numa_node``. :mod:`pcie_tui.doctor.topology`
builds the bridge chain above a GPU from these.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

# GT/s per lane -> PCIe generation.
_GTS_TO_GEN = {2.5: 1, 5.0: 2, 8.0: 3, 16.0: 4, 32.0: 5, 64.0: 6}

CLASS_BRIDGE_PCI = 0x0604
CLASS_BRIDGE_ISA = 0x0601

_CLASS_NAMES = {
    0x0106: "SATA controller",
    0x0108: "NVMe SSD",
    0x0200: "Ethernet controller",
    0x0280: "Wi-Fi/network controller",
    0x0300: "VGA/GPU",
    0x0302: "3D controller (GPU)",
    0x0403: "audio device",
    0x0600: "host bridge",
    0x0601: "ISA bridge (chipset LPC)",
    0x0604: "PCI bridge",
    0x0C03: "USB controller",
    0x0C05: "SMBus controller",
}

BDF_RE = re.compile(r"^[0-9a-fA-F]{4}:[0-9a-fA-F]{2}:[0-9a-fA-F]{2}\.[0-7]$")


def normalize_bdf(bus_id: str) -> str:
    """NVML's ``00000000:01:00.0`` -> sysfs ``0000:01:00.0`` (lower case)."""
    b = bus_id.strip().lower()
    parts = b.split(":")
    if len(parts) == 3 and len(parts[0]) > 4:
        parts[0] = parts[0][-4:]
    b = ":".join(parts)
    if len(parts) == 2:
        b = "0000:" + b
    return b


def parse_link_speed(text: str | None) -> int | None:
    """``"16.0 GT/s PCIe"`` / ``"8 GT/s"`` -> 4 / 3; unknown -> None."""
    if not text:
        return None
    m = re.match(r"\s*([0-9.]+)\s*GT/s", text)
    if not m:
        return None
    return _GTS_TO_GEN.get(float(m.group(1)))


def _read(path: Path) -> str | None:
    try:
        return path.read_text().strip()
    except OSError:
        return None


def _read_hex(path: Path) -> int | None:
    v = _read(path)
    try:
        return int(v, 16) if v else None
    except ValueError:
        return None


def _read_int(path: Path) -> int | None:
    v = _read(path)
    try:
        return int(v) if v is not None else None
    except ValueError:
        return None


@dataclass(frozen=True, slots=True)
class PciNode:
    """One PCI function as sysfs describes it."""

    bdf: str
    path: str  # real path under the sysfs root
    vendor: int | None
    device: int | None
    class_code: int | None  # 24-bit class/subclass/prog-if
    cur_gen: int | None
    cur_width: int | None
    max_gen: int | None
    max_width: int | None
    numa_node: int | None

    @property
    def base_class(self) -> int | None:
        return self.class_code >> 8 if self.class_code is not None else None

    @property
    def is_bridge(self) -> bool:
        return self.base_class == CLASS_BRIDGE_PCI

    @property
    def bus(self) -> int:
        return int(self.bdf.split(":")[1], 16)

    @property
    def slot(self) -> int:
        return int(self.bdf.split(":")[2].split(".")[0], 16)

    @property
    def kind_name(self) -> str:
        bc = self.base_class
        name = _CLASS_NAMES.get(bc, f"class 0x{bc:04x}") if bc is not None else "unknown class"
        ids = f"{self.vendor or 0:04x}:{self.device or 0:04x}"
        return f"{name} [{ids}]"

    def to_json(self) -> dict[str, Any]:
        return {
            "bdf": self.bdf,
            "vendor": f"0x{self.vendor:04x}" if self.vendor is not None else None,
            "device": f"0x{self.device:04x}" if self.device is not None else None,
            "class": f"0x{self.class_code:06x}" if self.class_code is not None else None,
            "what": self.kind_name,
            "cur_gen": self.cur_gen,
            "cur_width": self.cur_width,
            "max_gen": self.max_gen,
            "max_width": self.max_width,
        }


def read_node(path: Path) -> PciNode:
    return PciNode(
        bdf=path.name,
        path=str(path),
        vendor=_read_hex(path / "vendor"),
        device=_read_hex(path / "device"),
        class_code=_read_hex(path / "class"),
        cur_gen=parse_link_speed(_read(path / "current_link_speed")),
        cur_width=_positive(_read_int(path / "current_link_width")),
        max_gen=parse_link_speed(_read(path / "max_link_speed")),
        max_width=_positive(_read_int(path / "max_link_width")),
        numa_node=_read_int(path / "numa_node"),
    )


def _positive(v: int | None) -> int | None:
    return v if v is not None and v > 0 else None


def device_path(sysfs_root: str | Path, bdf: str) -> Path | None:
    """Resolve ``<root>/bus/pci/devices/<bdf>`` to its real directory, or None."""
    link = Path(sysfs_root) / "bus" / "pci" / "devices" / normalize_bdf(bdf)
    if not link.exists():
        return None
    return Path(os.path.realpath(link))


def walk_nodes(top: Path) -> list[PciNode]:
    """Every PCI function below the directory ``top``, depth first in name order."""
    out: list[PciNode] = []
    try:
        entries = sorted(top.iterdir())
    except OSError:
        return out
    for e in entries:
        if BDF_RE.match(e.name) and e.is_dir() and not e.is_symlink():
            out.append(read_node(e))
            out.extend(walk_nodes(e))
    return out
