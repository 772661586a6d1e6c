"""A recording's ticks checked as a sequence: structure, values, time order, segments and gaps.

* A tick needs a usable ``t`` (a finite number within +-1e11 s) and ``gpus`` a list; a GPU entry
  needs an integer ``index``. Entries that fail are left out, counted by kind.
* A GPU index that the header does not list (when the header lists any) is left out with one
  warning, so ``report`` and ``replay`` agree.
* Values go through :mod:`pcie_tui.recording.validate` (``validate=True``).
* Time must increase: a tick at or before the latest kept time is set aside (named in one
  warning per kind, never merged).
* A second header line starts a new segment; a hole longer than ``GAP_INTERVALS`` intervals
  (at least ``GAP_MIN_S``) between kept ticks is a gap: listed, and left out of verdict time,
  engine rates and replay pacing.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from itertools import chain, compress, repeat
from operator import is_not, itemgetter
from typing import Any

import numpy as np

from pcie_tui.core.model import SessionHeader
from pcie_tui.recording.typed import TypedBlock, typed_columns
from pcie_tui.recording.validate import (
    ENGINE_NUMBERS,
    MAX_ABS_T,
    MAX_GPU_INDEX,
    Tally,
    clean_engine_dict,
    clean_gpu_dict,
    gpu_columns_ok,
    gpu_index,
    remember_columns,
    tick_time,
)

GAP_INTERVALS = 5
GAP_MIN_S = 1.0


@dataclass
class Checked:
    """Where a recording breaks, and what reading it had to allow for (:meth:`TickChecker.finish`)."""

    segments: list[dict[str, Any]] = field(default_factory=list)
    gaps: list[dict[str, Any]] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)


def gap_threshold_s(interval_s: Any, times: np.ndarray) -> float:
    """Seconds between two ticks above which the hole is a gap."""
    iv = interval_s if isinstance(interval_s, int | float) and 0 < interval_s < 86_400 else None
    if iv is None and times.size > 2:
        iv = float(np.median(np.diff(times)))
    return max(GAP_INTERVALS * (iv or 0.0), GAP_MIN_S)


@dataclass
class BlockColumns:
    """What the bulk check of a block of ticks swept out of them, handed on so the analysis need not sweep
    the same dicts again: per tick its time (float) and engine reading (None where it has none) and its
    GPU list; every GPU entry of the block in order, and each one's index."""

    rows: list[dict[str, Any]]  # the very list checked (and kept whole)
    t: np.ndarray
    engine: list[Any]
    gpus: list[list[dict[str, Any]]]
    flat: list[dict[str, Any]]
    index: list[int]
    # Where every tick has an engine reading: the fields checked, per tick ("up" False where absent); a typed
    # block's holds only those the analysis reads (phase, up, the two token counters).
    engine_fields: dict[str, list[Any]] | None = None
    # Every key any engine reading of the block holds, where the check knows it (a typed block), else None: a
    # consumer skips its sweep over the readings for a key none holds.
    engine_keys: frozenset[str] | None = None


def _fast_ok(header: SessionHeader, ticks: list[dict[str, Any]], validate: bool) -> BlockColumns | None:
    """The block's columns when every check passes in bulk (the usual case), else None."""
    ts = list(map(itemgetter("t"), ticks))
    if set(map(type, ts)) - {float, int}:
        return None
    t = np.array(ts, dtype=np.float64)
    if t.size and (float(np.abs(t).max()) > MAX_ABS_T or (t.size > 1 and not bool(np.all(t[1:] > t[:-1])))):
        return None
    gl = list(map(itemgetter("gpus"), ticks))
    if set(map(type, gl)) - {list}:
        return None
    flat = list(chain.from_iterable(gl))
    if set(map(type, flat)) - {dict}:
        return None
    try:
        idx = list(map(itemgetter("index"), flat))
    except KeyError:
        return None
    if set(map(type, idx)) - {int}:
        return None
    known = {g.index for g in header.gpus}
    if idx and (min(idx) < 0 or max(idx) > MAX_GPU_INDEX or (known and set(idx) - known)):
        return None
    if max(map(len, gl), default=0) > 1 and any(len(g) != len({x["index"] for x in g}) for g in gl if len(g) > 1):
        return None  # (a block of at most one GPU entry per tick has no GPU twice in a tick: no Python sweep)
    engine: list[Any] = list(map(dict.get, ticks, repeat("engine")))
    fields = None
    if validate:
        if not gpu_columns_ok(flat):
            return None
        every = set(map(type, engine)) == {dict}
        engines = engine if every else [e for e in engine if type(e) is dict]
        fields = _engines_ok(engines) if engines else {}
        if fields is None:
            return None
        fields = fields if every else None
    return BlockColumns(ticks, t, engine, gl, flat, idx, fields)


