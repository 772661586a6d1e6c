"""Whole-session analysis: verdict timeline, events and statistics per GPU.

One :class:`SessionAnalyzer` serves live, replay and ``report``: it advances over chunks of
ticks (:mod:`pcie_tui.analyze.columns`). A live tick is a chunk of one (:meth:`feed`); a replay
or a report feeds the recording in long chunks (:meth:`feed_all`, :meth:`feed_rows`; the report
is a replay without a screen). Per chunk, each GPU's utilisation is computed for every tick at
once with numpy (:func:`pcie_tui.analyze.verdict.utilisation_columns`) and the hysteresis state
machine (:mod:`pcie_tui.analyze.tracker`) walks those columns tick by tick. Verdicts are always
recomputed from raw readings.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from itertools import islice
from typing import TYPE_CHECKING, Any

import numpy as np

from pcie_tui.analyze.between_requests import BetweenRequests
from pcie_tui.analyze.columns import CHUNK_TICKS, COL, Chunk, from_rows, from_samples
from pcie_tui.analyze.columns import sample_phase as sample_phase  # re-exported (tests import it from here)
from pcie_tui.analyze.engine_bytes import EngineBytes
from pcie_tui.analyze.fold import Tally, fold_events, folded_events_json
from pcie_tui.analyze.heat import Heat
from pcie_tui.analyze.link_health import LinkHealth
from pcie_tui.analyze.quantiles import quantile  # noqa: F401  (re-exported: one quantile)
from pcie_tui.analyze.request_waits import RequestWaits
from pcie_tui.analyze.retire import RETIRE_TICKS, crowded, due, joined_segments, merge, reserve, retire
from pcie_tui.analyze.series import (
    GpuSeries,
    Times,
    drop_gaps,
    pick,
    segments,
    series_array,
    series_counts,
    series_means,
    stats_weighted,
    sweep,
    sweep_all,
)
from pcie_tui.analyze.suspect import merge_missing
from pcie_tui.analyze.tracker import GpuVerdictTracker, verdict_codes
from pcie_tui.analyze.verdict import (
    DEFAULT_THRESHOLDS,
    RESOURCES,
    VERDICTS,
    Event,
    Thresholds,
    utilisation_columns,
)
from pcie_tui.core.model import Sample, SessionHeader

if TYPE_CHECKING:
    from pcie_tui.recording.timeline import BlockColumns


class SessionAnalyzer:
    """Feed ticks in time order (one Sample, or a chunk); ask for events, a timeline or a summary."""

    def __init__(self, header: SessionHeader, thresholds: Thresholds = DEFAULT_THRESHOLDS, keep_series: bool = True):
        self.header = header
        self.th = thresholds
        self.keep_series = keep_series
        self.trackers: dict[int, GpuVerdictTracker] = {}
        self.series: dict[int, GpuSeries] = {}
        self.events: list[Event] = []  # closed and open, in opening order (a long session's old ones folded)
        # per GPU, its folded saturation events (analyze/fold.py) per resource and phase
        self.folded: dict[int, dict[tuple[str, str | None], Tally]] = {}
        self.t0: float | None = None
        self.t_last: float | None = None
        self.n = 0
        # Holes in the recording (start, end): left out of time in verdict and of rates.
        self.gaps: list[tuple[float, float]] = []
        self._version = 0  # bumped whenever events may change (a feed, finish)
        self._codes_cache: dict[int, tuple[Any, np.ndarray]] = {}
        # A session with an engine takes its phases from the engine alone: a tick the engine gave no
        # phase for (or no reading) has none, and a recording's own labels are not mixed in (their
        # words differ, e.g. ``load`` vs the engine's ``loading``). Without an engine, the labels.
        self.engine_session = header.engine is not None
        self.phase: str | None = None  # the last tick's phase, by that rule
        # The engine's own byte and prefix-cache counters per phase, with NVML's PCIe bytes beside them.
        self.engine_bytes = EngineBytes()
        self.request_waits = RequestWaits()
        self.between_requests = BetweenRequests()  # the engine's own copies while requests wait
        self.heat = Heat(header)  # throttled stretches and what they cost in tokens
        self.link_health = LinkHealth(header)  # replay/AER counters that rise, a link trained down under load
        # Link rates (B/s) where what bound a tick changes (the attribution's transfer floors): a long
        # session's summarised ticks are grouped by the side of each they fell on (analyze/retire.py).
        self.rate_cuts: Callable[[int], tuple[float, ...]] = lambda _index: ()
        self.exact = False  # True: retire nothing (a plot that draws every tick of a long recording)

    @property
    def version(self) -> int:
        """Bumped whenever what the analyzer says may have changed (a feed, finish)."""
        return self._version

    def _tracker(self, index: int) -> GpuVerdictTracker:
        tr = self.trackers.get(index)
        if tr is None:
            tr = self.trackers[index] = GpuVerdictTracker(self.header.gpu(index), index, self.th)
            self.series[index] = GpuSeries()
        return tr

    def feed(self, s: Sample) -> list[Event]:
        """Process one tick (a chunk of one); returns events opened in it."""
        return self.feed_chunk(from_samples([s]))

    def feed_all(self, samples: Iterable[Sample], chunk: int | None = None) -> SessionAnalyzer:
        """Process Samples in chunks of ``chunk`` ticks (the same result as feeding them one by one)."""
        it = iter(samples)
        while batch := list(islice(it, chunk or CHUNK_TICKS)):
            self.feed_chunk(from_samples(batch))
        return self

    def feed_rows(
        self, rows: Sequence[dict[str, Any]], chunk: int | None = None, swept: BlockColumns | None = None
    ) -> SessionAnalyzer:
        """Process a recording's raw tick dicts (no Samples built) in chunks of ``chunk`` ticks (``swept``: the
        columns the reader's check already took from these very rows)."""
        for ch in from_rows(rows, chunk or CHUNK_TICKS, swept):
            self.feed_chunk(ch)
        return self

    def feed_chunk(self, ch: Chunk) -> list[Event]:
        """Process a chunk of ticks; returns the events opened in it, in opening order."""
        if not ch.t:
            return []
        self._version += 1
        if self.t0 is None:
            self.t0 = ch.t[0]
        self.t_last = ch.t[-1]
        self.n += len(ch.t)
        self._phases(ch)
        self.engine_bytes.feed_chunk(ch)
        self.request_waits.feed_chunk(ch)
        self.between_requests.feed_chunk(ch)
        self.heat.feed_chunk(ch)
        self.link_health.feed_chunk(ch)
        idx = ch.index
        if not idx.size:
            return []
        if idx.size > 64:
            uq, first = np.unique(idx, return_index=True)
            gpus = uq[np.argsort(first)].tolist()  # in order of first appearance
        else:
            gpus = list(dict.fromkeys(idx.tolist()))
        one = len(gpus) == 1  # one GPU: no split needed
        t_all = np.array(ch.t, dtype=np.float64)
        if not ch.single:
            t_all = t_all[ch.tick_of]
        opened: list[tuple[int, int, Event]] = []
        retired: list[int] = []
        for gi in gpus:
            pos = None if one else np.flatnonzero(idx == gi)
            tr = self._tracker(gi)
            cols = ch.cols if pos is None else ch.cols[:, pos]
            ticks = ch.tick_of if pos is None else ch.tick_of[pos]
            t = t_all if pos is None else t_all[pos]
            cols, suspect = tr.suspect.apply(tr.info, cols, COL["link_gen"], COL["link_width"])
            u = utilisation_columns(tr.info, cols, tr.ceilings, tr.observed)
            if suspect.any():
                u["missing"] = merge_missing(u["missing"], suspect)
            ph = ch.phase if one and ch.single else pick(ch.phase, ticks.tolist())
            tl = t.tolist()
            op, _closed, spans = tr.advance(t, u, ph, tl)
            opened += [(i if pos is None else int(pos[i]), ri, e) for i, ri, e in op]
            if self.keep_series:
                ser = self.series[gi]
                had = len(ser.t)
                self._extend(ser, tl, verdict_codes(len(tl), spans), u, ph, cols[COL["mem_used_bytes"]])
                if not self.exact and self._bound(gi, had):
                    retired.append(gi)
        opened.sort(key=lambda x: (x[0], x[1]))
        out = [e for _p, _r, e in opened]
        self.events.extend(out)
        for gi in dict.fromkeys(retired):  # events that ended before the oldest exact tick: the longest kept
            ser = self.series[gi]
            self.events = fold_events(self.events, gi, float(ser.t.array()[ser.reps]), self.folded.setdefault(gi, {}))
        return out

    def _bound(self, gi: int, had: int) -> bool:
        """A long session's series kept bounded (retire.py), after a chunk took it from ``had`` ticks: the room
        its bound needs reserved at once, its oldest ticks summarised, the summary rows merged as they age.
        True when it retired ticks."""
        ser = self.series[gi]
        if had < RETIRE_TICKS <= len(ser.t):
            reserve(ser)
        retired = False
        while due(ser):
            retire(ser, self._retire_codes(gi), self.rate_cuts(gi))
            if crowded(ser):
                merge(ser, self.rate_cuts(gi))
            retired = True
        return retired

    def _phases(self, ch: Chunk) -> None:
        """Apply the session's phase rule to a chunk's phases (in place), from its first engine tick on."""
        eng = ch.engine
        if len(eng) == 1 and (self.engine_session or eng[0] is None):  # a live tick
            if self.engine_session and eng[0] is None:
                ch.phase[0] = None
            self.phase = ch.phase[0]
            return
        if not self.engine_session:
            if eng.count(None) == len(eng):
                self.phase = ch.phase[-1]
                return
            self.engine_session = True
            first = next(i for i, e in enumerate(eng) if e is not None)
        else:
            first = 0
        ph = ch.phase
        if None in eng[first:]:  # (identity first: a sweep at C speed; every tick with a reading changes nothing)
            ph[first:] = [p if e is not None else None for p, e in zip(ph[first:], eng[first:], strict=True)]
        self.phase = ph[-1]

    @staticmethod
    def _extend(
        ser: GpuSeries, t: list[float], codes: np.ndarray, u: dict[str, np.ndarray], ph: list[Any], used: np.ndarray
    ) -> None:
        ser.t.extend(t)
        ser.verdict.extend_codes(codes)
        ser.phase.extend(ph)
        for name, a in (("link", u["link"]), ("link_Bps", u["link_Bps"]), ("memory", u["memory"]),
                        ("compute", u["compute"]), ("mem_used", used), ("pcie_ceiling", u["pcie_ceiling"]),
                        ("missing", u["missing"])):  # fmt: skip
            getattr(ser, name).extend(a)
        ser.memory_proxy = ser.memory_proxy or bool(u["proxy"].any())

    def finish(self) -> None:
        """Close events still open at the end of the data."""
        if self.t_last is None:
            return
        self._version += 1
        for tr in self.trackers.values():
            tr.close_all(self.t_last)
        self.link_health.finish()
        self.heat.finish()

    def events_count(self) -> int:
        """Saturation, throttling and link-health events so far, folded ones counted (analyze/fold.py)."""
        folded = sum(t.count for f in self.folded.values() for t in f.values())
        return len(self.events) + folded + self.heat.events_count() + len(self.link_health.events)

    def health_events(self) -> list[Any]:
        """Throttled stretches and link-health events so far, by start (each has ``gpu``, ``kind``, ``start``,
        ``end``, ``open``, ``phase`` and ``detail()``)."""
        return sorted([*self.heat.events, *self.link_health.events], key=lambda e: e.start)

    def verdict(self, index: int) -> str:
        tr = self.trackers.get(index)
        return tr.verdict if tr else "none"

    # ---- timeline -------------------------------------------------------

    def timeline(self, index: int) -> list[dict[str, Any]]:
        """Contiguous verdict segments covering the session for one GPU.

        Saturation starts are backdated to when the resource first crossed its
        threshold (the hold time is a confirmation delay, not the start) and
        ends are the last tick above the exit threshold.
        """
        ser = self.series.get(index)
        if ser is None or not ser.t:
            return []
        return self._segments(ser, self._label_codes(index, ser.t))

    @staticmethod
    def _segments(ser: GpuSeries, codes: np.ndarray) -> list[dict[str, Any]]:
        """Verdict segments over the session: the retired ticks' kept ones, then the exact ticks'."""
        if not ser.reps:
            return segments(ser.t, codes)
        tail = ser.t.array()[ser.reps :].tolist()
        return joined_segments(ser, segments(tail, codes[ser.reps :]))

    def _labels(self, index: int, times: Times) -> list[str]:
        """Per tick verdict with backdated event intervals (names)."""
        return [VERDICTS[c] for c in self._label_codes(index, times).tolist()]

    def _label_codes(self, index: int, times: Times) -> np.ndarray:
        """Per tick verdict with backdated event intervals, as indices into VERDICTS (kept until the next feed)."""
        key = (index, id(times), len(times), self._version)
        hit = self._codes_cache.get(index)
        if hit is None or hit[0] != key:
            hit = self._codes_cache[index] = (key, self._label_codes_uncached(index, times))
        return hit[1].copy()

    def _label_codes_uncached(self, index: int, times: Times) -> np.ndarray:
        ser = self.series.get(index)
        if ser is not None and ser.reps and times is ser.t:
            # summarised rows keep the verdict their ticks had; the exact ones are labelled as below
            frozen = ser.verdict.codes.array()[: ser.reps].astype(np.int64)
            return np.concatenate([frozen, self._label_codes_exact(index, ser.t.array()[ser.reps :].tolist())])
        return self._label_codes_exact(index, times)

    def _retire_codes(self, index: int) -> np.ndarray:
        """The verdict codes of the ticks :func:`retire` takes next (the series' oldest exact ones), as
        :meth:`_label_codes` gives them: each tick's code depends only on its time and the events' intervals
        (an open one ends at the series' last tick), so only those ticks are labelled."""
        ser = self.series[index]
        exact = ser.t.array()[ser.reps :]
        if exact.size > 1 and not bool(np.all(exact[1:] >= exact[:-1])):  # (labelled by the sweep: as before)
            return self._label_codes(index, ser.t)[ser.reps : ser.reps + RETIRE_TICKS]
        return self._label_codes_exact(index, exact[:RETIRE_TICKS].tolist(), last=float(exact[-1]))

    def _label_codes_exact(self, index: int, times: Times, last: float | None = None) -> np.ndarray:
        """``last``: the time an event still open ends at (the last of ``times``, unless given)."""
        last = times[-1] if last is None else last
        intervals: dict[str, list[tuple[float, float]]] = {r: [] for r in RESOURCES}
        for ev in self.events:
            if ev.gpu == index:
                intervals[ev.resource].append((ev.start, ev.end if ev.end is not None else last))
        for iv in intervals.values():
            iv.sort()
        t = np.asarray(times, dtype=np.float64)
        if t.size > 1 and not bool(np.all(t[1:] >= t[:-1])):
            return np.array(sweep_all(intervals, times), dtype=np.int64)
        codes = np.full(t.size, len(RESOURCES), dtype=np.int64)
        for ri in range(len(RESOURCES) - 1, -1, -1):  # lowest priority first; higher ones overwrite
            iv = intervals[RESOURCES[ri]]
            if not iv:
                continue
            starts = np.array([a for a, _ in iv])
            ends = np.array([b for _, b in iv])
            if ends.size < 2 or bool(np.all(ends[1:] >= ends[:-1])):
                # The sweep's pointer is then the first interval not yet ended.
                i = np.searchsorted(ends, t, "left")
                inside = i < ends.size
                inside[inside] = starts[i[inside]] <= t[inside]
            else:
                inside = np.array(sweep(iv, times), dtype=bool)
            codes[inside] = ri
        return codes

    # ---- summary --------------------------------------------------------

    def summary(self) -> dict[str, Any]:
        """Per-GPU time in each verdict, events, and use statistics (report --json)."""
        gpus = []
        for index in sorted(self.series):
            ser = self.series[index]
            codes = self._label_codes(index, ser.t) if ser.t else np.zeros(0, dtype=np.int64)
            segs = self._segments(ser, codes) if ser.t else []
            counts = series_counts(ser)
            time_in = {v: 0.0 for v in VERDICTS}
            for sg in segs:
                time_in[sg["saturated"]] += sg["end"] - sg["start"]
            drop_gaps(time_in, segs, self.gaps)
            info = self.header.gpu(index)
            gpus.append(
                {
                    "index": index,
                    "name": info.name if info else None,
                    "verdicts": segs,
                    "time_in_verdict_s": time_in,
                    "events": [e.to_json() for e in self.events if e.gpu == index],
                    "link_util": col_stats(ser, "link", counts),
                    "link_Bps": col_stats(ser, "link_Bps", counts),
                    "dram_util": col_stats(ser, "memory", counts),
                    "dram_basis": "proxy (NVML memory busy %, a duty cycle)"
                    if ser.memory_proxy
                    else "GPM DRAM_BW_UTIL",
                    "sm_util": col_stats(ser, "compute", counts),
                    "phases": self._phase_summary(index, codes),
                }
            )
            if self.folded.get(index):  # a long session: its old events, beyond the longest, as counts
                gpus[-1]["events_folded"] = folded_events_json(self.folded[index])
        return {
            "start": self.t0,
            "end": self.t_last,
            "duration_s": (self.t_last - self.t0) if self.t0 is not None and self.t_last is not None else 0.0,
            "ticks": self.n,
            "gpus": gpus,
        }

    def phase_summary(self, index: int) -> dict[str, Any]:
        """Per phase (engine phase or recording label): share of time per verdict and median use."""
        ser = self.series.get(index)
        if ser is None:
            return {}
        return self._phase_summary(index, None)

    def _phase_summary(self, index: int, codes: np.ndarray | None) -> dict[str, Any]:
        # report asks for the same GPU's phases several times (summary, what-if, phase lines);
        # the answer depends only on the series (grows with n) and this GPU's event intervals.
        ser = self.series[index]
        key = (id(ser), len(ser.t), self.n, [(e.resource, e.start, e.end) for e in self.events if e.gpu == index])
        cache: dict[int, tuple[Any, dict[str, Any]]] = self.__dict__.setdefault("_phase_cache", {})
        hit = cache.get(index)
        if hit is None or hit[0] != key:
            if codes is None:
                codes = self._label_codes(index, ser.t) if ser.t else np.zeros(0, dtype=np.int64)
            hit = cache[index] = (key, self._phase_summary_uncached(ser, codes))
        return {p: {k: dict(v) if isinstance(v, dict) else v for k, v in d.items()} for p, d in hit[1].items()}

    def _phase_summary_uncached(self, ser: GpuSeries, codes: np.ndarray) -> dict[str, Any]:
        out: dict[str, Any] = {}
        # Codes in first-appearance order, built at C speed (dict.fromkeys keeps order).
        names = [p for p in ser.phase.distinct() if p is not None]
        by_phase = {p: i for i, p in enumerate(names)}
        if not by_phase:
            return out
        # The series' own label codes mapped to these (None -> -1), at numpy speed.
        remap = np.array([by_phase.get(n, -1) for n in ser.phase.names], dtype=np.int64)
        pc = remap[ser.phase.codes.array()]
        order = np.argsort(pc, kind="stable")
        bounds = np.searchsorted(pc[order], np.arange(len(by_phase) + 1), "left")
        nv = len(VERDICTS)
        rows = series_counts(ser)  # None: every row one tick (analyze/retire.py)
        for p, k in by_phase.items():
            idx = order[bounds[k] : bounds[k + 1]]
            w = rows[idx] if rows is not None else None
            n = int(idx.size) if w is None else int(np.rint(w.sum()))
            counts = np.bincount(codes[idx], weights=w, minlength=nv).tolist()
            share = {v: counts[i] / n for i, v in enumerate(VERDICTS)}
            out[p] = {
                "ticks": n,
                "verdict_share": share,
                "dominant": max(share, key=share.__getitem__),
                "link_util": col_stats(ser, "link", rows, idx),
                "link_Bps": col_stats(ser, "link_Bps", rows, idx),
                "dram_util": col_stats(ser, "memory", rows, idx),
                "sm_util": col_stats(ser, "compute", rows, idx),
            }
        return out


