"""The vocabulary of doctor's checks: a status, an :class:`Item` (one line of the report) and :class:`DoctorData`."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from pcie_tui.core import units
from pcie_tui.doctor.load import LoadReadings
from pcie_tui.doctor.numa import ProcPlacement
from pcie_tui.doctor.nvmlfacts import GpuFacts, Read
from pcie_tui.doctor.topology import Chain

PASS, WARN, FAIL = "pass", "warn", "fail"


@dataclass
class Item:
    check: str
    status: str
    title: str
    advice: str
    gpu: int | list[int] | None = None
    evidence: list[str] = field(default_factory=list)
    data: dict[str, Any] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        return {
            "check": self.check,
            "gpu": self.gpu,
            "status": self.status,
            "title": self.title,
            "evidence": self.evidence,
            "advice": self.advice,
            "data": self.data,
        }


@dataclass
class DoctorData:
    gpus: list[GpuFacts]
    pairs: dict[tuple[int, int], dict[str, Any]]
    chains: dict[int, Chain]
    load: LoadReadings
    counters_after: dict[int, dict[str, Read]]
    node_cpus: dict[int, set[int]]
    placements: dict[int, ProcPlacement]  # pid -> placement
    pid_gpus: dict[int, list[int]]  # pid -> GPU indices it uses (all GPUs for --pid when unknown)
    pid_errors: dict[int, str] = field(default_factory=dict)


# A link rate with its unit (GB/s; MB/s or kB/s below 1 GB/s; n/a when unknown): the one rate format.
gb = units.rate


def link_name(gen: Any, width: Any) -> str:
    """``Gen4 x16``; ``?`` for a part NVML or sysfs did not give."""
    return f"Gen{gen if gen is not None else '?'} x{width if width is not None else '?'}"
