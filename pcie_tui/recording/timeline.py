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

from collections.abc import Callable
from dataclasses import dataclass, field
from itertools import chain
from operator import itemgetter
from typing import Any

import numpy as np

from pcie_tui.core.model import SessionHeader
from pcie_tui.recording.validate import (
    ENGINE_NUMBERS,
    MAX_ABS_T,
    MAX_GPU_INDEX,
    Tally,
    clean_engine_dict,
    clean_gpu_dict,
    gpu_columns_ok,
    gpu_index,
    tick_time,
)

GAP_INTERVALS = 5
GAP_MIN_S = 1.0


@dataclass
class Checked:
    ticks: list[dict[str, Any]]
    segments: list[dict[str, Any]] = field(default_factory=list)
    gaps: list[dict[str, Any]] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)


def gap_threshold_s(interval_s: Any, times: np.ndarray) -> float:
    """Seconds between two ticks above which the hole is a gap."""
    iv = interval_s if isinstance(interval_s, int | float) and 0 < interval_s < 86_400 else None
    if iv is None and times.size > 2:
        iv = float(np.median(np.diff(times)))
    return max(GAP_INTERVALS * (iv or 0.0), GAP_MIN_S)


def _fast_ok(header: SessionHeader, ticks: list[dict[str, Any]], validate: bool) -> np.ndarray | None:
    """The tick times when every check passes in bulk (the usual case), else None."""
    ts = list(map(itemgetter("t"), ticks))
    if set(map(type, ts)) - {float, int}:
        return None
    t = np.array(ts, dtype=np.float64)
    if t.size and (float(np.abs(t).max()) > MAX_ABS_T or (t.size > 1 and not bool(np.all(t[1:] > t[:-1])))):
        return None
    gl = [d["gpus"] for d in ticks]
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
    if any(len(g) != len({x["index"] for x in g}) for g in gl if len(g) > 1):
        return None
    if validate:
        if not gpu_columns_ok(flat):
            return None
        engines = [e for d in ticks if type(e := d.get("engine")) is dict]
        if engines and not _engines_ok(engines):
            return None
    return t


def _engines_ok(engines: list[dict[str, Any]]) -> bool:
    for k in ENGINE_NUMBERS:
        vals = [e.get(k) for e in engines]
        if set(map(type, vals)) - {float, int, type(None)}:
            return False
        nums = [v for v in vals if v is not None]
        if nums and not (min(nums) >= 0 and max(nums) <= 1e18):
            return False
    for k in ("kind", "phase", "error"):
        if set(type(e.get(k)) for e in engines) - {str, type(None)}:
            return False
    return not set(type(e.get("up", False)) for e in engines) - {bool}


def check_ticks(
    header: SessionHeader,
    ticks: list[dict[str, Any]],
    line_numbers: Callable[[], list[int]],
    heads: list[int],
    head_lines: list[int],
    tally: Tally,
    *,
    validate: bool = True,
) -> Checked:
    t = _fast_ok(header, ticks, validate) if not heads else None
    if t is not None:
        out = Checked(ticks)
        if ticks:
            out.segments = [{"line": 1, "start": float(t[0]), "end": float(t[-1]), "ticks": len(ticks)}]
        _gaps(header, out, t, line_numbers, {}, tally)
        return out
    return _slow(header, ticks, line_numbers(), heads, head_lines, tally, validate)


def _slow(
    header: SessionHeader,
    ticks: list[dict[str, Any]],
    lines: list[int],
    heads: list[int],
    head_lines: list[int],
    tally: Tally,
    validate: bool,
) -> Checked:
    known = {g.index for g in header.gpus}
    starts = dict(zip(heads, head_lines, strict=True))
    kept: list[dict[str, Any]] = []
    kept_lines: list[int] = []
    seg_first: dict[int, int] = {}  # position in kept -> header line of the segment it starts
    segments: list[dict[str, Any]] = [{"line": 1, "start": None, "end": None, "ticks": 0, "set_aside": 0}]
    latest = float("-inf")
    for i, d in enumerate(ticks):
        if i in starts:
            segments.append({"line": starts[i], "start": None, "end": None, "ticks": 0, "set_aside": 0})
        seg = segments[-1]
        line = lines[i]
        t = tick_time(d.get("t"))
        if t is None:
            tally.add("tick without a usable time t", line, note="tick skipped", detail=f" (first: {d.get('t')!r:.40})")
            continue
        d["t"] = t
        d["gpus"] = _tick_gpus(d.get("gpus"), known, tally, line, validate)
        eng = d.get("engine")
        if validate and isinstance(eng, dict):
            clean_engine_dict(eng, tally, line)
        if t <= latest:
            what = "repeats" if t == latest else "goes back"
            tally.add(
                f"time {what}",
                line,
                note="ticks set aside, not merged",
                detail=f" (first: t={t:.3f} after {latest:.3f})",
            )
            seg["set_aside"] += 1
            continue
        latest = t
        if seg["ticks"] == 0 and len(segments) > 1:
            seg_first[len(kept)] = seg["line"]
        seg["start"] = t if seg["start"] is None else seg["start"]
        seg["end"] = t
        seg["ticks"] += 1
        kept.append(d)
        kept_lines.append(line)
    out = Checked(kept, [s for s in segments if s["ticks"] or s["set_aside"]])
    if len(segments) > 1:
        desc = ", ".join(
            f"line {s['line']}: {s['ticks']} ticks" + (f", {s['set_aside']} set aside" if s["set_aside"] else "")
            for s in segments
        )
        out.warnings.append(f"{tally.path}: holds {len(segments)} recordings (a header at each of {desc})")
    times = np.fromiter((d["t"] for d in kept), dtype=np.float64, count=len(kept))
    _gaps(header, out, times, lambda: kept_lines, seg_first, tally)
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


def _gaps(
    header: SessionHeader,
    out: Checked,
    t: np.ndarray,
    line_numbers: Callable[[], list[int]],
    seg_first: dict[int, int],
    tally: Tally,
) -> None:
    if t.size < 2:
        return
    limit = gap_threshold_s(header.interval_s, t)
    dt = np.diff(t)
    where = set(np.flatnonzero(dt > limit).tolist()) | {p - 1 for p in seg_first if p > 0}
    if not where:
        return
    lines = line_numbers()
    for j in sorted(where):
        gap = {
            "event": "recording_gap",
            "start": float(t[j]),
            "end": float(t[j + 1]),
            "duration_s": float(dt[j]),
            "line": lines[j + 1],
            "reason": f"new segment (header at line {seg_first[j + 1]})" if j + 1 in seg_first else "no ticks",
        }
        out.gaps.append(gap)
    longest = max(out.gaps, key=itemgetter("duration_s"))
    tally.add(
        f"{len(out.gaps)} gap(s) longer than {limit:g} s between ticks (longest {longest['duration_s']:.1f} s "
        f"before line {longest['line']})",
        None,
        note="left out of verdict time, rates and replay pacing",
    )
