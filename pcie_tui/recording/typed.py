"""Typed decoding of a block of tick lines for ``report``: each line straight into compact structs, the
value rules checked inside the decoder (C), the analysis's columns taken from struct attributes.

A block is decoded this way only when every line is a plain tick whose every field is one this module
types and whose every value passes the rules as the decoder states them (a type, a range, an allowed
set); any other block (a damaged line, an event or header line, an unknown or odd field, a value the
rules would clean, an integral float where an integer belongs) is read as before, as raw dicts, so
what is reported never depends on which way a block was read.

Engine readings stay dicts, each decoded once for a run of ticks that repeat it byte for byte: the
engine is polled more slowly than the GPUs, and an idle engine reads the same, so most ticks repeat the
reading before them (81 % in h200-pageable, 96-100 % in the idle-heavy demos). Such ticks share one
dict, which the report only ever reads.

* GPU figures: per metrics-table row ``int | float`` in ``[lo, clamp or hi]`` (``int`` where the row is
  an integer, one of ``allowed`` where it has a set); ``index`` an int in ``[0, MAX_GPU_INDEX]``.
* ``t``: ``int | float`` within +-``MAX_ABS_T``; ``gpus`` a list; ``engine`` an object in every tick; no other key.
* Engine readings: any JSON value nested at most ``_NESTING`` deep, integers within 64 bits (orjson reads
  a wider one as a float).
* Engine fields the bulk check reads (``ENGINE_FIELDS``): the four counters a number in ``[0, 1e18]`` or
  null (ints compared exactly), ``kind``/``phase``/``error`` a string or null, ``up`` a bool (False
  where absent).
"""

from __future__ import annotations

import math
from itertools import chain
from operator import attrgetter
from typing import Annotated, Any, Literal, NamedTuple

import msgspec
import numpy as np
from msgspec.structs import astuple

from pcie_tui.core import metrics
from pcie_tui.core.model import SessionHeader
from pcie_tui.recording.validate import ENGINE_NUMBERS, MAX_ABS_T, MAX_GPU_INDEX

_INT64 = Annotated[int, msgspec.Meta(ge=-(1 << 63), le=(1 << 63) - 1)]  # orjson reads wider ones as floats
_NESTING = 6  # an engine reading nested deeper is read raw


def _json_value(depth: int) -> Any:
    """Any JSON value nested at most ``depth`` deep whose integers orjson reads as ints (beyond 64 bits it
    reads a float; the decoder's untyped values would keep the int)."""
    leaf: Any = bool | _INT64 | float | str | None
    if depth == 0:
        return leaf
    inner = _json_value(depth - 1)
    return bool | _INT64 | float | str | list[inner] | dict[str, inner] | None  # type: ignore[valid-type]


def _figure_type(m: metrics.Metric) -> Any:
    """The decoder's type of one GPU figure: its rule as a type (null allowed)."""
    top = m.clamp if m.clamp is not None else m.hi
    if m.allowed is not None:
        return Literal[tuple(sorted(m.allowed))] | None
    as_int = Annotated[int, msgspec.Meta(ge=math.ceil(m.lo), le=math.floor(top))]
    if m.integer:
        return as_int | None
    return as_int | Annotated[float, msgspec.Meta(ge=m.lo, le=top)] | None


@metrics.per_table
def _types() -> tuple[Any, Any, tuple[str, ...]]:
    """(GPU struct, tick struct, the figure names in table order) for the metrics table as it is now."""
    names = metrics.names()
    table = {m.name: m for m in metrics.table()}
    gpu = msgspec.defstruct(
        "TypedGpu",
        [("index", Annotated[int, msgspec.Meta(ge=0, le=MAX_GPU_INDEX)])]
        + [(n, _figure_type(table[n]), None) for n in names],
        gc=False,
        forbid_unknown_fields=True,
    )
    lim = int(MAX_ABS_T)
    t_type = Annotated[int, msgspec.Meta(ge=-lim, le=lim)] | Annotated[float, msgspec.Meta(ge=-MAX_ABS_T, le=MAX_ABS_T)]
    # The engine reading is taken whole (any JSON value) and decoded apart, once per run of repeats.
    tick = msgspec.defstruct(
        "TypedTick",
        [("t", t_type), ("gpus", list[gpu]), ("engine", msgspec.Raw, None)],  # type: ignore[valid-type]
        gc=False,
        forbid_unknown_fields=True,
    )
    return gpu, tick, names


