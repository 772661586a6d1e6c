"""One validation layer where readings enter: recordings, the NVML collector, the engine clients.

Every per-GPU and per-engine number is checked against a rule (type, finite, physical range).
A value that fails becomes ``None`` ("unavailable", never 0) and the failure is counted by
kind in a :class:`Tally`, which reports each kind once with the file and line where it was
first seen (``report --json`` ``warnings`` and one stderr line per kind).

Rules (see docs/recording-format.md):

* per-GPU figures: the range of their row in :mod:`pcie_tui.core.metrics` (``lo``/``hi``, ``integer``,
  ``allowed``; values in ``(clamp, hi]`` are counter jitter, read as ``clamp`` silently). Today:
  rates ``*_Bps`` 0 .. 2 TB/s; fractions ``dram_bw_util``, ``mem_busy``, ``sm_util`` 0 .. 1 (up to
  1.05 is clamped to 1.0); ``mem_used_bytes`` an integer 0 .. 2**50 (an integral float is taken as
  the integer); ``power_W`` 0 .. 10 kW; ``link_gen`` 1..6, ``link_width`` one of 1, 2, 4, 8, 12, 16, 32;
* engine counters and gauges: a number, finite, >= 0; ``phase``/``error``/``kind`` strings;
  ``up`` a bool.

``bool`` is never a number here (JSON ``true`` where a rate belongs is wrong-typed).
"""

from __future__ import annotations

import math
import operator
from dataclasses import replace
from itertools import repeat
from operator import itemgetter
from pathlib import Path
from typing import TYPE_CHECKING, Any

from pcie_tui.core import metrics
from pcie_tui.core.metrics import LINK_WIDTHS, MAX_LINK_Bps
from pcie_tui.core.model import TYPED_METRICS, EngineSample, GpuSample

if TYPE_CHECKING:
    import numpy as np

ENGINE_NUMBERS = ("prompt_tokens_total", "generation_tokens_total", "requests_running", "requests_waiting")
ENGINE_STRINGS = ("phase", "error")
MAX_GPU_INDEX = 4096

_NUM_TYPES = frozenset({float, int, type(None)})
_NONE = type(None)
_NONE_ONLY = {_NONE}
_INT_TYPES = frozenset({int, type(None)})


class Tally:
    """Counts each kind of rejected value; remembers where it was first seen."""

    def __init__(self, path: str | Path | None = None) -> None:
        self.path = str(path) if path is not None else None
        self.kinds: dict[str, list[Any]] = {}  # kind -> [count, first line or None, note]

    def add(
        self, kind: str, line: int | None = None, n: int = 1, note: str = "read as unavailable", detail: str = ""
    ) -> None:
        """Count one more of ``kind``; ``detail`` (the first case's specifics) is kept from the first."""
        k = self.kinds.get(kind)
        if k is None:
            self.kinds[kind] = [n, line, note, detail]
        else:
            k[0] += n

    def __bool__(self) -> bool:
        return bool(self.kinds)

    def warnings(self) -> list[str]:
        out = []
        for kind, (n, line, note, detail) in self.kinds.items():
            where = self.path or "input"
            if line is not None:
                where += f" line {line}"
            times = f"{n} time" + ("s" if n != 1 else "")
            out.append(f"{where}: {kind}{detail} ({times}; {note})")
        return out


def check_value(key: str, v: Any) -> tuple[Any, str | None]:
    """(value to keep, reason it was rejected or None) for one GPU field (a metrics-table row)."""
    if v is None:
        return None, None
    m = metrics.metric(key)
    if type(v) is bool or not isinstance(v, int | float):
        return None, "wrong type"
    if isinstance(v, float):
        if not math.isfinite(v):
            return None, "not finite"
        if m.integer:
            if not v.is_integer():
                return None, "wrong type"
            v = int(v)
    if not m.lo <= v <= m.hi:
        return None, "out of range"
    if m.allowed is not None and v not in m.allowed:
        return None, "out of range"
    if m.clamp is not None and v > m.clamp:
        return m.clamp, None
    return v, None


