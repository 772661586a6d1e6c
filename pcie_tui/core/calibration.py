"""Measured link ceilings: ``pcie-tui calibrate`` writes them, the monitor reads them.

This module only stores and looks entries up; the measuring is
:mod:`pcie_tui.doctor.calibrate` (it needs the copy backends).

Stored per host in ``$XDG_CONFIG_HOME/pcie-tui/calibration.json`` (default
``~/.config``), keyed by GPU UUID, with the link's gen x width at calibration.
Each direction keeps the timed payload rate of pinned copies (``payload_Bps``)
and what the GPU's own PCIe counter read during them (``counter_Bps``: GPM
``PCIE_RX/TX_PER_SEC`` where supported, and ``nvmlDeviceGetPcieThroughput``).
The counter includes protocol overhead (~5-8 % above payload on the H200), so
the monitor, which shows the counter, divides by the counter's saturated value.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

FORMAT = "pcie-tui/calibration"


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
