"""Whole-session analysis: verdict timeline, events and statistics per GPU.

The same :class:`SessionAnalyzer` runs live (fed tick by tick), on replay and
in ``report``; verdicts are always recomputed from raw readings.
"""

from __future__ import annotations

from bisect import bisect_right
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from pcie_tui.analyze.quantiles import quantile  # noqa: F401  (re-exported: one quantile)
from pcie_tui.analyze.verdict import (
    DEFAULT_THRESHOLDS,
    RESOURCES,
    VERDICTS,
    Event,
    GpuVerdictTracker,
    Thresholds,
)
from pcie_tui.model import Sample, SessionHeader


def sample_phase(s: Sample) -> str | None:
    """The phase a tick belongs to: the engine's, else a recording's own label."""
    if s.engine is not None and s.engine.phase:
        return s.engine.phase
    label = s.extra.get("label")
    return label if isinstance(label, str) else None


@dataclass
class _GpuSeries:
    t: list[float] = field(default_factory=list)
    verdict: list[str] = field(default_factory=list)
    link: list[float | None] = field(default_factory=list)
    link_Bps: list[float | None] = field(default_factory=list)
    memory: list[float | None] = field(default_factory=list)
    compute: list[float | None] = field(default_factory=list)
    phase: list[str | None] = field(default_factory=list)
    mem_used: list[float | None] = field(default_factory=list)  # bytes of GPU memory in use
    memory_proxy: bool = False


