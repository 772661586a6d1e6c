"""Quantiles of plain lists (one implementation, shared with the engines)."""

from __future__ import annotations

from pcie_tui.engines.stats import quantile

__all__ = ["quantile"]
