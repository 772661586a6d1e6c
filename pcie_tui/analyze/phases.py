"""Phase names (:mod:`pcie_tui.engines.phases`) and the one rate format of the analysis."""

from __future__ import annotations

from pcie_tui.analyze.linkmodel import fmt_gbs
from pcie_tui.engines.phases import PHASES

__all__ = ["PHASES", "fmt_rate"]


def fmt_rate(v: float | None) -> str:
    """A rate in bytes/s, one format everywhere: GB/s with one decimal from 1 GB/s, below that
    MB/s or kB/s with 3 significant digits (linkmodel.fmt_gbs)."""
    return fmt_gbs(v)
