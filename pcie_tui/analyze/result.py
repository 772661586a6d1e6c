"""What the one analysis says, as typed results every surface renders.

:class:`Finding`: for one GPU and one phase, the bound that held most of it, the share of each
bound, the evidence (rates and use as the median of the bound's ticks), the ceilings they were
compared with, and the engine's cause and fix. :class:`Headline`: the answer in two lines and the
finding it rests on. The TUI, ``report`` (text and ``--json``), the Prometheus exporter and
``--plot`` all read these; none of them computes a bound, a share or a ceiling of its own.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from pcie_tui.analyze.attribution import Ceilings
    from pcie_tui.engines.base import Advice

# Every rate and use figure of a finding is this statistic of its bound's ticks (the TUI's "so far"
# and the report's alike).
STAT = "median"


@dataclass
class Finding:
    """One GPU in one phase: what held it back, with the numbers and the ceiling behind it."""

    gpu: int
    phase: str
    duration_s: float
    ticks: int
    bound: str
    bound_s: float
    shares: dict[str, float]
    link_Bps: float | None
    link_of_pinned: float | None
    sm_util: float | None
    dram_util: float | None
    dram_basis: str  # "gpm" | "proxy"
    work_basis: str  # "engine" | "label"
    ceilings: Ceilings
    vram_used_bytes: float | None
    vram_total_bytes: float | None
    transfer_s: float
    transfer_Bps: float | None
    transfer_staged: bool
    whatif_pinned: dict[str, Any] | None = None
    # Why some of its ticks had no bound (the counters they lacked), None where every tick had one.
    unknown_why: str | None = None
    too_short: bool = False  # fewer ticks than attribution.MIN_TICKS_TO_JUDGE: no bound named
    advice: tuple[Advice, ...] = ()
    stat: str = STAT
    evidence: str = ""  # the numbers behind it in words, with the ceiling and its source (answer.evidence_text)
    # Share of the phase this GPU ran with its clocks cut (analyze/heat.py cut_share), None where not.
    clocks_cut: dict[str, Any] | None = None

    @property
    def share(self) -> float:
        """The share of the phase its bound held."""
        return self.shares[self.bound]

    def evidence_json(self) -> dict[str, Any]:
        """The finding without its advice (an engine's ``advise`` reads it as ``engines.FindingFacts``)."""
        out: dict[str, Any] = {
            "gpu": self.gpu,
            "phase": self.phase,
            "duration_s": self.duration_s,
            "ticks": self.ticks,
            "bound": self.bound,
            "bound_s": self.bound_s,
            "shares": dict(self.shares),
            "link_Bps": self.link_Bps,
            "link_of_pinned": self.link_of_pinned,
            "sm_util": self.sm_util,
            "dram_util": self.dram_util,
            "dram_basis": self.dram_basis,
            "work_basis": self.work_basis,
            "stat": self.stat,
            "ceilings": self.ceilings.to_json(),
            "vram_used_bytes": self.vram_used_bytes,
            "vram_total_bytes": self.vram_total_bytes,
            "transfer_s": self.transfer_s,
            "transfer_Bps": self.transfer_Bps,
            "transfer_staged": self.transfer_staged,
            "unknown_why": self.unknown_why,
            "too_short": self.too_short,
            "clocks_cut": self.clocks_cut,
        }
        if self.whatif_pinned is not None:
            out["whatif_pinned"] = self.whatif_pinned
        return out

    def to_json(self) -> dict[str, Any]:
        return self.evidence_json() | {"evidence": self.evidence, "advice": [a.to_json() for a in self.advice]}


@dataclass
class Headline:
    """The answer: what held which phase back with its numbers (line 1), then the fix or the cause."""

    text: str
    phase: str | None
    bound: str
    gpu: int | None
    share: float | None
    cause: str | None = None
    fix: str | None = None
    predicted: dict[str, Any] | None = None
    finding: Finding | None = field(default=None, compare=False)
    # False while a live session is still in that phase (the figures are "so far").
    final: bool = True

    def to_json(self) -> dict[str, Any]:
        return {
            "text": self.text,
            "phase": self.phase,
            "bound": self.bound,
            "gpu": self.gpu,
            "share": self.share,
            "cause": self.cause,
            "fix": self.fix,
            "predicted": self.predicted,
        }


@dataclass
class Answer:
    """The whole answer at one moment: the headline, every finding per GPU, and the engine's facts."""

    headline: Headline
    findings: dict[int, list[Finding]]
    facts: dict[str, Any] | None

    def to_json(self) -> dict[str, Any]:
        return {
            "headline": self.headline.to_json(),
            "findings": {str(g): [f.to_json() for f in fs] for g, fs in self.findings.items()},
            "facts": self.facts,
        }
