"""Ticks as columns: the input :class:`pcie_tui.analyze.session.SessionAnalyzer` advances over.

A :class:`Chunk` holds a run of ticks in time order: per tick its time and phase, per GPU-sample
(one GPU's readings in one tick) its tick, GPU index and readings as floats (NaN = missing). The
analyzer takes one chunk at a time, whatever its length: a live tick is a chunk of one, a replay
or a report feeds the recording in chunks of :data:`CHUNK_TICKS`. Chunks come from Samples
(:func:`from_samples`) or, for a recording read from a file, straight from its raw tick dicts
(:func:`from_rows`: no Sample is built, and the reader's validation hands over the columns it
already built through :func:`pcie_tui.recording.validate.cached_columns`).
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from itertools import chain, compress, repeat
from operator import attrgetter, itemgetter, not_
from typing import TYPE_CHECKING, Any

import numpy as np

from pcie_tui.core.model import Sample
from pcie_tui.recording.validate import cached_columns

if TYPE_CHECKING:
    from pcie_tui.recording.timeline import BlockColumns

# Every per-GPU reading, in the order recording/validate.py builds its columns in.
KEYS = (
    "pcie_rx_Bps",
    "pcie_tx_Bps",
    "nvlink_rx_Bps",
    "nvlink_tx_Bps",
    "dram_bw_util",
    "mem_busy",
    "sm_util",
    "link_gen",
    "link_width",
    "power_W",
    "mem_used_bytes",
    # Heat and link health (absent in older recordings: NaN), read by analyze/heat.py and link_health.py.
    "temp_C",
    "sm_clock_MHz",
    "clock_events",
    "power_limit_W",
    "pcie_replays",
    "aer_correctable",
    "aer_nonfatal",
    "aer_fatal",
)
COL = {k: i for i, k in enumerate(KEYS)}
CHUNK_TICKS = 8192  # a report's chunk: long enough that numpy's per-call cost vanishes
_F = np.float64
_get_keys = itemgetter(*KEYS)
_get_attrs = attrgetter(*KEYS)


@dataclass(slots=True)
class Chunk:
    """A run of ticks as columns."""

    t: list[float]  # per tick
    phase: list[Any]  # per tick: the engine's phase where it has an engine reading, else its label
    engine: list[Any]  # per tick: its engine reading (a dict or an EngineSample) or None (the analyzer's phase rule)
    tick_of: np.ndarray  # per GPU-sample: its tick's position in the chunk
    index: np.ndarray  # per GPU-sample: the GPU index
    cols: np.ndarray  # len(KEYS) x GPU-samples, floats, NaN where missing
    single: bool  # every tick has exactly one GPU-sample (tick_of is 0, 1, 2, ...)
    up: list[Any] | None = None  # per tick: its engine's fields where it answered (engine_bytes.chunk_up_fields)
    # every key its engine readings (dicts) may hold, where known (a typed block's), else None
    engine_keys: frozenset[str] | None = None


def sample_phase(s: Sample) -> str | None:
    """The phase a tick belongs to: the engine's, else a recording's own label."""
    if s.engine is not None and s.engine.phase:
        return s.engine.phase
    label = s.extra.get("label")
    return label if isinstance(label, str) else None


def tick_phase(d: dict[str, Any]) -> Any:
    """:func:`sample_phase` on a raw tick dict."""
    eng = d.get("engine")
    if isinstance(eng, dict):
        p = eng.get("phase")
        if p:
            return p
    label = d.get("label")
    return label if isinstance(label, str) else None


def from_samples(samples: Sequence[Sample]) -> Chunk:
    """One chunk of the given Samples (a live tick: a chunk of one)."""
    if len(samples) == 1:  # the live path: one tick, no repeat needed
        flat: Sequence[Any] = samples[0].gpus
        tick_of = np.zeros(len(flat), dtype=np.int64)
        single = len(flat) == 1
    else:
        flat = [g for s in samples for g in s.gpus]
        counts = [len(s.gpus) for s in samples]
        tick_of = np.repeat(np.arange(len(samples)), counts)
        single = counts.count(1) == len(counts)
    index = np.array([g.index for g in flat], dtype=np.int64)
    cols = np.array(list(map(_get_attrs, flat)), dtype=_F).T if flat else np.empty((len(KEYS), 0))
    engine = [s.engine for s in samples]
    phase = [_own_phase(s) for s in samples]
    return Chunk([s.t for s in samples], phase, engine, tick_of, index, cols, single)


def _own_phase(s: Sample) -> str | None:
    """The engine's phase of a tick with an engine reading (None if it gave none), else its label."""
    if s.engine is not None:
        return s.engine.phase or None
    label = s.extra.get("label")
    return label if isinstance(label, str) else None


