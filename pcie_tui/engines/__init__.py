"""What each inference engine's own settings mean for the bus, and what to change.

Each engine (see :mod:`pcie_tui.engines.registry`) turns the engine facts a recording keeps in its
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
    """Facts of the recorded engine, or None when the recording has none (or a kind nobody registered)."""
    if not isinstance(engine_info, dict):
        return None
    from pcie_tui.engines import registry

    kind = engine_info.get("kind")
    eng = registry.get(kind) if isinstance(kind, str) else None
    return eng.facts(engine_info) if eng is not None else None


def advise(facts: EngineFacts | None, finding: dict[str, Any]) -> list[Advice]:
    """Causes and fixes for one finding (``attribution.phase_finding`` output) in the engine's own words."""
    if facts is None:
        return []
    from pcie_tui.engines import registry

    eng = registry.get(facts.kind)
    return eng.advise(facts, finding) if eng is not None else []
