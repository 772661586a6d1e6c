"""The one analysis every surface renders: live, replay, ``report``, ``export`` and ``--plot``.

:class:`Analysis` holds the :class:`~pcie_tui.analyze.session.SessionAnalyzer` (verdicts, events,
the per-tick series), the engine's facts, and the session's phase rule, and answers with typed
results (:mod:`pcie_tui.analyze.result`). It is fed tick by tick (live, replay, export) or in
chunks (report, a replay seek); the same ticks give the same answer either way. Live, the answer
is "so far"; once the source has ended (:meth:`finish`) it is exactly what ``report`` prints.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

from pcie_tui.analyze.answer import answer
from pcie_tui.analyze.attribution import BOUNDS, gpu_ceilings, tick_bounds, transfer_floors_Bps
from pcie_tui.analyze.columns import from_samples
from pcie_tui.analyze.result import Answer
from pcie_tui.analyze.session import SessionAnalyzer
from pcie_tui.analyze.verdict import DEFAULT_THRESHOLDS, Thresholds
from pcie_tui.core.model import Sample, SessionHeader
from pcie_tui.engines import EngineFacts, engine_info, facts_for
from pcie_tui.recording.timeline import BlockColumns

FACT_EVENTS = ("engine_ready", "engine_reattach")  # a source's events that bring the engine's facts


class Analysis:
    """Feed ticks in time order; ask for :meth:`answer` (the headline and every finding)."""

    def __init__(
        self, header: SessionHeader, events: Sequence[Any] = (), thresholds: Thresholds = DEFAULT_THRESHOLDS
    ) -> None:
        self.header = header
        self.thresholds = thresholds
        # The engine's facts: the header's, completed by the recording's engine_ready events
        # (a replay knows them all; live ones arrive through note_events).
        self.engine_info: dict[str, Any] | None = engine_info(header.engine, events)
        self.facts: EngineFacts | None = facts_for(self.engine_info)
        self.session = SessionAnalyzer(header, thresholds)
        # a long session's summarised ticks keep the side of the transfer floor they fell on
        self.session.rate_cuts = lambda index: transfer_floors_Bps(gpu_ceilings(self.session, index))
        self.ended = False
        self._answer: tuple[Any, Answer] | None = None

    # ---- feeding ------------------------------------------------------------

    def feed(self, s: Sample) -> None:
        self.session.feed(s)

    def feed_all(self, samples: Iterable[Sample], chunk: int | None = None) -> None:
        self.session.feed_all(samples, chunk)

    def feed_chunk(self, samples: Sequence[Sample]) -> list[str | None]:
        """``samples`` as one chunk (the same as one by one, for less); each tick's phase by the session's rule."""
        ch = from_samples(samples)
        self.session.feed_chunk(ch)
        return ch.phase

    def feed_rows(self, rows: Sequence[dict[str, Any]], swept: BlockColumns | None = None) -> None:
        """Raw tick dicts (``swept``: the columns the reader's check already took from them)."""
        self.session.feed_rows(rows, swept=swept)

    def finish(self) -> None:
        """The source ended: close open events; the answer is final from now on."""
        if not self.ended:
            self.ended = True
            self.session.finish()

    def recorded_events(self, events: Sequence[Any]) -> None:
        """A whole recording's events (a report that read them as it went): the engine's facts are the
        header's completed by them, as if they had been known from the start."""
        self.engine_info = engine_info(self.header.engine, events)
        self.facts = facts_for(self.engine_info)
        self._answer = None

    def note_events(self, events: Sequence[Any]) -> bool:
        """Live events of the source: an engine that became ready or was reattached brings its
        complete facts (the bounds and fixes follow them). True when the facts changed."""
        if not any(isinstance(e, dict) and e.get("event") in FACT_EVENTS for e in events):
            return False
        self.engine_info = engine_info(self.engine_info, events)
        self.facts = facts_for(self.engine_info)
        self._answer = None
        return True

    # ---- what it says -------------------------------------------------------

    @property
    def phase(self) -> str | None:
        """The phase of the last tick fed (the engine's, else the recording's label)."""
        return self.session.phase

    def answer(self) -> Answer:
        """The headline and the findings over every tick fed so far (kept until the next feed).

        While the session runs, the headline names the current phase when it is work; once it has
        ended, the phase that held the run back longest, exactly as ``report`` does.
        """
        key = (self.session.version, self.ended, id(self.facts))  # the version moves with every feed
        if self._answer is None or self._answer[0] != key:
            phase = None if self.ended else self.phase
            ans = answer(self.header, self.session, facts=self.facts, phase=phase, final=self.ended)
            self._answer = (key, ans)
        return self._answer[1]

    def bound_now(self, index: int) -> str | None:
        """What bound GPU ``index`` in the last tick fed (None before its first reading)."""
        codes = tick_bounds(self.session, index, self.facts)
        return BOUNDS[int(codes[-1])] if codes.size else None
