"""Whole-session analysis: verdict timeline, events and statistics per GPU.

The same :class:`SessionAnalyzer` runs live (fed tick by tick), on replay and
in ``report``; verdicts are always recomputed from raw readings.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

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
        labels = self._labels(index, ser.t)
        segs: list[dict[str, Any]] = []
        for t, label in zip(ser.t, labels, strict=True):
            if segs and segs[-1]["saturated"] == label:
                segs[-1]["end"] = t
            else:
                if segs:
                    segs[-1]["end"] = t
                segs.append({"start": t, "end": t, "saturated": label})
        return segs

    def _labels(self, index: int, times: list[float]) -> list[str]:
        """Per tick verdict with backdated event intervals; one sweep, times ascending."""
        last = times[-1]
        intervals: dict[str, list[tuple[float, float]]] = {r: [] for r in RESOURCES}
        for ev in self.events:
            if ev.gpu == index:
                intervals[ev.resource].append((ev.start, ev.end if ev.end is not None else last))
        for iv in intervals.values():
            iv.sort()
        pos = dict.fromkeys(RESOURCES, 0)
        labels = []
        for t in times:
            label = "none"
            for r in RESOURCES:
                iv, i = intervals[r], pos[r]
                while i < len(iv) and iv[i][1] < t:
                    i += 1
                pos[r] = i
                if i < len(iv) and iv[i][0] <= t:
                    label = r
                    break
            labels.append(label)
        return labels

    # ---- summary --------------------------------------------------------

    def summary(self) -> dict[str, Any]:
        """Per-GPU time in each verdict, events, and use statistics (report --json)."""
        gpus = []
        for index in sorted(self.series):
            ser = self.series[index]
            segs = self.timeline(index)
            time_in = {v: 0.0 for v in VERDICTS}
            for sg in segs:
                time_in[sg["saturated"]] += sg["end"] - sg["start"]
            info = self.header.gpu(index)
            gpus.append(
                {
                    "index": index,
                    "name": info.name if info else None,
                    "verdicts": segs,
                    "time_in_verdict_s": time_in,
                    "events": [e.to_json() for e in self.events if e.gpu == index],
                    "link_util": _stats(ser.link),
                    "link_Bps": _stats(ser.link_Bps),
                    "dram_util": _stats(ser.memory),
                    "dram_basis": "proxy (NVML memory busy %, a duty cycle)"
                    if ser.memory_proxy
                    else "GPM DRAM_BW_UTIL",
                    "sm_util": _stats(ser.compute),
                    "phases": self.phase_summary(index),
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
        labels = self._labels(index, ser.t) if ser.t else []
        out: dict[str, Any] = {}
        by_phase: dict[str, list[int]] = {}
        for i, p in enumerate(ser.phase):
            if p is not None:
                by_phase.setdefault(p, []).append(i)
        for p, idx in by_phase.items():
            n = len(idx)
            share = {v: sum(1 for i in idx if labels[i] == v) / n for v in VERDICTS}
            out[p] = {
                "ticks": n,
                "verdict_share": share,
                "dominant": max(share, key=share.__getitem__),
                "link_util": _stats([ser.link[i] for i in idx]),
                "link_Bps": _stats([ser.link_Bps[i] for i in idx]),
                "dram_util": _stats([ser.memory[i] for i in idx]),
                "sm_util": _stats([ser.compute[i] for i in idx]),
            }
        return out


def _stats(values: list[float | None]) -> dict[str, float | None]:
    v = sorted(x for x in values if x is not None)
    if not v:
        return {"peak": None, "median": None, "p95": None, "mean": None, "n": 0}
    return {
        "peak": v[-1],
        "median": quantile(v, 0.5),
        "p95": quantile(v, 0.95),
        "mean": sum(v) / len(v),
        "n": len(v),
    }


def quantile(sorted_values: list[float], q: float) -> float:
    """Linear-interpolated quantile of already sorted values."""
    if len(sorted_values) == 1:
        return sorted_values[0]
    pos = q * (len(sorted_values) - 1)
    lo = int(pos)
    hi = min(lo + 1, len(sorted_values) - 1)
    return sorted_values[lo] + (sorted_values[hi] - sorted_values[lo]) * (pos - lo)


def analyze(
    header: SessionHeader, samples: Iterable[Sample], thresholds: Thresholds = DEFAULT_THRESHOLDS
) -> SessionAnalyzer:
    an = SessionAnalyzer(header, thresholds)
    an.feed_all(samples)
    an.finish()
    return an