@metrics.per_table
def _decoder() -> Any:
    return msgspec.json.Decoder(_types()[1])


_ENGINE_DECODER = msgspec.json.Decoder(dict[str, _json_value(_NESTING)])  # type: ignore[valid-type,misc]

# The engine fields the bulk check reads (timeline._engines_ok), with its rules as types: a number in
# [0, 1e18] or null (ints compared exactly), a word a string or null, ``up`` a bool (False where absent).
# Every other key is left to the dict.
_COUNT = Annotated[int, msgspec.Meta(ge=0, le=10**18)] | Annotated[float, msgspec.Meta(ge=0.0, le=1e18)] | None
ENGINE_FIELDS = (*ENGINE_NUMBERS, "kind", "phase", "up", "error")
_EngineFields = msgspec.defstruct(
    "EngineFields",
    [*((k, _COUNT, None) for k in ENGINE_NUMBERS), ("kind", str | None, None), ("phase", str | None, None)]
    + [("up", bool, False), ("error", str | None, None)],
    gc=False,
)
_FIELDS_DECODER = msgspec.json.Decoder(_EngineFields)
# The fields the analysis reads per tick (timeline.BlockColumns.engine_fields); the others are only checked.
_FIELD_GETTERS = tuple((k, attrgetter(k)) for k in ("prompt_tokens_total", "generation_tokens_total", "phase", "up"))


class TypedBlock(NamedTuple):
    """A block's typed ticks (each one's ``engine`` a dict) and, per tick, its engine's checked fields
    (``ENGINE_FIELDS``, a struct shared by the ticks that share the dict); every key any of its engine
    readings holds (each distinct reading's keys swept once)."""

    ticks: list[Any]
    fields: list[Any]
    engine_keys: frozenset[str]


def decode_block(block: bytes | memoryview, newlines: np.ndarray | None = None) -> TypedBlock | None:
    """Every non-empty line of ``block`` (lines joined by newlines) as a typed tick, or None where any line
    cannot be or has no engine reading (the block is read raw). A block whose every line starts with ``{``
    and ends with ``}`` is decoded in one call, and kept only where it gave one value a line: JSON allows
    no ``}`` then ``{`` inside a value, nor a raw newline in a string, so no value spans lines and a line
    holding two values would give one too many. Any other block (blank lines, CRLF) is decoded line by
    line. ``newlines``: the offsets of the block's newlines, where the caller has them."""
    dec = _decoder()
    try:
        n = _braced_lines(block, newlines)
        if n:
            ticks = dec.decode_lines(block)
            if len(ticks) != n:
                return None
        else:
            lines = bytes(block).split(b"\n")
            if b"" in lines:
                lines = [x for x in lines if x]
            ticks = list(map(dec.decode, lines))
        fields, keys = _decode_engines(ticks)
        return TypedBlock(ticks, fields, keys)
    except (msgspec.ValidationError, msgspec.DecodeError, _NoEngine):
        return None


class _NoEngine(Exception):
    pass