def clean_gpu_dict(g: dict[str, Any], tally: Tally, line: int | None = None) -> None:
    """Check every known field of one raw GPU dict, in place."""
    for key in _columns_spec()[0]:
        v = g.get(key)
        if v is None:
            continue
        nv, why = check_value(key, v)
        if why is not None:
            tally.add(f"{key} {why}", line, detail=f" (first: {_show(v)})")
        if nv is not v:
            g[key] = nv


def clean_gpu_sample(s: GpuSample, tally: Tally) -> GpuSample:
    """A collector's GpuSample with every field checked (NVML and GPM can return NaN or junk)."""
    changes: dict[str, Any] = {}
    for key in _columns_spec()[0]:
        v = s.get(key)
        if v is None:
            continue
        nv, why = check_value(key, v)
        if why is not None:
            tally.add(f"GPU {s.index} {key} {why}", detail=f" (first: {_show(v)})")
        if nv is not v:
            changes[key] = nv
    if not changes:
        return s
    typed = {k: v for k, v in changes.items() if k in _TYPED}
    if len(typed) < len(changes):
        extra = {**s.extra, **{k: v for k, v in changes.items() if k not in _TYPED}}
        typed["extra"] = {k: v for k, v in extra.items() if v is not None}
    return replace(s, **typed)


def _engine_number(v: Any) -> tuple[Any, str | None]:
    if v is None:
        return None, None
    if type(v) is bool or not isinstance(v, int | float):
        return None, "wrong type"
    if isinstance(v, float) and not math.isfinite(v):
        return None, "not finite"
    if not 0 <= v <= 1e18:
        return None, "out of range"
    return v, None


def clean_engine_dict(e: dict[str, Any], tally: Tally, line: int | None = None) -> None:
    """Check the engine fields of one raw tick, in place; extra keys go through :func:`scrub`."""
    for key in ENGINE_NUMBERS:
        nv, why = _engine_number(e.get(key))
        if why is not None:
            tally.add(f"engine {key} {why}", line, detail=f" (first: {_show(e.get(key))})")
            e[key] = nv
    for key in ("kind", *ENGINE_STRINGS):
        v = e.get(key)
        if v is not None and not isinstance(v, str):
            tally.add(f"engine {key} wrong type", line, detail=f" (first: {_show(v)})")
            e[key] = None if key != "kind" else ""
    if "up" in e and not isinstance(e["up"], bool):
        tally.add("engine up wrong type", line, detail=f" (first: {_show(e['up'])})")
        e["up"] = False


def _fix_number(d: dict[str, Any], key: str, tally: Tally, lo: float, hi: float, integer: bool, where: str) -> None:
    v = d.get(key)
    if v is None:
        return
    ok = type(v) is not bool and isinstance(v, int | float) and math.isfinite(v) and lo <= v <= hi
    if ok and integer and not float(v).is_integer():
        ok = False
    if not ok:
        tally.add(f"header {where}{key} invalid ({_show(v)})", 1)
        d[key] = None
    elif integer:
        d[key] = int(v)


def clean_header_dict(h: dict[str, Any], tally: Tally) -> None:
    """The header's numbers checked in place: GPU list, link facts, memory size, interval."""
    _fix_number(h, "interval_s", tally, 1e-6, 86_400.0, False, "")
    gpus = h.get("gpus")
    if gpus is None:
        return
    if not isinstance(gpus, list):
        tally.add("header gpus is not a list", 1, note="no GPU facts read")
        h["gpus"] = []
        return
    kept: list[Any] = []
    seen: set[int] = set()
    for g in gpus:
        idx = gpu_index(g.get("index")) if isinstance(g, dict) else None
        if idx is None or idx in seen:
            tally.add("header GPU entry without a usable index", 1, note="left out")
            continue
        seen.add(idx)
        g["index"] = idx
        for k in ("uuid", "name", "pci_bus_id", "metrics_source"):
            if g.get(k) is not None and not isinstance(g[k], str):
                g[k] = str(g[k])
        where = f"GPU {idx} "
        _fix_number(g, "memory_total_bytes", tally, 0, float(1 << 50), True, where)
        _fix_number(g, "nvlink_capacity_Bps", tally, 0, MAX_LINK_Bps * 18, False, where)
        _fix_number(g, "nvlink_count", tally, 0, 64, True, where)
        _fix_number(g, "sm_clock_max_MHz", tally, 1.0, 10_000.0, False, where)
        link = g.get("link")
        if link is not None and not isinstance(link, dict):
            tally.add(f"header {where}link is not an object", 1, note="link facts unavailable")
            g["link"] = link = None
        if link:
            for k in ("gen", "max_gen"):
                _fix_number(link, k, tally, 1, 6, True, where)
            for k in ("width", "max_width"):
                _fix_number(link, k, tally, 1, 32, True, where)
                if link.get(k) is not None and link[k] not in LINK_WIDTHS:
                    tally.add(f"header {where}{k} invalid ({link[k]!r})", 1)
                    link[k] = None
            for k in ("capacity_Bps", "measured_Bps"):
                _fix_number(link, k, tally, 1.0, MAX_LINK_Bps, False, where)
        kept.append(g)
    h["gpus"] = kept


