"""The verdict summarised per engine phase (the phases themselves: :mod:`pcie_tui.engines.phases`)."""

from __future__ import annotations

from typing import Any

from pcie_tui.analyze.linkmodel import fmt_gbs
from pcie_tui.engines.phases import PHASES
from pcie_tui.model import GpuInfo

__all__ = ["PHASES", "fmt_rate", "phase_line", "phase_verdicts"]

# ---- per-phase verdict summary -------------------------------------------

_BOUND = {"link": "link-bound", "memory": "memory-bound", "compute": "compute-bound", "none": "nothing saturated"}


def fmt_rate(v: float | None) -> str:
    """A rate in bytes/s, one format everywhere: GB/s with one decimal from 1 GB/s, below that
    MB/s or kB/s with 3 significant digits (linkmodel.fmt_gbs)."""
    return fmt_gbs(v)


def phase_line(phase: str, entry: dict[str, Any], link_ceiling_Bps: float | None, dram_basis: str = "DRAM") -> str:
    """One line such as ``prefill: link-bound 84 % of the time (link 45.3 of 63.0 GB/s median), DRAM 5 %``.

    ``entry`` is one value of :meth:`SessionAnalyzer.phase_summary`. The line leads
    with the verdict that held most of the phase; a minority verdict is named after it.
    """
    share = entry.get("verdict_share") or {}
    dom = entry.get("dominant") or "none"
    link_med = (entry.get("link_Bps") or {}).get("median")
    link_util = (entry.get("link_util") or {}).get("median")
    dram = (entry.get("dram_util") or {}).get("median")
    ceiling = f" of {link_ceiling_Bps / 1e9:.1f} GB/s" if link_ceiling_Bps else ""
    link_txt = f"link {fmt_rate(link_med)}{ceiling} median"
    if link_util is not None and not link_ceiling_Bps:
        link_txt += f" ({link_util * 100:.0f} %)"
    dram_txt = f"{dram_basis} {dram * 100:.0f} %" if dram is not None else f"{dram_basis} n/a"
    head = f"{phase}: {_BOUND.get(dom, dom)}"
    if dom != "none":
        head += f" {share.get(dom, 0.0) * 100:.0f} % of the time"
    else:
        head += " most of the time"
    others = [f"{_BOUND[k]} {v * 100:.0f} %" for k, v in share.items() if k not in (dom, "none") and v >= 0.005]
    if others:
        head += " (" + ", ".join(others) + ")"
    ticks = entry.get("ticks", 0)
    return f"{head}; {link_txt}, {dram_txt} median, {ticks} tick{'s' if ticks != 1 else ''}"


def phase_verdicts(analyzer: Any) -> dict[int, dict[str, str]]:
    """Per GPU, per phase: a one-line verdict built from ``SessionAnalyzer.phase_summary``.

    Phases appear in the order loading, prefill, decode, mixed, idle, down,
    then any recording labels.
    """
    from pcie_tui.analyze.verdict import pcie_ceiling_Bps

    out: dict[int, dict[str, str]] = {}
    for index in sorted(analyzer.series):
        summary = analyzer.phase_summary(index)
        info: GpuInfo | None = analyzer.header.gpu(index)
        ceiling, _kind = pcie_ceiling_Bps(info)
        basis = "DRAM busy (proxy)" if analyzer.series[index].memory_proxy else "DRAM"
        order = [p for p in PHASES if p in summary] + sorted(p for p in summary if p not in PHASES)
        out[index] = {p: phase_line(p, summary[p], ceiling, basis) for p in order}
    return out
