"""Old events folded into counts, so a day-long live session's events stay bounded (issue 25).

A session keeps every event whole while it is new: a saturation event (:class:`~pcie_tui.analyze.verdict.Event`)
until it ended before a GPU's oldest exact tick (:mod:`pcie_tui.analyze.retire`), a throttled stretch until it
ended before the session's tick :data:`~pcie_tui.analyze.retire.EXACT_TICKS` back. Past that, the
:data:`KEEP_LONGEST` longest old ones of a GPU stay whole (the report lists them, as it lists the newest); the
rest are **folded**: per kind (a saturation event's resource and phase; a stretch's reason and phase) their count,
ticks, seconds, first start and last end, peaks, and what a mean needs. Sums are kept exactly (as fractions of
the floats added), so a tally does not depend on the order events were folded in: where the chunks of a report
fall does not matter. A session shorter than ``EXACT_TICKS + RETIRE_TICKS`` ticks folds nothing.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from fractions import Fraction
from typing import Any, TypeVar

from pcie_tui.core import units

KEEP_LONGEST = 64  # old events (or stretches) of a GPU kept whole, the longest

T = TypeVar("T")


@dataclass(slots=True)
class Tally:
    """What a kind of folded event comes to: counts, exact sums, extremes."""

    count: int = 0
    ticks: int = 0
    seconds: Fraction = Fraction(0)  # the sum of each one's end - start
    util: Fraction = Fraction(0)  # saturation events: the sum of their ticks' use (a mean over ``ticks``)
    first: float | None = None  # the earliest start
    last: float | None = None  # the latest end
    peak: float | None = None  # saturation events: the highest use; stretches: the highest temperature
    peak_Bps: float | None = None  # link events: the highest rate at a peak

    def add(self, start: float, end: float, ticks: int, util: float = 0.0, peak: float | None = None,
            peak_Bps: float | None = None) -> None:  # fmt: skip
        self.count += 1
        self.ticks += ticks
        self.seconds += Fraction(end) - Fraction(start)
        self.util += Fraction(util)
        self.first = start if self.first is None else min(self.first, start)
        self.last = end if self.last is None else max(self.last, end)
        self.peak = _top(self.peak, peak)
        self.peak_Bps = _top(self.peak_Bps, peak_Bps)


def _top(a: float | None, b: float | None) -> float | None:
    if a is None:
        return b
    return a if b is None or a >= b else b


def split_old(
    items: Sequence[T], old: Callable[[T], bool], rank: Callable[[T], tuple[Any, ...]]
) -> tuple[list[T], list[T]]:
    """``items`` (in order) as (kept, folded): of the old ones, the :data:`KEEP_LONGEST` first by ``rank`` (a
    strict order: longest first) are kept with every new one, in their order; the other old ones are folded.
    Folding the kept ones again with more old ones gives what folding all at once would."""
    aged = [x for x in items if old(x)]
    if len(aged) <= KEEP_LONGEST:
        return list(items), []
    keep = {id(x) for x in sorted(aged, key=rank)[:KEEP_LONGEST]}
    gone = [x for x in aged if id(x) not in keep]
    dropped = {id(x) for x in gone}
    return [x for x in items if id(x) not in dropped], gone


def fold_events(events: list[Any], gpu: int, cutoff: float, tallies: dict[tuple[str, str | None], Tally]) -> list[Any]:
    """Saturation events of ``gpu`` that ended before ``cutoff``, beyond the longest, into ``tallies`` (per
    resource and phase); returns the events kept, in order."""
    order = {r: i for i, r in enumerate(("link", "memory", "compute"))}
    kept, gone = split_old(
        events,
        lambda e: e.gpu == gpu and e.end is not None and e.end < cutoff,
        lambda e: (-(e.end - e.start), e.start, order.get(e.resource, 9)),
    )
    for e in gone:
        tallies.setdefault((e.resource, e.phase), Tally()).add(e.start, e.end, e.n, e.sum_util, e.peak_util,
                                                               e.peak_Bps)  # fmt: skip
    return kept


def folded_events_json(tallies: dict[tuple[str, str | None], Tally]) -> list[dict[str, Any]]:
    """A GPU's folded saturation events as ``report --json`` lists them, per resource and phase."""
    out = []
    for (resource, phase), t in sorted(tallies.items(), key=lambda kv: (kv[0][0], kv[0][1] or "")):
        out.append(
            {
                "resource": resource,
                "phase": phase,
                "events": t.count,
                "duration_s": float(t.seconds),
                "ticks": t.ticks,
                "peak_util": t.peak,
                "mean_util": float(t.util / t.ticks) if t.ticks else None,
                "peak_Bps": t.peak_Bps,
                "first_start": t.first,
                "last_end": t.last,
            }
        )
    return out


def folded_events_line(folded: list[dict[str, Any]]) -> str:
    """The report's line under a GPU's events table for its folded ones (``events_folded`` of ``--json``)."""
    n = sum(f["events"] for f in folded)
    kinds = "; ".join(
        f"{f['resource']}{' in ' + f['phase'] if f['phase'] else ''} {f['events']:,} "
        f"({f['duration_s']:.1f} s, peak {units.pct(f['peak_util'], space=False)}, "
        f"mean {units.pct(f['mean_util'], space=False)})"
        for f in folded
    )
    return (
        f"  and {n:,} more saturation events (older ones, none longer than the old ones listed), counted rather "
        f"than listed (--json: events_folded): {kinds}"
    )
