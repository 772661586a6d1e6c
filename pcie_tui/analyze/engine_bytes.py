"""The engine's own byte and prefix-cache counters per phase, against what NVML saw on the link.

An engine that offloads its KV cache counts the bytes it copies between host and GPU (vLLM:
``vllm:kv_offload_load_bytes`` host->device, ``vllm:kv_offload_store_bytes`` device->host, read
into ``extra`` as ``kv_offload_h2d_bytes_total`` / ``kv_offload_d2h_bytes_total``); its prefix cache
counts prompt tokens looked up and found (``prefix_cache_queries_total`` / ``prefix_cache_hits_total``).
Between two ticks whose engine readings both carry a counter, its increase goes to the later tick's
phase; over the same intervals NVML's PCIe RX + TX of every GPU is integrated (rate x interval), so
the two byte figures cover the same time. Pure bookkeeping over the analyzer's chunks; no I/O.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from itertools import chain, compress, repeat
from operator import is_, is_not, not_
from typing import Any

import numpy as np

from pcie_tui.analyze.columns import COL, Chunk
from pcie_tui.core.model import EngineSample

BYTES = ("kv_offload_h2d_bytes_total", "kv_offload_d2h_bytes_total")
PREFIX = ("prefix_cache_hits_total", "prefix_cache_queries_total")
# The seconds the engine's copies took each way (vLLM: ``vllm:kv_offload_load_time`` / ``_store_time``) and
# the requests it preempted (``vllm:num_preemptions``): the engine's own rate and the count of its own work.
SECONDS = ("kv_offload_h2d_seconds_total", "kv_offload_d2h_seconds_total")
PREEMPT = "preemptions_total"
_KEYS = frozenset((*BYTES, *PREFIX, *SECONDS, PREEMPT))
_ORDER = (*BYTES, *PREFIX, *SECONDS, PREEMPT)
_NONE: dict[str, float | None] = dict.fromkeys(_ORDER)
# The engine's bytes exceed NVML's by more than this share (and MIN_EXCESS_B) before the report says so:
# NVML's PCIe counters sample the bus, and the two clocks read a tick apart.
EXCESS_SHARE = 0.10
MIN_EXCESS_B = 1 << 20


@dataclass
class PhaseCounts:
    """One phase's sums (None: the engine never exposed that counter there)."""

    span_s: float = 0.0  # seconds of intervals with the engine's byte counters on both ends
    engine_bytes: float | None = None  # host<->device bytes the engine says it moved
    h2d_bytes: float | None = None
    d2h_bytes: float | None = None
    nvml_bytes: float | None = None  # NVML PCIe RX + TX over the same intervals, all GPUs
    prefix_hits: float | None = None
    prefix_queries: float | None = None
    h2d_s: float | None = None  # seconds the engine says its host->device copies took
    d2h_s: float | None = None
    preemptions: float | None = None  # requests the engine preempted

    def engine_rate(self, direction: str) -> float | None:
        """The engine's own copy rate one way (``h2d``/``d2h``): its bytes over its copy seconds."""
        b, secs = getattr(self, f"{direction}_bytes"), getattr(self, f"{direction}_s")
        return b / secs if b is not None and secs else None

    @property
    def hit_rate(self) -> float | None:
        """Share of looked-up prompt tokens found in the prefix cache (None: none looked up)."""
        if not self.prefix_queries or self.prefix_hits is None:
            return None
        return min(max(self.prefix_hits / self.prefix_queries, 0.0), 1.0)

    def rate(self, what: str) -> float | None:
        """``engine_bytes`` / ``nvml_bytes`` (etc.) per second of the intervals they cover."""
        v = getattr(self, what)
        return v / self.span_s if v is not None and self.span_s > 0 else None


def _num(extra: Any, key: str) -> float | None:
    v = extra.get(key) if isinstance(extra, dict) else None
    return float(v) if isinstance(v, int | float) and not isinstance(v, bool) else None


def engine_fields(e: Any) -> dict[str, Any] | None:
    """An engine reading's raw fields (an EngineSample's ``extra`` or a recorded dict), None if down."""
    if isinstance(e, dict):
        return e if e.get("up") is True else None
    if isinstance(e, EngineSample):
        return e.extra if e.up else None
    return None  # no reading, or a damaged one


