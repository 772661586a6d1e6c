"""PCIe AER error counters of one device from sysfs (``aer_dev_correctable``, ``_nonfatal``, ``_fatal``).

Each file lists counts per error type and a total since boot (Linux drivers/pci/pcie/aer.c)::

    RxErr 0
    BadTLP 3
    ...
    TOTAL_ERR_COR 3

The total is read; a file without one gives the sum of its lines. Where the kernel has no AER for
the device (no file, or it cannot be read: a VM, a container), the counts are absent, never 0.
"""

from __future__ import annotations

from pathlib import Path

SYSFS_DEVICES = "/sys/bus/pci/devices"
AER_FILES = {"correctable": "aer_dev_correctable", "nonfatal": "aer_dev_nonfatal", "fatal": "aer_dev_fatal"}


def sysfs_bdf(bus_id: str) -> str:
    """NVML's ``00000000:01:00.0`` as sysfs names it: ``0000:01:00.0`` (lower case)."""
    parts = bus_id.strip().lower().split(":")
    if len(parts) == 3 and len(parts[0]) > 4:
        parts[0] = parts[0][-4:]
    if len(parts) == 2:
        parts.insert(0, "0000")
    return ":".join(parts)


def parse_aer(text: str) -> int | None:
    """The TOTAL_ERR_* count of one AER file's text, else the sum of its counts (None: no count in it)."""
    total = None
    summed = 0
    seen = False
    for line in text.splitlines():
        parts = line.split()
        if len(parts) != 2 or not parts[1].isdigit():
            continue
        if parts[0].startswith("TOTAL_ERR"):
            total = int(parts[1])
        else:
            summed += int(parts[1])
            seen = True
    return total if total is not None else (summed if seen else None)


def read_aer(bus_id: str, root: str | Path = SYSFS_DEVICES) -> dict[str, int]:
    """``{"correctable": n, "nonfatal": n, "fatal": n}`` for the files that could be read (maybe none)."""
    base = Path(root) / sysfs_bdf(bus_id)
    out: dict[str, int] = {}
    for kind, name in AER_FILES.items():
        try:
            text = (base / name).read_text()
        except (OSError, UnicodeDecodeError):
            continue
        v = parse_aer(text)
        if v is not None:
            out[kind] = v
    return out