class SessionAnalyzer:
    """Feed Samples in time order; ask for events, a timeline or a summary."""

    def __init__(self, header: SessionHeader, thresholds: Thresholds = DEFAULT_THRESHOLDS, keep_series: bool = True):
        self.header = header
        self.th = thresholds
        self.keep_series = keep_series
        self.trackers: dict[int, GpuVerdictTracker] = {}
        self.series: dict[int, _GpuSeries] = {}
        self.events: list[Event] = []  # closed and open, in opening order
        self.t0: float | None = None
        self.t_last: float | None = None
        self.n = 0
        # Holes in the recording (start, end): left out of time in verdict and of rates.
        self.gaps: list[tuple[float, float]] = []

    def _tracker(self, index: int) -> GpuVerdictTracker:
        tr = self.trackers.get(index)
        if tr is None:
            tr = self.trackers[index] = GpuVerdictTracker(self.header.gpu(index), index, self.th)
            self.series[index] = _GpuSeries()
        return tr

    def feed(self, s: Sample) -> list[Event]:
        """Process one tick; returns events opened in it."""
        if self.t0 is None:
            self.t0 = s.t
        self.t_last = s.t
        self.n += 1
        phase = sample_phase(s)
        opened_all: list[Event] = []
        for g in s.gpus:
            tr = self._tracker(g.index)
            verdict, opened, _closed = tr.update(s.t, g, phase)
            opened_all.extend(opened)
            if self.keep_series:
                u = tr.last_util
                assert u is not None
                ser = self.series[g.index]
                ser.t.append(s.t)
                ser.verdict.append(verdict)
                ser.link.append(u.link)
                ser.link_Bps.append(u.link_Bps)
                ser.memory.append(u.memory)
                ser.compute.append(u.compute)
                ser.phase.append(phase)
                ser.mem_used.append(g.mem_used_bytes)
                ser.memory_proxy = ser.memory_proxy or u.memory_proxy
        self.events.extend(opened_all)
        return opened_all

    def feed_all(self, samples: Iterable[Sample]) -> SessionAnalyzer:
        for s in samples:
            self.feed(s)
        return self

    def finish(self) -> None:
        """Close events still open at the end of the data."""
        if self.t_last is None:
            return
        for tr in self.trackers.values():
            tr.close_all(self.t_last)

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
        return _segments(ser.t, self._label_codes(index, ser.t))

    def _labels(self, index: int, times: list[float]) -> list[str]:
        """Per tick verdict with backdated event intervals (names)."""
        return [VERDICTS[c] for c in self._label_codes(index, times).tolist()]

    def _label_codes(self, index: int, times: list[float]) -> np.ndarray:
        """Per tick verdict with backdated event intervals, as indices into VERDICTS."""
        last = times[-1]
        intervals: dict[str, list[tuple[float, float]]] = {r: [] for r in RESOURCES}
        for ev in self.events:
            if ev.gpu == index:
                intervals[ev.resource].append((ev.start, ev.end if ev.end is not None else last))
        for iv in intervals.values():
            iv.sort()
        t = np.asarray(times, dtype=np.float64)
        if t.size > 1 and not bool(np.all(t[1:] >= t[:-1])):
            return np.array(_sweep_all(intervals, times), dtype=np.int64)
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
                inside = np.array(_sweep(iv, times), dtype=bool)
            codes[inside] = ri
        return codes

    # ---- summary --------------------------------------------------------

    def summary(self) -> dict[str, Any]:
        """Per-GPU time in each verdict, events, and use statistics (report --json)."""
        gpus = []
        for index in sorted(self.series):
            ser = self.series[index]
            codes = self._label_codes(index, ser.t) if ser.t else np.zeros(0, dtype=np.int64)
            segs = _segments(ser.t, codes) if ser.t else []
            time_in = {v: 0.0 for v in VERDICTS}
            for sg in segs:
                time_in[sg["saturated"]] += sg["end"] - sg["start"]
            _drop_gaps(time_in, segs, self.gaps)
            info = self.header.gpu(index)
            gpus.append(
                {
                    "index": index,
                    "name": info.name if info else None,
                    "verdicts": segs,
                    "time_in_verdict_s": time_in,
                    "events": [e.to_json() for e in self.events if e.gpu == index],
                    "link_util": _stats_np(_series_array(ser, "link")),
                    "link_Bps": _stats_np(_series_array(ser, "link_Bps")),
                    "dram_util": _stats_np(_series_array(ser, "memory")),
                    "dram_basis": "proxy (NVML memory busy %, a duty cycle)"
                    if ser.memory_proxy
                    else "GPM DRAM_BW_UTIL",
                    "sm_util": _stats_np(_series_array(ser, "compute")),
                    "phases": self._phase_summary(index, codes),
                }
            )
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

    def _phase_summary_uncached(self, ser: _GpuSeries, codes: np.ndarray) -> dict[str, Any]:
        out: dict[str, Any] = {}
        # Codes in first-appearance order, built at C speed (dict.fromkeys keeps order).
        names = [p for p in dict.fromkeys(ser.phase) if p is not None]
        by_phase = {p: i for i, p in enumerate(names)}
        if not by_phase:
            return out
        lookup: dict[Any, int] = {None: -1, **by_phase}
        pc = np.fromiter(map(lookup.__getitem__, ser.phase), dtype=np.int64, count=len(ser.phase))
        order = np.argsort(pc, kind="stable")
        bounds = np.searchsorted(pc[order], np.arange(len(by_phase) + 1), "left")
        cols = {k: _series_array(ser, k) for k in ("link", "link_Bps", "memory", "compute")}
        nv = len(VERDICTS)
        for p, k in by_phase.items():
            idx = order[bounds[k] : bounds[k + 1]]
            n = int(idx.size)
            counts = np.bincount(codes[idx], minlength=nv).tolist()
            share = {v: counts[i] / n for i, v in enumerate(VERDICTS)}
            out[p] = {
                "ticks": n,
                "verdict_share": share,
                "dominant": max(share, key=share.__getitem__),
                "link_util": _stats_np(cols["link"][idx]),
                "link_Bps": _stats_np(cols["link_Bps"][idx]),
                "dram_util": _stats_np(cols["memory"][idx]),
                "sm_util": _stats_np(cols["compute"][idx]),
            }
        return out