def clean_engine_sample(s: EngineSample, tally: Tally) -> EngineSample:
    """An engine client's EngineSample with counters and gauges checked (and extra scrubbed)."""
    d = s.to_json()
    before = len(tally.kinds), sum(k[0] for k in tally.kinds.values())
    clean_engine_dict(d, tally)
    scrub(d, tally)
    after = len(tally.kinds), sum(k[0] for k in tally.kinds.values())
    return s if after == before else EngineSample.from_json(d)


def scrub(obj: Any, tally: Tally, line: int | None = None) -> Any:
    """Non-finite floats anywhere in a JSON value become None, in place (returns obj)."""
    if isinstance(obj, dict):
        for k, v in obj.items():
            if isinstance(v, float) and not math.isfinite(v):
                obj[k] = None
                tally.add(f"{k} not finite (NaN, infinite or beyond float range)", line)
            elif isinstance(v, dict | list):
                scrub(v, tally, line)
    elif isinstance(obj, list):
        for i, v in enumerate(obj):
            if isinstance(v, float) and not math.isfinite(v):
                obj[i] = None
                tally.add("a list item not finite (NaN, infinite or beyond float range)", line)
            elif isinstance(v, dict | list):
                scrub(v, tally, line)
    return obj


def finite_json(obj: Any) -> Any:
    """A copy of a JSON value with every non-finite float replaced by None (RFC 8259 output)."""
    if isinstance(obj, float):
        return obj if math.isfinite(obj) else None
    if isinstance(obj, dict):
        return {str(k): finite_json(v) for k, v in obj.items()}
    if isinstance(obj, list | tuple):
        return [finite_json(v) for v in obj]
    return obj


def _show(v: Any) -> str:
    r = repr(v)
    return r if len(r) <= 40 else r[:37] + "..."


def gpu_columns_ok(flat: list[dict[str, Any]]) -> bool:
    """Whether every known field of every raw GPU dict passes, checked in a few C-level sweeps.

    The common case (a clean recording) costs one itemgetter sweep, a transposition, a type sweep per
    field that holds a value and a numpy range check of those fields; any doubt sends the caller to
    :func:`clean_gpu_dict` per dict. Rows never hold NaN here: orjson yields none, and the stdlib path
    scrubs them as it parses.
    """
    if not flat:
        return True
    keys = _columns_spec()[0]
    import numpy as np  # here, not at import: the live recorder validates scalars only

    got = _matrix(flat, keys)
    if got is None:
        return False
    m, read = got
    lo, hi, int_cols, allowed = _bounds()
    with np.errstate(invalid="ignore"):
        for i in read:  # a field absent or null everywhere is NaN: nothing to check
            row = m[i]
            if bool((row < lo[i]).any()) or bool((row > hi[i]).any()):
                return False
            if i in int_cols and not bool(np.all((row == np.floor(row)) | np.isnan(row))):
                return False
            ok = allowed.get(i)
            if ok is not None and not bool(np.isin(row[~np.isnan(row)], ok).all()):
                return False
    remember_columns(flat, m, keys)
    return True


def remember_columns(flat: list[Any], m: np.ndarray, keys: tuple[str, ...]) -> None:
    """Keep the checked matrix of these GPU entries (``keys`` x entries) for :func:`cached_columns`."""
    global _last
    _last = (tuple(flat), m, keys)  # the entries themselves: their ids cannot be reused while held