def up_fields(engines: Sequence[Any]) -> list[dict[str, Any] | None]:
    """:func:`engine_fields` of each reading; recorded dicts all up (the usual block) in C-level sweeps."""
    if set(map(type, engines)) == {dict} and all(map(is_, map(dict.get, engines, repeat("up")), repeat(True))):
        return list(engines)
    return [
        (e if e.get("up") is True else None) if type(e) is dict else engine_fields(e)  # noqa: E721 - exact dict
        for e in engines
    ]


def chunk_up_fields(ch: Chunk) -> list[dict[str, Any] | None]:
    """:func:`up_fields` of a chunk's engine readings, worked out once for everything fed the chunk."""
    if ch.up is None:
        ch.up = up_fields(ch.engine)
    return ch.up


def _has_counters(xs: list[dict[str, Any] | None]) -> list[bool]:
    """Whether each reading (None: the engine did not answer) exposes any of the counters."""
    live: list[dict[str, Any]] = list(compress(xs, map(is_not, xs, repeat(None))))  # type: ignore[arg-type]
    if _KEYS.isdisjoint(chain.from_iterable(live)):  # one sweep over the block's keys: most engines expose none
        return [False] * len(xs)
    none = list(map(_KEYS.isdisjoint, live))
    has = [False] * len(live) if all(none) else list(map(not_, none))
    if len(live) == len(xs):
        return has
    it = iter(has)
    return [x is not None and next(it) for x in xs]


def _add(a: float | None, b: float) -> float:
    return (a or 0.0) + b


# PhaseCounts' sums, added up over phases by EngineBytes.total.
SUMMED = (
    "engine_bytes", "h2d_bytes", "d2h_bytes", "nvml_bytes", "prefix_hits", "prefix_queries", "h2d_s", "d2h_s",
    "preemptions",
)  # fmt: skip


class EngineBytes:
    """Per-phase engine counters and NVML bytes, fed the analyzer's chunks in order."""

    def __init__(self) -> None:
        self.phases: dict[str, PhaseCounts] = {}
        self._prev: tuple[float, dict[str, float | None]] | None = None  # last engine tick: time, counters

    def feed_chunk(self, ch: Chunk) -> None:
        xs = chunk_up_fields(ch)
        # Ticks whose engine exposes none of the counters (llama-server, most vLLM setups) only break an
        # interval; they need no PCIe sums and no per-counter work. (None of the block's readings holds one:
        # no sweep over them.)
        keys = ch.engine_keys
        has = [False] * len(xs) if keys is not None and _KEYS.isdisjoint(keys) else _has_counters(xs)
        if not any(has):
            last = next((i for i in range(len(xs) - 1, -1, -1) if xs[i] is not None), None)  # from the end
            if last is not None:
                self._prev = (ch.t[last], _NONE)
            return
        pcie = self._pcie_per_tick(ch)
        for i, (t, x) in enumerate(zip(ch.t, xs, strict=True)):
            if x is None:
                continue
            if not has[i]:
                self._prev = (t, _NONE)
                continue
            cur = {k: _num(x, k) for k in _ORDER}
            if self._prev is not None:
                self._interval(str(ch.phase[i] or "unknown"), t - self._prev[0], self._prev[1], cur, pcie[i])
            self._prev = (t, cur)

    @staticmethod
    def _pcie_per_tick(ch: Chunk) -> list[float | None]:
        """NVML PCIe RX + TX of all GPUs at each tick (None: no reading)."""
        rx_tx = ch.cols[COL["pcie_rx_Bps"]] + ch.cols[COL["pcie_tx_Bps"]] if ch.cols.size else np.zeros(0)
        out: list[float | None] = [None] * len(ch.t)
        for k, v in zip(ch.tick_of.tolist(), rx_tx.tolist(), strict=True):
            if v == v:  # not NaN
                out[k] = (out[k] or 0.0) + v
        return out

    def _interval(
        self, phase: str, dt: float, old: dict[str, float | None], cur: dict[str, float | None], pcie: float | None
    ) -> None:
        if dt <= 0:
            return
        pc = self.phases.setdefault(phase, PhaseCounts())
        inc = {k: _increase(old[k], cur[k]) for k in cur}
        if inc[PREFIX[0]] is not None and inc[PREFIX[1]] is not None:
            pc.prefix_hits = _add(pc.prefix_hits, inc[PREFIX[0]] or 0.0)
            pc.prefix_queries = _add(pc.prefix_queries, inc[PREFIX[1]] or 0.0)
        if (n := inc[PREEMPT]) is not None:
            pc.preemptions = _add(pc.preemptions, n)
        for key, attr in zip(SECONDS, ("h2d_s", "d2h_s"), strict=True):
            if (secs := inc[key]) is not None:
                setattr(pc, attr, _add(getattr(pc, attr), secs))
        h2d, d2h = inc[BYTES[0]], inc[BYTES[1]]
        if h2d is None and d2h is None:
            return
        pc.span_s += dt
        pc.h2d_bytes = _add(pc.h2d_bytes, h2d or 0.0)
        pc.d2h_bytes = _add(pc.d2h_bytes, d2h or 0.0)
        pc.engine_bytes = _add(pc.engine_bytes, (h2d or 0.0) + (d2h or 0.0))
        if pcie is not None:
            pc.nvml_bytes = _add(pc.nvml_bytes, pcie * dt)

    def total(self) -> PhaseCounts:
        """All phases together."""
        out = PhaseCounts()
        for pc in self.phases.values():
            out.span_s += pc.span_s
            for k in SUMMED:
                v = getattr(pc, k)
                if v is not None:
                    setattr(out, k, _add(getattr(out, k), v))
        return out


