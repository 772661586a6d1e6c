"""What each inference engine's own settings mean for the bus, and what to change.

Each engine (see :mod:`pcie_tui.engines.registry`) turns the engine facts a recording keeps in its
header (command line, the layout variables of its environment, load-time log lines) into
:class:`EngineFacts`, and answers :func:`advise`: given what held a phase back, the cause in the
engine's terms and the change to make, each resting on a fact the tool saw (a flag, a log line,
a calibrated ceiling). Nothing here reads a process or a socket: it interprets recorded facts.
"""

from __future__ import annotations

from typing import Any

from pcie_tui.engines.base import (
    Advice,
    EngineFacts,
    FindingFacts,
    Layout,
    RequestTiming,
    TimingBasis,
    WeightStream,
    typed,
)

__all__ = [
    "Advice",
    "EngineFacts",
    "FindingFacts",
    "Layout",
    "RequestTiming",
    "TimingBasis",
    "WeightStream",
    "advise",
    "engine_info",
    "facts_for",
    "typed",
]


def engine_info(header_engine: Any, events: Any = ()) -> dict[str, Any] | None:
    """The engine's recorded facts: the header's, updated by each ``engine_ready`` or
    ``engine_reattach`` event's.

    A recorder that attaches while the engine loads writes the header before the load is done;
    when the engine answers, the ``engine_ready`` event carries its facts again, complete (the
    load-time log lines up to "listening", say). A restarted engine the poller reattached to
    carries its own (its flags, the log found for it). Those win; keys only the header has are kept.
    """
    info = dict(header_engine) if isinstance(header_engine, dict) else None
    for ev in events or ():
        kind = ev.get("event") if isinstance(ev, dict) else None
        later = ev.get("engine") if kind in ("engine_ready", "engine_reattach") else None
        if isinstance(later, dict) and (info is None or later.get("kind") in (None, info.get("kind"))):
            info = {**(info or {}), **{k: v for k, v in later.items() if v is not None}}
    return info


def facts_for(engine_info: dict[str, Any] | None) -> EngineFacts | None:
    """Facts of the recorded engine, or None when the recording has none (or a kind nobody registered)."""
    if not isinstance(engine_info, dict):
        return None
    from pcie_tui.engines import registry

    kind = engine_info.get("kind")
    eng = registry.get(kind) if isinstance(kind, str) else None
    return eng.facts(engine_info) if eng is not None else None


def advise(facts: EngineFacts | None, finding: FindingFacts) -> list[Advice]:
    """Causes and fixes for one attribution finding, in the engine's own words."""
    if facts is None:
        return []
    from pcie_tui.engines import registry

    eng = registry.get(facts.kind)
    return eng.advise(facts, finding) if eng is not None else []