def _matrix(flat: list[dict[str, Any]], keys: tuple[str, ...]) -> tuple[np.ndarray, list[int]] | None:
    """``keys`` x samples as floats (None and absent -> NaN) and the rows that hold a value, or None where a
    value is not a number. The usual case: every dict holds the very same keys (the first one's), so one
    itemgetter sweep and a transposition give every present field's column; else a column per known key."""
    import numpy as np

    n = len(flat)
    first = flat[0]
    present = [k for k in keys if k in first]
    others = [k for k in first if k not in present]  # ``index`` and any unknown field: they fix the key set
    cols: list[Any] | None = None
    if present and set(map(len, flat)) == {len(first)}:
        try:
            rows = list(map(itemgetter(*present, *others), flat))
        except KeyError:
            rows = None
        if rows is not None:  # every dict has exactly the first one's keys
            cols = list(zip(*rows, strict=True)) if len(present) + len(others) > 1 else [rows]
    if cols is None:
        present = list(keys)
        cols = [list(map(dict.get, flat, repeat(k))) for k in keys]
    m = np.full((len(keys), n), np.nan)
    read: list[int] = []
    for k, col in zip(present, cols, strict=False):  # (the columns of ``others`` come last: left out)
        types = set(map(type, col))
        if types == _NONE_ONLY:
            continue
        if types - _NUM_TYPES:
            return None
        i = keys.index(k)
        m[i] = col if _NONE in types else np.fromiter(col, np.float64, n)  # (None -> NaN)
        read.append(i)
    return m, read


def cached_columns(flat: list[dict[str, Any]], keys: tuple[str, ...]) -> np.ndarray | None:
    """The float matrix :func:`gpu_columns_ok` just built for these same GPU dicts (keys x samples), once.

    The analyzer (:mod:`pcie_tui.analyze.columns`) needs the same columns; handing them over saves
    building them twice. Only for the very same dicts in the very same order (each one compared by
    identity, so a list reordered or edited since gets None). Any metrics-table rows in any order;
    a prefix of the table's order comes without a copy.
    """
    global _last
    if _last is None or not flat:
        return None
    seen, a, built = _last
    if len(seen) != len(flat) or not set(keys) <= set(built):
        return None
    if not all(map(operator.is_, seen, flat)):
        return None
    _last = None
    if keys == built[: len(keys)]:
        return a[: len(keys)]
    return a[[built.index(k) for k in keys]]


@metrics.per_table
def _columns_spec() -> tuple[tuple[str, ...]]:
    """The checked GPU fields (the metrics table, in its order)."""
    return (metrics.names(),)


@metrics.per_table
def _bounds() -> tuple[np.ndarray, np.ndarray, frozenset[int], dict[int, np.ndarray]]:
    """Per-field bounds (a clamped row's upper bound is its clamp: above it, the per-dict path clamps),
    the integer fields, and the valid values of fields with a fixed set (by position in the table)."""
    import numpy as np

    table = metrics.table()
    return (
        np.array([m.lo for m in table]),
        np.array([m.clamp if m.clamp is not None else m.hi for m in table]),
        frozenset(i for i, m in enumerate(table) if m.integer),
        {i: np.array(sorted(m.allowed), dtype=np.float64) for i, m in enumerate(table) if m.allowed is not None},
    )


_TYPED = frozenset(TYPED_METRICS)
_last: tuple[tuple[Any, ...], np.ndarray, tuple[str, ...]] | None = None


MAX_ABS_T = 1e11  # unix seconds; year 5138


def tick_time(v: Any) -> float | None:
    """A tick's ``t`` as a finite float within +-1e11 s, else None."""
    if type(v) is bool or not isinstance(v, int | float):
        return None
    f = float(v)
    return f if -MAX_ABS_T <= f <= MAX_ABS_T else None


def gpu_index(v: Any) -> int | None:
    if type(v) is bool or not isinstance(v, int) or not 0 <= v <= MAX_GPU_INDEX:
        if isinstance(v, float) and v.is_integer() and 0 <= v <= MAX_GPU_INDEX:
            return int(v)
        return None
    return v