def _engines_ok(engines: list[dict[str, Any]]) -> dict[str, list[Any]] | None:
    """Every engine dict's numbers in range, its words strings, ``up`` a bool (column by column,
    each read at C speed): the columns read, by field, when all pass, else None."""
    out = _engine_columns(engines)
    for k in ENGINE_NUMBERS:
        vals = out[k]
        types = set(map(type, vals))
        if types - _NUMBER_TYPES or not numbers_in_range(vals, types):
            return None
    if any(not _WORD_TYPES.issuperset(map(type, out[k])) for k in ("kind", "phase", "error")):
        return None
    return None if set(map(type, out["up"])) - {bool} else out


def _engine_columns(engines: list[dict[str, Any]]) -> dict[str, list[Any]]:
    """The fields the check reads, of every engine dict, by field (None where absent; ``up`` False where
    absent). The usual block (every dict holds the numbers, kind, phase and up) is read in one itemgetter
    sweep and a transposition."""
    try:
        got: list[list[Any]] = list(map(list, zip(*map(_ENGINE_GET, engines), strict=True))) if engines else []
    except KeyError:
        got = []
    if len(got) != len(_ENGINE_KEYS):
        got = [list(map(dict.get, engines, repeat(k))) for k in _ENGINE_KEYS[:-1]]
        got.append(list(map(dict.get, engines, repeat("up"), repeat(False))))
    out = dict(zip(_ENGINE_KEYS, got, strict=True))
    out["error"] = list(map(dict.get, engines, repeat("error")))
    return out


def numbers_in_range(vals: list[Any], types: set[type]) -> bool:
    """Whether every number of ``vals`` (floats, ints and Nones, as ``types`` says) lies in [0, 1e18]."""
    if int not in types:  # floats and Nones (the usual case): one numpy sweep (None -> NaN, as is a NaN: out)
        a = np.array(vals, dtype=np.float64)
        inside = int(np.count_nonzero((a >= 0) & (a <= 1e18)))
        return inside + (vals.count(None) if type(None) in types else 0) == len(vals)
    nums = list(compress(vals, map(is_not, vals, repeat(None)))) if type(None) in types else vals
    return not nums or (min(nums) >= 0 and max(nums) <= 1e18)  # ints compared exactly, as Python does


_ENGINE_KEYS = (*ENGINE_NUMBERS, "kind", "phase", "up")
_ENGINE_GET = itemgetter(*_ENGINE_KEYS)
_NUMBER_TYPES = frozenset({float, int, type(None)})
_WORD_TYPES = frozenset({str, type(None)})