def _increase(prev: float | None, cur: float | None) -> float | None:
    """A counter's increase between two reads; a drop is a restart (the new value counts)."""
    if prev is None or cur is None:
        return None
    return cur - prev if cur >= prev else cur


def offload_check(pc: PhaseCounts, engine: str = "the engine") -> str | None:
    """The report's line when the engine says it moved more host<->device bytes than NVML saw on
    the PCIe link over the same intervals (one of the two readings is wrong), else None."""
    eng, nvml = pc.engine_bytes, pc.nvml_bytes
    if eng is None or nvml is None or pc.span_s <= 0:
        return None
    if eng <= nvml * (1 + EXCESS_SHARE) + MIN_EXCESS_B:
        return None
    from pcie_tui.core.units import rate

    return (
        f"{engine} says its KV offloading moved {rate(eng / pc.span_s)} host<->device, but NVML saw "
        f"{rate(nvml / pc.span_s)} PCIe RX + TX over the same {pc.span_s:.1f} s: one of the two is wrong. "
        "This report trusts NVML (the attribution rests on it): it counts what crossed this machine's PCIe "
        "links, while the engine counts the bytes of the blocks it asked to copy, which on a GPU attached by "
        "NVLink-C2C never cross PCIe, and which a copy that failed or was dropped never moved"
    )


def summary(pc: PhaseCounts) -> dict[str, Any]:
    """``report --json``'s ``engine.bytes`` figures for one PhaseCounts."""
    return {
        "span_s": pc.span_s,
        "engine_Bps": pc.rate("engine_bytes"),
        "h2d_Bps": pc.rate("h2d_bytes"),
        "d2h_Bps": pc.rate("d2h_bytes"),
        "nvml_pcie_Bps": pc.rate("nvml_bytes"),
        "prefix_cache_hits": pc.prefix_hits,
        "prefix_cache_queries": pc.prefix_queries,
        "prefix_cache_hit_rate": pc.hit_rate,
        "h2d_bytes": pc.h2d_bytes,
        "d2h_bytes": pc.d2h_bytes,
        "h2d_engine_Bps": pc.engine_rate("h2d"),  # the engine's bytes over its own copy seconds
        "d2h_engine_Bps": pc.engine_rate("d2h"),
        "preemptions": pc.preemptions,
    }


def report(eb: EngineBytes | None, engine: str = "the engine") -> dict[str, Any] | None:
    """``report --json``'s ``engine.bytes``: the session's and each phase's engine counters with NVML's
    PCIe bytes beside them, and ``check`` (:func:`offload_check`); None where the engine exposed none."""
    if eb is None or not eb.phases:
        return None
    total = eb.total()
    if total.engine_bytes is None and total.prefix_queries is None and not total.preemptions:
        return None
    return {
        "session": summary(total),
        "phases": {p: summary(pc) for p, pc in sorted(eb.phases.items())},
        "check": offload_check(total, engine),
    }
