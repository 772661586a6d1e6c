"""The link's ceiling: the one denominator of every "% of the link" pcie-tui shows.

A :class:`Ceiling` is what the link's counter reads when the link is full, per direction, for one
kind of host memory (pinned or pageable), with where that number came from:

``calibrated``  ``pcie-tui calibrate`` measured it on this GPU (a saturating copy, counter reading);
``default``     no calibration: a share of the theoretical rate of the link's generation x width
                (:data:`DEFAULT_PINNED_FRACTION`), or for pageable copies the rate measured on the
                project's H200 (:data:`DEFAULT_PAGEABLE_Bps`);
``observed``    the link read more than that: the highest reading so far is the ceiling, so nothing
                ever reads above 100 % of it (and ``pcie-tui calibrate`` measures the link's own);
``unknown``     no link facts at all.

It is chosen in one place (:func:`pinned_ceiling`, :func:`pageable_ceiling`) and every surface (the
verdict's link share, the attribution, the what-if, the TUI, report, the exporter and the plot) uses
it. The theoretical rate stays a spec fact (shown as such), never a second denominator.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from pcie_tui.core.model import GpuInfo, pcie_capacity_Bps
from pcie_tui.core.units import rate

# What a PCIe counter reads at saturation, as a share of the link's theoretical rate, when this link
# was not calibrated: the H200's Gen5 x16 read 56.7-59.4 of 63.0 GB/s on saturating pinned copies
# (0.90-0.94; calibrated 60.2). The lower end: a reading above it hands over to the observed ceiling.
# The what-if prices another link's reachable rate with the same share.
DEFAULT_PINNED_FRACTION = 0.90
# Pageable host->device copies on the project's H200 (pcie-tui calibrate, 2026-12-03: counter
# 6.8 GB/s, payload 6.1 GB/s). Staged copies are held by host memcpy more than by the link, so
# this is a fair guess on other machines too; calibrate to know.
DEFAULT_PAGEABLE_Bps = 6.8e9
SOURCES = ("calibrated", "default", "observed", "unknown")


@dataclass(frozen=True)
class Ceiling:
    """A link ceiling per direction (bytes/s, counter reading) for one kind of host memory."""

    Bps: float | None
    memory: str  # "pinned" | "pageable"
    source: str  # one of SOURCES
    detail: str  # where it came from, in words
    theoretical_Bps: float | None = None  # the spec rate of the link it belongs to (a fact, not a denominator)

    def share(self, rate_Bps: float | None) -> float | None:
        """``rate_Bps`` as a fraction of this ceiling (None where either is unknown)."""
        return rate_Bps / self.Bps if rate_Bps is not None and self.Bps else None


def _link_words(info: GpuInfo | None, gen: int | None, width: int | None) -> str:
    if gen is None and info is not None:
        gen, width = info.link.gen, info.link.width
    return f"Gen{gen} x{width}" if gen else "the link"


def pinned_ceiling(
    info: GpuInfo | None, gen: int | None = None, width: int | None = None, observed_Bps: float | None = None
) -> Ceiling:
    """The PCIe ceiling of GPU ``info`` for pinned (saturating) copies, per direction.

    ``gen``/``width``: the link as a tick trained it (links retrain), else the header's. A calibrated
    ceiling holds unless the link is now narrower than when it was measured. ``observed_Bps``: the
    highest PCIe reading so far at that gen x width; above the ceiling, it becomes the ceiling.
    """
    theo = pcie_capacity_Bps(gen, width) if gen is not None and width is not None else None
    if theo is None and info is not None:
        theo = info.link.capacity_Bps or info.link.max_capacity_Bps
    measured = info.link.measured_Bps if info is not None else None
    words = _link_words(info, gen, width)
    if measured and (theo is None or measured <= theo):
        base = Ceiling(measured, "pinned", "calibrated", "calibrated pinned", theo)
    elif theo:
        base = Ceiling(
            theo * DEFAULT_PINNED_FRACTION, "pinned", "default",
            f"default: {DEFAULT_PINNED_FRACTION:.2f} x theoretical {words}", theo,
        )  # fmt: skip
    else:
        return Ceiling(observed_Bps or None, "pinned", "observed" if observed_Bps else "unknown",
                       "observed: the highest reading (link unknown)" if observed_Bps else "unknown link", None)  # fmt: skip
    if observed_Bps is not None and base.Bps is not None and observed_Bps > base.Bps:
        return Ceiling(
            observed_Bps, "pinned", "observed",
            f"observed: highest reading, above the {base.source} {rate(base.Bps)}", theo,
        )  # fmt: skip
    return base


def pageable_ceiling(info: GpuInfo | None, pinned: Ceiling) -> Ceiling:
    """The ceiling of copies out of pageable (staged) host memory."""
    measured = info.link.measured_pageable_Bps if info is not None else None
    if measured:
        return Ceiling(measured, "pageable", "calibrated", "calibrated pageable", pinned.theoretical_Bps)
    rate = min(DEFAULT_PAGEABLE_Bps, pinned.Bps) if pinned.Bps else DEFAULT_PAGEABLE_Bps
    return Ceiling(
        rate, "pageable", "default", "default: pageable copies on the project's H200 (run pcie-tui calibrate)",
        pinned.theoretical_Bps,
    )  # fmt: skip


def to_json(c: Ceiling) -> dict[str, Any]:
    return {"Bps": c.Bps, "memory": c.memory, "source": c.source, "detail": c.detail}