def _decode_engines(ticks: list[Any]) -> tuple[list[Any], frozenset[str]]:
    """Each tick's engine reading (as the decoder took it, whole) decoded in place; its checked fields (one
    per tick) and every key the readings hold, returned: once for a run of ticks that repeat a reading byte
    for byte, which then share the one dict and the one struct. A tick without an engine object raises
    (the block is read raw)."""
    decode, fields = _ENGINE_DECODER.decode, _FIELDS_DECODER.decode
    prev_raw: Any = None
    prev: Any = None
    f: Any = None
    out = []
    distinct = []
    for tick in ticks:
        raw = tick.engine
        if raw is None:  # no engine key
            raise _NoEngine
        if raw != prev_raw:  # (Raw compares its bytes)
            f, prev, prev_raw = fields(raw), decode(raw), raw
            distinct.append(prev)
        tick.engine = prev
        out.append(f)
    return out, frozenset(chain.from_iterable(distinct))


def _braced_lines(block: bytes | memoryview, newlines: np.ndarray | None = None) -> int:
    """How many lines ``block`` holds where every one starts with ``{`` and ends with ``}``, else 0 (byte
    sweeps in numpy: no copy of the block, no list of its lines; ``newlines``: their offsets, if known)."""
    a = np.frombuffer(block, np.uint8)
    if not a.size or a[0] != _OPEN or a[-1] != _CLOSE:
        return 0
    nl = np.flatnonzero(a == _NEWLINE) if newlines is None else newlines
    return nl.size + 1 if bool(np.all(a[nl - 1] == _CLOSE) and np.all(a[nl + 1] == _OPEN)) else 0


_OPEN, _CLOSE, _NEWLINE = ord("{"), ord("}"), ord("\n")
_T, _GPUS, _ENGINE, _INDEX = attrgetter("t"), attrgetter("gpus"), attrgetter("engine"), attrgetter("index")


def typed_columns(header: SessionHeader, block: TypedBlock, latest: float) -> tuple[Any, ...] | None:
    """What the bulk check sweeps out of a block of raw ticks, from typed ticks whose values the decoder
    checked: (times, engine readings, GPU lists, GPU entries, indices, figures matrix (table rows x
    entries, NaN where null), the figure names, the engine fields the analysis reads, by name, a list
    each, every key the engine readings hold), or None where the rest of the check fails: time not after ``latest`` or not increasing, a GPU
    the header does not list or twice in a tick (the raw path then reads the block)."""
    ticks = block.ticks
    t = np.array(list(map(_T, ticks)), dtype=np.float64)
    if t.size and (t[0] <= latest or (t.size > 1 and not bool(np.all(t[1:] > t[:-1])))):
        return None
    engine = list(map(_ENGINE, ticks))
    gl = list(map(_GPUS, ticks))
    flat = list(chain.from_iterable(gl))
    idx = list(map(_INDEX, flat))
    known = {g.index for g in header.gpus}
    if known and set(idx) - known:
        return None
    if max(map(len, gl), default=0) > 1 and any(len(g) != len({x.index for x in g}) for g in gl if len(g) > 1):
        return None
    names = _types()[2]
    fields = {k: list(map(get, block.fields)) for k, get in _FIELD_GETTERS}
    return t, engine, gl, flat, idx, _matrix(flat, names), names, fields, block.engine_keys


def _matrix(flat: list[Any], names: tuple[str, ...]) -> np.ndarray:
    """``names`` x entries as floats, NaN where null: each entry as a tuple (its fields in struct order:
    ``index``, then ``names``), transposed, each column converted in one call. A column all null (a field
    this GPU or recording lacks) stays NaN; a column with some nulls is converted the slower way (numpy
    reads None as NaN)."""
    n = len(flat)
    m = np.full((len(names), n), np.nan)
    if not n:
        return m
    cols = zip(*map(astuple, flat), strict=True)
    next(cols)  # the indices
    for i, col in enumerate(cols):
        if col[0] is None and col[-1] is None and col.count(None) == n:
            continue
        try:
            m[i] = np.fromiter(col, np.float64, n)  # (the decoder let only ints, floats and None through)
        except TypeError:  # some nulls
            m[i] = col
    return m