def analyze(
    header: SessionHeader, samples: Iterable[Sample], thresholds: Thresholds = DEFAULT_THRESHOLDS
) -> SessionAnalyzer:
    an = SessionAnalyzer(header, thresholds)
    an.feed_all(samples)
    an.finish()
    return an


def analyze_rows(
    header: SessionHeader, rows: Sequence[dict[str, Any]], thresholds: Thresholds = DEFAULT_THRESHOLDS
) -> SessionAnalyzer:
    """:func:`analyze` over a recording's raw tick dicts (what ``report`` does: a replay without a screen)."""
    an = SessionAnalyzer(header, thresholds)
    an.feed_rows(rows)
    an.finish()
    return an


def col_stats(ser: GpuSeries, name: str, counts: np.ndarray | None, idx: np.ndarray | None = None) -> dict[str, Any]:
    """Peak, median, p95, mean and count of one column of a series (``idx``: of these rows only); ``counts``:
    how many ticks each row stands for (:func:`~pcie_tui.analyze.series.series_counts`)."""
    a = series_array(ser, name)
    if counts is None:
        return stats_weighted(a if idx is None else a[idx], None)
    m = series_means(ser, name)
    if idx is None:
        return stats_weighted(a, counts, m)
    return stats_weighted(a[idx], counts[idx], m[idx])
