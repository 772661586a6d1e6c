"""A GPU's series over a session, and the statistics the summary takes of them.

:class:`GpuSeries` keeps per tick the time, verdict, utilisation and phase as lists (what the
TUI, plots and attribution read) and the numeric ones also as the chunks' float arrays, joined
on demand (:func:`series_array`). The rest are the pure helpers of
:meth:`pcie_tui.analyze.session.SessionAnalyzer.summary`: verdict segments, gaps, quantiles.
"""

from __future__ import annotations

from bisect import bisect_right
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from operator import itemgetter
from typing import Any

import numpy as np

from pcie_tui.analyze.verdict import RESOURCES, VERDICTS

ARRAYS = ("link", "link_Bps", "memory", "compute", "mem_used", "pcie_ceiling", "missing")


class Col:
    """A growable column of floats in one numpy buffer (NaN = unavailable): a session's series costs 8 bytes
    a tick, not a Python float and a list slot (~40) plus the chunk's array kept beside it. Reads like the
    list it replaced (len, truth, iteration, indexing and ``==`` give None for NaN); :meth:`array` is the
    filled part without a copy."""

    __slots__ = ("_buf", "_n")

    def __init__(self, dtype: Any = np.float64) -> None:
        self._buf = np.empty(0, dtype=dtype)
        self._n = 0

    def _grow(self, m: int) -> None:
        if m > self._buf.size:
            # a quarter more at a time: a day-long session's columns carry at most 25 % unused (doubling: up to 100 %)
            new = np.empty(max(m, self._buf.size + self._buf.size // 4, 256), dtype=self._buf.dtype)
            new[: self._n] = self._buf[: self._n]
            self._buf = new

    def reserve(self, m: int) -> None:
        """Room for ``m`` values, allocated and written now (a bounded column that will reach its bound then
        allocates nothing more, and its pages are resident from here on, not as it fills)."""
        if m > self._buf.size:
            new = np.empty(m, dtype=self._buf.dtype)
            new[: self._n] = self._buf[: self._n]
            new[self._n :] = 0
            self._buf = new

    def extend(self, values: Any) -> None:
        a = np.asarray(values, dtype=self._buf.dtype)
        m = self._n + a.size
        self._grow(m)
        self._buf[self._n : m] = a
        self._n = m

    def __iadd__(self, values: Any) -> Col:
        self.extend(values)
        return self

    def replace(self, at: int, m: int, values: Any) -> None:
        """Put ``values`` (at most ``m``) in place of the ``m`` values from ``at`` on; the rest move up."""
        v = np.asarray(values, dtype=self._buf.dtype)
        k = v.size
        assert k <= m and at + m <= self._n
        self._buf[at : at + k] = v
        self._buf[at + k : self._n - m + k] = self._buf[at + m : self._n]
        self._n -= m - k

    def drop_first(self, k: int) -> None:
        """Forget the first ``k`` values (the buffer is kept: a bounded window reuses it)."""
        k = min(max(k, 0), self._n)
        if k:
            self._buf[: self._n - k] = self._buf[k : self._n]
            self._n -= k

    def array(self) -> np.ndarray:
        return self._buf[: self._n]

    def __array__(self, dtype: Any = None, copy: Any = None) -> np.ndarray:
        a = self.array()
        return a if dtype is None else a.astype(dtype)

    def __len__(self) -> int:
        return self._n

    def __bool__(self) -> bool:
        return self._n > 0

    def tolist(self) -> list[Any]:
        return nullable(self.array()) if self._buf.dtype.kind == "f" else self.array().tolist()  # type: ignore[no-any-return]

    def __iter__(self) -> Iterator[Any]:
        return iter(self.tolist())

    def __getitem__(self, i: int) -> Any:
        v = self.array()[i]
        return None if isinstance(v, float | np.floating) and v != v else v.item()  # noqa: PLR0124 - NaN

    def __eq__(self, other: object) -> bool:
        if isinstance(other, Col | Labels):
            other = other.tolist()
        return isinstance(other, list) and self.tolist() == other

    __hash__ = None  # type: ignore[assignment]

    def __repr__(self) -> str:
        return f"Col({self._n} values)"


class Labels:
    """A growable column of labels (a phase name or None, a verdict name) kept as small integer codes."""

    __slots__ = ("codes", "names", "_code")

    def __init__(self, names: Sequence[Any] = ()) -> None:
        self.codes = Col(np.int16)  # 2 bytes a tick; widened past 32,000 distinct labels (_widen)
        self.names: list[Any] = list(names)
        self._code = {n: i for i, n in enumerate(self.names)}

    def extend(self, values: Sequence[Any]) -> None:
        code, names = self._code, self.names
        for v in dict.fromkeys(values):
            if v not in code:
                code[v] = len(names)
                names.append(v)
        if len(names) > 32_000 and self.codes.array().dtype == np.int16:
            self._widen()
        self.codes.extend(np.fromiter(map(code.__getitem__, values), dtype=np.int32, count=len(values)))

    def _widen(self) -> None:
        wide = Col(np.int32)
        wide.extend(self.codes.array())
        self.codes = wide

    def extend_codes(self, codes: np.ndarray) -> None:
        self.codes.extend(codes)

    def __iadd__(self, values: Sequence[Any]) -> Labels:
        self.extend(values)
        return self

    def __len__(self) -> int:
        return len(self.codes)

    def __bool__(self) -> bool:
        return bool(self.codes)

    def tolist(self) -> list[Any]:
        names = self.names
        return [names[c] for c in self.codes.array().tolist()]

    def __iter__(self) -> Iterator[Any]:
        return iter(self.tolist())

    def __getitem__(self, i: int) -> Any:
        return self.names[int(self.codes.array()[i])]

    def __eq__(self, other: object) -> bool:
        if isinstance(other, Col | Labels):
            other = other.tolist()
        return isinstance(other, list) and self.tolist() == other

    __hash__ = None  # type: ignore[assignment]

    def mapped(self, fn: Any, dtype: Any) -> np.ndarray:
        """``fn(label)`` for every tick, as an array: worked out once per distinct label, then indexed."""
        table = np.array([fn(n) for n in self.names], dtype=dtype) if self.names else np.zeros(0, dtype=dtype)
        return table[self.codes.array()]

    def distinct(self) -> list[Any]:
        """The labels seen, in order of first appearance."""
        used = set(np.unique(self.codes.array()).tolist())
        return [n for i, n in enumerate(self.names) if i in used]


Times = list[float] | Col  # tick times: a list, or a series' column


@dataclass
class GpuSeries:
    t: Col = field(default_factory=Col)
    verdict: Labels = field(default_factory=lambda: Labels(VERDICTS))
    link: Col = field(default_factory=Col)
    link_Bps: Col = field(default_factory=Col)
    memory: Col = field(default_factory=Col)
    compute: Col = field(default_factory=Col)
    phase: Labels = field(default_factory=Labels)
    mem_used: Col = field(default_factory=Col)  # bytes of GPU memory in use
    pcie_ceiling: Col = field(default_factory=Col)  # the one PCIe ceiling of each tick, B/s
    missing: Col = field(default_factory=Col)  # counters the tick lacks (verdict.MISS_* bits)
    memory_proxy: bool = False
    # A long session's oldest ticks, summarised (analyze/retire.py): the first ``reps`` rows stand for
    # ``rep_n`` ticks and ``rep_w`` seconds each, with their verdict frozen; their verdict segments whole.
    reps: int = 0
    rep_n: Col = field(default_factory=Col)
    rep_w: Col = field(default_factory=Col)
    rep_means: dict[str, Col] = field(default_factory=dict)  # per column, each summarised row's mean
    # the retired ticks' verdict segments: start and end times, verdict code (an index into VERDICTS)
    retired_segments: tuple[Col, Col, Col] = field(default_factory=lambda: (Col(), Col(), Col(np.int8)))
    retired_last_t: float | None = None


def series_counts(ser: GpuSeries) -> np.ndarray | None:
    """How many ticks each row stands for; None while every row is one tick (nothing retired)."""
    if not ser.reps:
        return None
    return np.concatenate([ser.rep_n.array(), np.ones(len(ser.t) - ser.reps)])


def series_means(ser: GpuSeries, name: str) -> np.ndarray:
    """:func:`series_array`, a summarised row's value its ticks' mean (for sums and means; quantiles take the
    middles :func:`series_array` gives)."""
    a = series_array(ser, name)
    if not ser.reps:
        return a
    return np.concatenate([ser.rep_means[name].array(), a[ser.reps :]])


def series_weights(ser: GpuSeries) -> np.ndarray:
    """Seconds each row stands for (:func:`tick_weights`; a summarised row: the seconds of its ticks)."""
    t = ser.t.array()
    if not ser.reps:
        return tick_weights(t)
    return np.concatenate([ser.rep_w.array(), tick_weights(t[ser.reps :], prev=ser.retired_last_t)])


def sweep_all(intervals: dict[str, list[tuple[float, float]]], times: Times) -> list[int]:
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


def sweep(iv: list[tuple[float, float]], times: Times) -> list[bool]:
    """Whether each (ascending) time lies in a sorted interval, by the original pointer sweep."""
    out = []
    i = 0
    for t in times:
        while i < len(iv) and iv[i][1] < t:
            i += 1
        out.append(i < len(iv) and iv[i][0] <= t)
    return out


def segments(times: Times, codes: np.ndarray) -> list[dict[str, Any]]:
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
    """A series column as floats (NaN = unavailable), without a copy."""
    col: Col = getattr(ser, name)
    return col.array()


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


def stats_weighted(
    a: np.ndarray, counts: np.ndarray | None, means: np.ndarray | None = None
) -> dict[str, float | None]:
    """:func:`stats_np` where row i stands for ``counts[i]`` ticks (None: one each, :func:`stats_np` itself)
    whose mean is ``means[i]`` (None: ``a[i]``)."""
    if counts is None:
        return stats_np(a)
    ok = ~np.isnan(a)
    order = np.argsort(a[ok], kind="stable")
    v, c = a[ok][order], np.rint(counts[ok][order]).astype(np.int64)
    n = int(c.sum())
    if not n:
        return {"peak": None, "median": None, "p95": None, "mean": None, "n": 0}
    cum = np.cumsum(c)
    mv = v if means is None else np.nan_to_num(means[ok][order])
    return {
        "peak": float(v[-1]),
        "median": _quantile_counted(v, cum, 0.5),
        "p95": _quantile_counted(v, cum, 0.95),
        "mean": float((mv * c).sum()) / n,
        "n": n,
    }


def median_of(v: np.ndarray) -> float | None:
    """``np.median`` of the non-NaN values of ``v`` (None: none), the same value by the same partition, without
    np.median's checks and dispatch (the answer takes some 25 medians a GPU, up to once a second)."""
    v = v[~np.isnan(v)]
    n = v.size
    if n == 0:
        return None
    k = n // 2
    if n % 2:
        return float(np.partition(v, k)[k])
    p = np.partition(v, (k - 1, k))
    return float((p[k - 1] + p[k]) / 2)


def median_weighted(a: np.ndarray, counts: np.ndarray | None) -> float | None:
    """np.median of the non-NaN values, row i counted ``counts[i]`` times (None: once each, :func:`median_of`)."""
    if counts is None:
        return median_of(a)
    ok = ~np.isnan(a)
    order = np.argsort(a[ok], kind="stable")
    v, c = a[ok][order], np.rint(counts[ok][order]).astype(np.int64)
    return _quantile_counted(v, np.cumsum(c), 0.5) if c.sum() else None


def _quantile_counted(v: np.ndarray, cum: np.ndarray, q: float) -> float:
    """:func:`_quantile_np` over sorted values ``v`` each repeated as ``cum`` (their running count) says."""
    n = int(cum[-1])
    pos = q * (n - 1)
    lo = int(pos)
    hi = min(lo + 1, n - 1)
    a = float(v[int(np.searchsorted(cum, lo, "right"))])
    b = float(v[int(np.searchsorted(cum, hi, "right"))])
    return a + (b - a) * (pos - lo)


def _quantile_np(v: np.ndarray, q: float) -> float:
    """:func:`quantile` on a sorted array, the same arithmetic."""
    if v.size == 1:
        return float(v[0])
    pos = q * (v.size - 1)
    lo = int(pos)
    hi = min(lo + 1, v.size - 1)
    a, b = float(v[lo]), float(v[hi])
    return a + (b - a) * (pos - lo)


def tick_weights(t: np.ndarray, prev: float | None = None) -> np.ndarray:
    """Seconds each tick stands for: the interval before it (the first tick: the typical one, or the
    interval from ``prev``, the tick before these), holes longer than 5 intervals and steps back cut to
    one interval. The attribution and the what-if both weigh ticks so, and so give a phase the same
    duration."""
    if t.size == 0:
        return t
    dt = np.diff(t, prepend=t[0])
    typical = float(np.median(dt[1:])) if t.size > 1 else 0.1
    dt[0] = typical if prev is None else t[0] - prev
    return np.where((dt > 5 * typical) | (dt < 0), typical, dt)