class TickChecker:
    """The checks of a recording's ticks, fed chunk by chunk in file order (a long recording is never
    held whole): what a chunk keeps comes back at once; segments, gaps and warnings at :meth:`finish`.

    A chunk that passes every check in bulk (the usual case) is kept as it is; otherwise each tick is
    checked and cleaned alone. The gap threshold is taken from the header's interval, else from the
    first chunk's median spacing (the whole file's, for a file of one chunk).
    """

    def __init__(self, header: SessionHeader, tally: Tally, *, validate: bool = True) -> None:
        self.header = header
        self.tally = tally
        self.validate = validate
        self.known = {g.index for g in header.gpus}
        self.latest = float("-inf")
        self.all_fast = True  # no chunk needed a tick-by-tick check, no second header
        self.segments: list[dict[str, Any]] = [{"line": 1, "start": None, "end": None, "ticks": 0, "set_aside": 0}]
        self.gaps: list[dict[str, Any]] = []
        self._limit: float | None = None
        self.latest_kept_t = float("-inf")  # the previous chunk's last kept tick (the slow path moves latest first)
        self._seg_pending = False  # a later header's segment has no kept tick yet
        self.columns: BlockColumns | None = None  # the last chunk's, when it passed in bulk

    def feed(
        self, ticks: list[dict[str, Any]], line_numbers: Callable[[], list[int]], heads: Sequence[tuple[int, int]] = ()
    ) -> list[dict[str, Any]]:
        """Check one chunk: ``heads`` are (position in ``ticks``, line) of the header lines among them.
        A chunk kept whole leaves the columns its check swept in ``columns``."""
        self.columns = None
        if not ticks and not heads:
            return ticks
        cols = None
        if not heads and not self._seg_pending:
            cols = _fast_ok(self.header, ticks, self.validate)
            if cols is not None and cols.t.size and cols.t[0] <= self.latest:
                cols = None
        if cols is not None:
            self.columns = cols
            self._fast(ticks, cols.t, line_numbers)
            return ticks
        self.all_fast = False
        return self._slow(ticks, line_numbers(), dict(heads))

    def feed_typed(self, block: TypedBlock, line_numbers: Callable[[], list[int]]) -> bool:
        """Check one chunk of typed ticks (:mod:`pcie_tui.recording.typed`, values checked as they were
        decoded): True when it passes whole (``columns`` then holds what the check took from it); False
        where it does not, and nothing is counted: the caller reads the chunk again as raw dicts."""
        self.columns = None
        ticks = block.ticks
        if not ticks or self._seg_pending or not self.validate:
            return False
        got = typed_columns(self.header, block, self.latest)
        if got is None:
            return False
        t, engine, gl, flat, idx, m, names, fields, keys = got
        remember_columns(flat, m, names)
        self.columns = BlockColumns(ticks, t, engine, gl, flat, idx, fields, keys)
        self._fast(ticks, t, line_numbers)
        return True

    def _fast(self, ticks: list[Any], t: np.ndarray, line_numbers: Callable[[], list[int]]) -> None:
        if not t.size:
            return
        seg = self.segments[-1]
        seg["start"] = float(t[0]) if seg["start"] is None else seg["start"]
        seg["end"] = float(t[-1])
        seg["ticks"] += int(t.size)
        self._gaps(t, line_numbers, {})

    def _slow(self, ticks: list[dict[str, Any]], lines: list[int], starts: dict[int, int]) -> list[dict[str, Any]]:
        kept: list[dict[str, Any]] = []
        kept_lines: list[int] = []
        seg_first: dict[int, int] = {}  # position in kept -> header line of the segment it starts
        segments, tally = self.segments, self.tally
        for i, d in enumerate(ticks):
            if i in starts:
                segments.append({"line": starts[i], "start": None, "end": None, "ticks": 0, "set_aside": 0})
                self._seg_pending = True
            t = self._checked(d, lines[i])
            if t is None:
                continue
            seg = segments[-1]
            if t <= self.latest:
                what = "repeats" if t == self.latest else "goes back"
                tally.add(
                    f"time {what}",
                    lines[i],
                    note="ticks set aside, not merged",
                    detail=f" (first: t={t:.3f} after {self.latest:.3f})",
                )
                seg["set_aside"] += 1
                continue
            self.latest = t
            if self._seg_pending:
                seg_first[len(kept)] = seg["line"]
                self._seg_pending = False
            seg["start"] = t if seg["start"] is None else seg["start"]
            seg["end"] = t
            seg["ticks"] += 1
            kept.append(d)
            kept_lines.append(lines[i])
        for p, line in starts.items():  # headers after the chunk's last tick
            if p >= len(ticks):
                segments.append({"line": line, "start": None, "end": None, "ticks": 0, "set_aside": 0})
                self._seg_pending = True
        times = np.fromiter((d["t"] for d in kept), dtype=np.float64, count=len(kept))
        self._gaps(times, lambda: kept_lines, seg_first)
        return kept

    def _checked(self, d: dict[str, Any], line: int) -> float | None:
        """The tick's time, its GPU entries and engine cleaned in place; None: no usable time."""
        t = tick_time(d.get("t"))
        if t is None:
            self.tally.add(
                "tick without a usable time t", line, note="tick skipped", detail=f" (first: {d.get('t')!r:.40})"
            )
            return None
        d["t"] = t
        d["gpus"] = _tick_gpus(d.get("gpus"), self.known, self.tally, line, self.validate)
        eng = d.get("engine")
        if self.validate and isinstance(eng, dict):
            clean_engine_dict(eng, self.tally, line)
        return t

    def _gaps(self, t: np.ndarray, line_numbers: Callable[[], list[int]], seg_first: dict[int, int]) -> None:
        """Gaps between this chunk's kept ticks and from the previous chunk's last one."""
        if not t.size:
            return
        if self._limit is None:
            self._limit = gap_threshold_s(self.header.interval_s, t)
        prev = self.latest_kept_t if self.latest_kept_t > float("-inf") else None
        full = np.concatenate(([prev], t)) if prev is not None else t
        off = 1 if prev is not None else 0  # position in full of the chunk's first tick
        dt = np.diff(full)
        where = set(np.flatnonzero(dt > self._limit).tolist()) | {p + off - 1 for p in seg_first if p + off > 0}
        if where:
            lines = line_numbers()
            for j in sorted(where):
                nxt = j + 1 - off  # the tick after the hole, in this chunk
                self.gaps.append(
                    {
                        "event": "recording_gap",
                        "start": float(full[j]),
                        "end": float(full[j + 1]),
                        "duration_s": float(dt[j]),
                        "line": lines[nxt],
                        "reason": f"new segment (header at line {seg_first[nxt]})" if nxt in seg_first else "no ticks",
                    }
                )
        self.latest_kept_t = float(t[-1])
        self.latest = max(self.latest, self.latest_kept_t)

    def finish(self) -> Checked:
        """Segments, gaps and the warnings of the whole recording."""
        out = Checked()
        segments = self.segments
        if self.all_fast:
            seg = segments[0]
            if seg["ticks"]:
                out.segments = [{"line": 1, "start": seg["start"], "end": seg["end"], "ticks": seg["ticks"]}]
        else:
            out.segments = [s for s in segments if s["ticks"] or s["set_aside"]]
            if len(segments) > 1:
                desc = ", ".join(
                    f"line {s['line']}: {s['ticks']} ticks"
                    + (f", {s['set_aside']} set aside" if s["set_aside"] else "")
                    for s in segments
                )
                out.warnings.append(f"{self.tally.path}: holds {len(segments)} recordings (a header at each of {desc})")
        out.gaps = self.gaps
        if self.gaps:
            longest = max(self.gaps, key=itemgetter("duration_s"))
            self.tally.add(
                f"{len(self.gaps)} gap(s) longer than {self._limit:g} s between ticks (longest "
                f"{longest['duration_s']:.1f} s before line {longest['line']})",
                None,
                note="left out of verdict time, rates and replay pacing",
            )
        return out


def _tick_gpus(gpus: Any, known: set[int], tally: Tally, line: int, validate: bool) -> list[dict[str, Any]]:
    """A tick's GPU entries that can be read: each with a usable integer index, once per tick, and
    (where the header lists GPUs) one of the header's; with ``validate``, values cleaned. Every entry
    left out is tallied against ``line``."""
    if gpus is None:
        gpus = []
    elif not isinstance(gpus, list):
        tally.add("gpus is not a list", line, note="tick read without GPU readings")
        gpus = []
    good = []
    seen: set[int] = set()
    for g in gpus:
        idx = gpu_index(g.get("index")) if isinstance(g, dict) else None
        if idx is None:
            tally.add("GPU entry without a usable integer index", line, note="entry left out")
            continue
        if idx in seen:
            tally.add(f"GPU {idx} twice in one tick", line, note="second entry left out")
            continue
        if known and idx not in known:
            tally.add(
                f"GPU {idx} is not in the header (it lists {sorted(known)})",
                line,
                note="its readings are left out of report and replay alike",
            )
            continue
        seen.add(idx)
        g["index"] = idx
        if validate:
            clean_gpu_dict(g, tally, line)
        good.append(g)
    return good
