"""A GPU's series over a session, and the statistics the summary takes of them.

:class:`GpuSeries` keeps per tick the time, verdict, utilisation and phase as lists (what the
TUI, plots and attribution read) and the numeric ones also as the chunks' float arrays, joined
on demand (:func:`series_array`). The rest are the pure helpers of
:meth:`pcie_tui.analyze.session.SessionAnalyzer.summary`: verdict segments, gaps, quantiles.
"""

from __future__ import annotations

from bisect import bisect_right
from dataclasses import dataclass, field
from operator import itemgetter
from typing import Any

import numpy as np

from pcie_tui.analyze.verdict import RESOURCES, VERDICTS

ARRAYS = ("link", "link_Bps", "memory", "compute", "mem_used", "pcie_ceiling", "missing")


@dataclass
class GpuSeries:
    t: list[float] = field(default_factory=list)
    verdict: list[str] = field(default_factory=list)
    link: list[float | None] = field(default_factory=list)
    link_Bps: list[float | None] = field(default_factory=list)
    memory: list[float | None] = field(default_factory=list)
    compute: list[float | None] = field(default_factory=list)
    phase: list[str | None] = field(default_factory=list)
    mem_used: list[float | None] = field(default_factory=list)  # bytes of GPU memory in use
    pcie_ceiling: list[float | None] = field(default_factory=list)  # the one PCIe ceiling of each tick, B/s
    missing: list[float | None] = field(default_factory=list)  # counters the tick lacks (verdict.MISS_* bits)
    memory_proxy: bool = False
    # The numeric series as the chunks' float arrays (NaN = None), joined on demand by series_array.
    parts: dict[str, list[np.ndarray]] = field(default_factory=lambda: {k: [] for k in ARRAYS})


def sweep_all(intervals: dict[str, list[tuple[float, float]]], times: list[float]) -> list[int]:
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


def sweep(iv: list[tuple[float, float]], times: list[float]) -> list[bool]:
    """Whether each (ascending) time lies in a sorted interval, by the original pointer sweep."""
    out = []
    i = 0
    for t in times:
        while i < len(iv) and iv[i][1] < t:
            i += 1
        out.append(i < len(iv) and iv[i][0] <= t)
    return out


def segments(times: list[float], codes: np.ndarray) -> list[dict[str, Any]]:
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


def drop_gaps(time_in: dict[str, float], segs: list[dict[str, Any]], gaps: list[tuple[float, float]]) -> None:
    """Take each hole out of the verdict segment that spans it (the one holding the tick before it)."""
    if not gaps or not segs:
        return
    starts = [sg["start"] for sg in segs]
    for a, b in gaps:
        i = bisect_right(starts, a) - 1
        if i >= 0 and segs[i]["start"] <= a < segs[i]["end"] and b <= segs[i]["end"]:
            time_in[segs[i]["saturated"]] -= b - a


def series_array(ser: GpuSeries, name: str) -> np.ndarray:
    """A series column as floats (None -> NaN): the chunks' arrays joined, kept while its length is unchanged."""
    values = getattr(ser, name)
    cache: dict[str, np.ndarray] = ser.__dict__.setdefault("_arrays", {})
    a = cache.get(name)
    if a is None or a.size != len(values):
        parts = ser.parts.get(name) or []
        if len(parts) > 1:
            parts[:] = [np.concatenate(parts)]
        a = parts[0] if parts and parts[0].size == len(values) else floats(values)
        cache[name] = a
    return a


def pick(values: list[Any], at: list[int]) -> list[Any]:
    """values[i] for i in at."""
    return list(itemgetter(*at)(values)) if len(at) > 1 else [values[i] for i in at]


def nullable(a: np.ndarray) -> list[float | None]:
    """Floats with NaN -> None, as a list."""
    nan = np.isnan(a)
    if not nan.any():
        return a.tolist()  # type: ignore[no-any-return]
    o = a.astype(object)
    o[nan] = None
    return o.tolist()  # type: ignore[no-any-return]


def floats(values: list[float | None]) -> np.ndarray:
    """None -> NaN."""
    try:
        return np.array(values, dtype=np.float64)
    except (TypeError, ValueError):
        return np.array([np.nan if v is None else float(v) for v in values], dtype=np.float64)


def _stats(values: list[float | None]) -> dict[str, float | None]:
    return stats_np(floats(values))


def stats_np(a: np.ndarray) -> dict[str, float | None]:
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


def tick_weights(t: np.ndarray) -> np.ndarray:
    """Seconds each tick stands for: the interval before it (the first tick: the typical one),
    holes longer than 5 intervals and steps back cut to one interval. The attribution and the
    what-if both weigh ticks so, and so give a phase the same duration."""
    if t.size == 0:
        return t
    dt = np.diff(t, prepend=t[0])
    typical = float(np.median(dt[1:])) if t.size > 1 else 0.1
    dt[0] = typical
    return np.where((dt > 5 * typical) | (dt < 0), typical, dt)