def from_rows(
    rows: Sequence[dict[str, Any]], ticks: int = CHUNK_TICKS, swept: BlockColumns | None = None
) -> Iterator[Chunk]:
    """Raw tick dicts (as :func:`pcie_tui.recording.reader.read_rows` returns them) in chunks of ``ticks``.

    ``rows`` must be well-formed ticks (the reader drops the others): a number ``t``, and ``gpus`` a
    list of dicts with an integer ``index``. ``swept``: the columns the reader's check took from these
    very rows (each dict is then read once less).
    """
    n = len(rows)
    glists: Sequence[Any]
    if swept is not None:
        t, engine, glists, flat = swept.t.tolist(), swept.engine, swept.gpus, swept.flat
        index = np.array(swept.index, dtype=np.int64)
    else:
        t = list(map(float, map(itemgetter("t"), rows)))
        engine = list(map(dict.get, rows, repeat("engine")))
        glists = list(map(itemgetter("gpus"), rows))
        if set(map(type, glists)) != {list}:
            glists = [d.get("gpus") or () for d in rows]
        flat = list(chain.from_iterable(glists))
        index = np.array(list(map(itemgetter("index"), flat)), dtype=np.int64)
    fields = swept.engine_fields if swept is not None else None
    keys = swept.engine_keys if swept is not None else None  # (of the whole block: a superset of a chunk's)
    if fields is not None:  # every tick has an engine reading: its phase (and whether it answered) known
        phase = [p or None for p in fields["phase"]]
        ups: list[bool] | None = fields["up"]
    else:
        phase, ups = _row_phases(rows, engine), None
    counts = np.fromiter(map(len, glists), dtype=np.int64, count=n)
    cols = _columns(flat)
    offs = np.concatenate(([0], np.cumsum(counts))).tolist()
    for a in range(0, n, ticks):
        b = min(n, a + ticks)
        fa, fb = offs[a], offs[b]
        c = counts[a:b]
        tick_of = np.repeat(np.arange(b - a), c)
        eng = engine[a:b]
        single = bool((c == 1).all())
        # each reading's "up" known: what engine_bytes.chunk_up_fields would work out, given at once
        up = None if ups is None else up_readings(eng, ups[a:b])
        yield Chunk(t[a:b], phase[a:b], eng, tick_of, index[fa:fb], cols[:, fa:fb], single, up, keys)


def up_readings(engines: list[dict[str, Any]], ups: list[bool]) -> list[dict[str, Any] | None]:
    """Each engine dict where its ``up`` (a bool each) is True, else None; a sweep only over those down."""
    out: list[dict[str, Any] | None] = list(engines)
    for i in compress(range(len(ups)), map(not_, ups)):
        out[i] = None
    return out


def _row_phases(rows: Sequence[dict[str, Any]], engine: list[Any]) -> list[Any]:
    """:func:`_own_phase` of each raw tick (``engine``: each one's engine reading)."""
    if set(map(type, engine)) == {dict}:  # an engine session: the engine's phase of every tick
        return [p or None for p in map(dict.get, engine, repeat("phase"))]
    return [
        (e.get("phase") or None) if e.__class__ is dict else (lb if (lb := d.get("label")).__class__ is str else None)
        for d, e in zip(rows, engine, strict=True)
    ]


def _columns(flat: list[dict[str, Any]]) -> np.ndarray:
    """KEYS x GPU-samples as floats, None -> NaN: the reader's own columns when it built them."""
    done = cached_columns(flat, KEYS)
    if done is not None:
        return done
    if not flat:
        return np.empty((len(KEYS), 0))
    try:
        rows = list(map(_get_keys, flat))
    except KeyError:  # a writer that leaves unknown fields out
        rows = [tuple(g.get(k) for k in KEYS) for g in flat]
    return np.array(rows, dtype=_F).T
