"""Phase names (:mod:`pcie_tui.engines.phases`); rates are formatted by :mod:`pcie_tui.core.units`."""

from __future__ import annotations

from pcie_tui.engines.phases import PHASES

__all__ = ["PHASES"]
