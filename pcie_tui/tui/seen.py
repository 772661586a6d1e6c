"""Which figures of the metrics table a session has a reading of, per GPU, for the ``?`` page.

The page lists a figure's source only where the session has the figure: a recording made before heat
capture (the bundled demos) has no temperature, clocks, clock events, power limit, fan or link-health
counters, and the page says so instead of naming NVML calls that were never read. Live, the sets grow
with the ticks fed; a replay's cover its whole recording, scanned in the worker thread a bounded number
of ticks per frame (the recording may still be loading). No Textual here.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from itertools import chain, repeat
from operator import attrgetter, is_not, methodcaller
from typing import Any

from pcie_tui.core import metrics
from pcie_tui.core.model import TYPED_METRICS, GpuSample, Sample

# GPU-samples (one GPU in one tick) of a replay's recording looked at per frame at most: each costs well
# under a microsecond per row without a reading yet, so a frame is not held up; a recording read whole
# into memory is covered within its first frames, one still loading as its blocks arrive.
SCAN_GPU_SAMPLES = 100_000
_index = attrgetter("index")
_gpus = attrgetter("gpus")
_extra = attrgetter("extra")


def _reading(name: str) -> Callable[[Iterable[GpuSample]], Iterable[Any]]:
    """Each GPU-sample's reading of one row (GpuSample.get, swept at C speed)."""
    if name in TYPED_METRICS:
        get = attrgetter(name)
        return lambda gs: map(get, gs)
    look = methodcaller("get", name)
    return lambda gs: map(look, map(_extra, gs))


class FiguresSeen:
    """Per GPU index, the metrics-table rows (recording keys) with at least one reading."""

    def __init__(self) -> None:
        self._seen: dict[int, set[str]] = {}
        self.scanned = 0  # ticks of a replay's recording looked at, from its first
        self.whole = False  # the sets cover a whole recording (a replay, read and scanned to its end)
        self._snapshot: dict[int, frozenset[str]] | None = None

    def note(self, s: Sample) -> None:
        """One live tick's readings (a replay's come from :meth:`scan` of its whole recording)."""
        if self.scanned:
            return
        for g in s.gpus:
            seen = self._seen.get(g.index)
            if seen is None:
                seen = self._seen[g.index] = set()
                self._snapshot = None
            for m in metrics.table():
                if m.name not in seen and g.get(m.name) is not None:
                    seen.add(m.name)
                    self._snapshot = None

    def _note_gpus(self, gs: list[GpuSample], per_tick: int) -> None:
        """Many ticks' GPU-samples, ``per_tick`` GPUs in each tick: one GPU's are every ``per_tick``-th when
        every tick lists its GPUs in one order (else they are told apart by index, a slower sweep)."""
        strided = [gs[k::per_tick] for k in range(per_tick)] if per_tick and len(gs) % per_tick == 0 else []
        groups = [(part[0].index, part) for part in strided if part and len(set(map(_index, part))) == 1]
        if strided and len(groups) == len(strided) and len({i for i, _ in groups}) == len(groups):
            for i, part in groups:
                self._note_one(i, part)
            return
        for i in set(map(_index, gs)):
            self._note_one(i, [g for g in gs if g.index == i])

    def _note_one(self, index: int, gs: list[GpuSample]) -> None:
        """One GPU's samples: per row it has no reading of yet, one sweep at C speed up to the first reading."""
        seen = self._seen.get(index)
        if seen is None:
            seen = self._seen[index] = set()
            self._snapshot = None
        for m in metrics.table():
            if m.name not in seen and any(map(is_not, _reading(m.name)(gs), repeat(None))):
                seen.add(m.name)
                self._snapshot = None

    def scan(self, samples: Sequence[Sample], read_whole: bool, budget: int = SCAN_GPU_SAMPLES) -> None:
        """Note the ticks of a replay's recording not yet looked at, about ``budget`` GPU-samples at most;
        ``read_whole``: the recording has been read to its end (no more ticks will arrive)."""
        n = len(samples)
        if self.scanned < n:
            per_tick = len(samples[self.scanned].gpus)
            end = min(n, self.scanned + max(1, budget // max(1, per_tick)))
            self._note_gpus(list(chain.from_iterable(map(_gpus, samples[self.scanned : end]))), per_tick)
            self.scanned = end
        self.whole = read_whole and self.scanned == n

    def snapshot(self) -> Mapping[int, frozenset[str]]:
        """Per GPU, the rows with a reading (a GPU with no tick yet is absent); the same object until one
        more row is seen."""
        if self._snapshot is None:
            self._snapshot = {i: frozenset(seen) for i, seen in self._seen.items()}
        return self._snapshot


# Raw readings of an engine's ticks (``EngineSample.extra``) that a ``?`` row describes: Ollama's loaded models
# (/api/ps) and its GPU layers (its log), SGLang's HiCache counters (/metrics).
EXTRA_FIGURES = ("models", "gpu_layers", "hicache")


class EngineFiguresSeen:
    """The engine panel's figures the session has had a reading of so far: the keys of the engine's statistics
    (pcie_tui.analyze.engine: ``ttft_s``, ``kv_cache_util``, ...) with a value, ``requests_running`` and
    ``requests_waiting`` from its ticks too, the raw readings of :data:`EXTRA_FIGURES` a tick carries (Ollama's
    loaded models and GPU layers, SGLang's HiCache counters), and ``placement`` once the engine's facts say what
    it keeps in host memory. Noted from each frame's statistics and each tick fed (a replay's: the frames shown and the
    ticks of the statistics window before them; a request that ends later in the recording is not counted
    before it is shown, and a seek past one counts it only where the window still holds it)."""

    def __init__(self) -> None:
        self._seen: set[str] = set()
        self._snapshot: frozenset[str] = frozenset()

    def note(self, stats: Mapping[str, Any] | None, engine: Any, placement: str | None) -> None:
        new = [k for k, v in (stats or {}).items() if k not in self._seen and _has_value(v)]
        for k in ("requests_running", "requests_waiting"):
            if k not in self._seen and getattr(engine, k, None) is not None:
                new.append(k)
        extra = getattr(engine, "extra", None) or {}
        new += [k for k in EXTRA_FIGURES if k not in self._seen and _has_raw(extra.get(k))]
        if placement and "placement" not in self._seen:
            new.append("placement")
        if new:
            self._seen.update(new)
            self._snapshot = frozenset(self._seen)

    def snapshot(self) -> frozenset[str]:
        """The figures seen; the same object until one more is."""
        return self._snapshot


def _has_value(v: Any) -> bool:
    """A reading: not None, and a quantile set with a median (``{"p50": None, ...}`` is none)."""
    if isinstance(v, Mapping):
        return v.get("p50") is not None
    return v is not None


def _has_raw(v: Any) -> bool:
    """A raw reading of a tick: not None, and a collection with something in it (no models loaded is none)."""
    return bool(v) if isinstance(v, Mapping | list | tuple) else v is not None
