"""What each inference engine's own settings mean for the bus, and what to change.

One module per engine (``llamacpp``, ``vllm``) turns the engine facts a recording keeps in its
header (command line, the layout variables of its environment, load-time log lines) into
:class:`EngineFacts`, and answers :func:`advise`: given what held a phase back, the cause in the
engine's terms and the change to make, each resting on a fact the tool saw (a flag, a log line,
a calibrated ceiling). Nothing here reads a process or a socket: it interprets recorded facts.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any


@dataclass(frozen=True)
class EngineFacts:
    """Where an engine keeps its weights and caches, as its flags and log say."""

    kind: str
    # Weights kept in host memory and what put them there, e.g. "FFN weights of 12 layers (--n-cpu-ffn 12)".
    host_weights: str | None = None
    # Whether those host weights sit in pinned (page-locked, CUDA-registered) memory: True, False, or None if unknown.
    host_pinned: bool | None = None
    # Why pinned or not, in the engine's words, e.g. "load mode auto (mmap: pageable)".
    host_memory_why: str | None = None
    kv_on_host: str | None = None  # e.g. "-nkvo: KV cache in host memory"
    ubatch: int | None = None
    tensor_parallel: int | None = None
    flags: dict[str, Any] = field(default_factory=dict)  # the parsed flags, for evidence
    log_evidence: tuple[str, ...] = ()  # load-time log lines that bear on the bus


@dataclass(frozen=True)
class Advice:
    """The cause of a finding in the engine's terms and what to change (None when nothing the data supports)."""

    cause: str
    fix: str | None
    evidence: tuple[str, ...] = ()
    # The cause in a few words, for the headline.
    short: str | None = None
    # The change a fix is predicted to make, when the data can price it.
    predicted: dict[str, Any] | None = None

    def to_json(self) -> dict[str, Any]:
        return {
            "cause": self.cause,
            "short": self.short,
            "fix": self.fix,
            "evidence": list(self.evidence),
            "predicted": self.predicted,
        }


def typed(d: dict[str, Any], key: str, typ: type, default: Any) -> Any:
    """``d[key]`` when it is a ``typ`` (recorded facts can be anything), else ``default``."""
    v = d.get(key)
    return v if isinstance(v, typ) and not (typ is int and isinstance(v, bool)) else default


def facts_for(engine_info: dict[str, Any] | None) -> EngineFacts | None:
    """Facts of the recorded engine, or None when the recording has none."""
    if not isinstance(engine_info, dict):
        return None
    kind = engine_info.get("kind")
    if kind == "llamacpp":
        from pcie_tui.engines import llamacpp

        return llamacpp.facts(engine_info)
    if kind == "vllm":
        from pcie_tui.engines import vllm

        return vllm.facts(engine_info)
    return None


def advise(facts: EngineFacts | None, finding: dict[str, Any]) -> list[Advice]:
    """Causes and fixes for one finding (``attribution.phase_finding`` output) in the engine's own words."""
    if facts is None:
        return []
    if facts.kind == "llamacpp":
        from pcie_tui.engines import llamacpp

        return llamacpp.advise(facts, finding)
    if facts.kind == "vllm":
        from pcie_tui.engines import vllm

        return vllm.advise(facts, finding)
    return []
