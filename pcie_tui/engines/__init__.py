"""What each inference engine's own settings mean for the bus, and what to change.

One module per engine (``llamacpp``, ``vllm``) turns the engine facts a recording keeps in its
header (command line, the layout variables of its environment, load-time log lines) into
:class:`EngineFacts`, and answers :func:`advise`: given what held a phase back, the cause in the
engine's terms and the change to make, each resting on a fact the tool saw (a flag, a log line,
a calibrated ceiling). Nothing here reads a process or a socket: it interprets recorded facts.
"""

from __future__ import annotations

from typing import Any

from pcie_tui.engines.base import Advice, EngineFacts, typed

__all__ = ["Advice", "EngineFacts", "advise", "facts_for", "typed"]


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