def _sweep_all(intervals: dict[str, list[tuple[float, float]]], times: list[float]) -> list[int]:
    """The per-tick sweep over all resources, for times out of order."""
    pos = dict.fromkeys(RESOURCES, 0)
    codes = []
    for t in times:
        code = len(RESOURCES)
        for ri, r in enumerate(RESOURCES):
            iv, i = intervals[r], pos[r]
            while i < len(iv) and iv[i][1] < t:
                i += 1
            pos[r] = i
            if i < len(iv) and iv[i][0] <= t:
                code = ri
                break
        codes.append(code)
    return codes


def _sweep(iv: list[tuple[float, float]], times: list[float]) -> list[bool]:
    """Whether each (ascending) time lies in a sorted interval, by the original pointer sweep."""
    out = []
    i = 0
    for t in times:
        while i < len(iv) and iv[i][1] < t:
            i += 1
        out.append(i < len(iv) and iv[i][0] <= t)
    return out


def _segments(times: list[float], codes: np.ndarray) -> list[dict[str, Any]]:
    """Runs of equal verdict; a segment ends where the next begins (the last at the last tick)."""
    if not times:
        return []
    change = np.flatnonzero(codes[1:] != codes[:-1]) + 1
    starts = [0, *change.tolist()]
    ends = [*change.tolist(), len(times) - 1]
    return [
        {"start": times[a], "end": times[b], "saturated": VERDICTS[int(codes[a])]}
        for a, b in zip(starts, ends, strict=True)
    ]


def _drop_gaps(time_in: dict[str, float], segs: list[dict[str, Any]], gaps: list[tuple[float, float]]) -> None:
    """Take each hole out of the verdict segment that spans it (the one holding the tick before it)."""
    if not gaps or not segs:
        return
    starts = [sg["start"] for sg in segs]
    for a, b in gaps:
        i = bisect_right(starts, a) - 1
        if i >= 0 and segs[i]["start"] <= a < segs[i]["end"] and b <= segs[i]["end"]:
            time_in[segs[i]["saturated"]] -= b - a


def _series_array(ser: _GpuSeries, name: str) -> np.ndarray:
    """A series column as floats (None -> NaN), kept on the series while its length is unchanged.

    The bulk analyzer leaves the arrays it computed there, so summary() converts nothing.
    """
    values = getattr(ser, name)
    cache: dict[str, np.ndarray] = ser.__dict__.setdefault("_arrays", {})
    a = cache.get(name)
    if a is None or a.size != len(values):
        a = cache[name] = _floats(values)
    return a


def _floats(values: list[float | None]) -> np.ndarray:
    """None -> NaN."""
    try:
        return np.array(values, dtype=np.float64)
    except (TypeError, ValueError):
        return np.array([np.nan if v is None else float(v) for v in values], dtype=np.float64)


def _stats(values: list[float | None]) -> dict[str, float | None]:
    return _stats_np(_floats(values))


def _stats_np(a: np.ndarray) -> dict[str, float | None]:
    v = np.sort(a[~np.isnan(a)])
    n = int(v.size)
    if not n:
        return {"peak": None, "median": None, "p95": None, "mean": None, "n": 0}
    return {
        "peak": float(v[-1]),
        "median": _quantile_np(v, 0.5),
        "p95": _quantile_np(v, 0.95),
        "mean": float(np.cumsum(v)[-1]) / n,  # the sequential sum of the sorted values, as sum() was
        "n": n,
    }


def _quantile_np(v: np.ndarray, q: float) -> float:
    """:func:`quantile` on a sorted array, the same arithmetic."""
    if v.size == 1:
        return float(v[0])
    pos = q * (v.size - 1)
    lo = int(pos)
    hi = min(lo + 1, v.size - 1)
    a, b = float(v[lo]), float(v[hi])
    return a + (b - a) * (pos - lo)


def analyze(
    header: SessionHeader, samples: Iterable[Sample], thresholds: Thresholds = DEFAULT_THRESHOLDS
) -> SessionAnalyzer:
    an = SessionAnalyzer(header, thresholds)
    an.feed_all(samples)
    an.finish()
    return an
