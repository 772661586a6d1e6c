"""The engine over a whole session (``report``'s ``engine`` object), folded tick by tick.

:class:`EngineSessionFold` takes each tick's engine reading once, as a raw recording dict (``report``
streams a file's ticks through it without building a Sample) or as an
:class:`~pcie_tui.core.model.EngineSample`, and keeps only what the session figures need: a few
numbers per tick in flat arrays (time, up, phase, the two token counters) for the figures taken
between consecutive ticks, running histogram windows and counter totals, and the finished requests
(each once). Memory grows by about 30 bytes a tick, never by a tick's dict.

The figures are those :func:`engine_report` always gave: rates are token-counter increases divided
by the time the engine was up (the recording's gaps left out of both), ``requests`` counts finished
requests (the e2e-latency histogram's count increase, else the engine's finished-request counter,
else per-request timings). Null wherever the engine does not expose a figure.
"""

from __future__ import annotations

from array import array
from collections.abc import Iterable, Mapping, Sequence
from itertools import compress, repeat
from operator import is_not, itemgetter
from typing import TYPE_CHECKING, Any

import numpy as np

from pcie_tui.analyze import engine_bytes
from pcie_tui.analyze.engine import (
    LATENCIES,
    QUANTILE_METHOD,
    Hist,
    hist_add,
    hist_delta,
    hist_quantiles,
    http_overhead_from,
    number,
    quantile_method,
    with_http_overhead,
)
from pcie_tui.analyze.engine_requests import per_request_summary
from pcie_tui.analyze.ttft_parts import ttft_parts
from pcie_tui.core.model import EngineSample, Sample
from pcie_tui.engines import registry
from pcie_tui.engines.base import Engine
from pcie_tui.engines.stats import REQUEST_IDENTITY

if TYPE_CHECKING:
    from pcie_tui.recording.timeline import BlockColumns

_HISTS = (*LATENCIES, "e2e_s", "preemptions_n")


_get = dict.get
_t = itemgetter("t")


def _column(dicts: list[dict[str, Any]], key: str, default: Any = None) -> list[Any]:
    """``d.get(key, default)`` of every dict, in one C-level sweep."""
    return list(map(_get, dicts, repeat(key), repeat(default)))


class _CounterFold:
    """:func:`~pcie_tui.analyze.engine.counter_total` of a series of reads, fed a block of reads at a time."""

    __slots__ = ("prev", "total")

    def __init__(self) -> None:
        self.prev: float | None = None
        self.total: float | None = None

    def add(self, values: Iterable[float | None] | np.ndarray) -> None:
        """A block of reads: numbers with None where not read, or floats with NaN there (a checked block)."""
        if isinstance(values, np.ndarray):
            a = values[~np.isnan(values)]
        else:
            vals = values if isinstance(values, list) else list(values)
            a = np.array(list(compress(vals, map(is_not, vals, repeat(None)))) if None in vals else vals, np.float64)
        if not a.size:
            return
        if self.prev is not None:
            a = np.concatenate(([self.prev], a))
        if a.size > 1:
            inc = np.where(a[1:] >= a[:-1], a[1:] - a[:-1], a[1:])  # counter_increase: a drop restarts from zero
            # added first to last, as a running total adds (cumsum is sequential)
            self.total = float(np.cumsum(np.concatenate(([self.total or 0.0], inc)))[-1])
        self.prev = float(a[-1])


class _HistFold:
    """:func:`~pcie_tui.analyze.engine.hist_window` of a series of reads, one read at a time."""

    __slots__ = ("prev", "total")

    def __init__(self) -> None:
        self.prev: Hist | None = None
        self.total: Hist | None = None

    def add(self, cur: Hist | None) -> None:
        if cur is None:
            return
        if self.prev is not None:
            self.total = hist_add(self.total, hist_delta(self.prev, cur))
        self.prev = cur


class EngineSessionFold:
    """Feed every tick's engine reading in time order (:meth:`feed_rows` or :meth:`feed`), then
    :meth:`report` once."""

    def __init__(self) -> None:
        self.kind: str | None = None
        self._t = array("d")
        self._prompt = array("d")  # NaN: not read
        self._gen = array("d")
        self._up = bytearray()
        self._phase = array("i")
        self._phase_names: dict[Any, int] = {}
        self._hists = {name: _HistFold() for name in _HISTS}
        self._counters = {k: _CounterFold() for k in ("prompt", "gen", "finished", "http_s", "http_n")}
        self._seen: set[tuple[Any, ...]] = set()
        self.requests: list[dict[str, Any]] = []
        self._pending: list[dict[str, Any]] = []  # Samples' engines as recording rows, fed in blocks

    def __bool__(self) -> bool:
        return len(self._t) > 0 or bool(self._pending)

    def feed(self, t: float, e: EngineSample) -> None:
        """One tick's engine as a Sample holds it."""
        self._pending.append({"t": t, "engine": e.to_json()})
        if len(self._pending) >= 4096:
            self._flush()

    def _flush(self) -> None:
        rows, self._pending = self._pending, []
        self.feed_rows(rows)

    def feed_rows(self, rows: Sequence[Mapping[str, Any]], swept: BlockColumns | None = None) -> None:
        """The engine of every raw tick dict that has one (as the recording holds it: extra keys at the top
        level), a block of ticks at a time: columns first, then each figure's fold over its column.
        ``swept``: the times and engine readings the reader's check already took from these rows."""
        if swept is not None:
            raw: list[Any] = swept.engine
        else:
            raw = [d.get("engine") for d in rows] if not isinstance(rows, list) else _column(rows, "engine")
        kinds = set(map(type, raw))
        if kinds == {dict}:  # every tick has an engine reading (the usual engine session)
            ts: Any = swept.t if swept is not None else list(map(float, map(_t, rows)))
            engs: list[dict[str, Any]] = raw
        else:
            ts = [float(d["t"]) for d, e in zip(rows, raw, strict=True) if type(e) is dict]
            engs = [e for e in raw if type(e) is dict]
        if not engs:
            return
        if self.kind is None:
            self.kind = str(engs[0].get("kind", ""))
        fields = swept.engine_fields if swept is not None and engs is raw else None
        col = fields.__getitem__ if fields is not None else lambda k: _column(engs, k)  # checked: bools, numbers
        up = fields["up"] if fields is not None else _column(engs, "up", False)
        if set(map(type, up)) != {bool}:
            up = [bool(v) for v in up]
        self._t.frombytes(np.asarray(ts, dtype=np.float64).tobytes())
        self._up.extend(up)
        self._phase.extend(self._phase_codes(col("phase")))
        prompt, gen = col("prompt_tokens_total"), col("generation_tokens_total")
        pa, ga = np.array(prompt, dtype=np.float64), np.array(gen, dtype=np.float64)  # None -> NaN, at C speed
        self._prompt.frombytes(pa.tobytes())
        self._gen.frombytes(ga.tobytes())
        keys = swept.engine_keys if swept is not None else None  # None: not known (else no sweep for a key none holds)
        if keys is None or "requests" in keys:
            reqs = _column(engs, "requests")
            for r in compress(reqs, map(isinstance, reqs, repeat(list))):
                self._add_requests(r)
        ups = engs if all(up) else list(compress(engs, up))
        if fields is not None:  # checked numbers: NaN only where None (the counters' folds take arrays)
            mask = np.array(up, dtype=bool)
            self._fold_up(ups, pa[mask], ga[mask], keys)
        else:
            self._fold_up(ups, compress(prompt, up), compress(gen, up), keys)

    def _phase_codes(self, phases: list[Any]) -> list[int]:
        """Each phase's code, codes given in order of first appearance."""
        names = self._phase_names
        for p in dict.fromkeys(phases):
            names.setdefault(p, len(names))
        return list(map(names.__getitem__, phases))

    def _fold_up(
        self,
        ups: list[dict[str, Any]],
        prompt: Iterable[Any] | np.ndarray,
        gen: Iterable[Any] | np.ndarray,
        keys: frozenset[str] | None = None,
    ) -> None:
        """The counters and histograms of the readings taken while the engine answered (``keys``: every key
        the readings may hold, where known: a figure none of them holds is left as no reading would change it)."""
        c = self._counters
        c["prompt"].add(prompt)
        c["gen"].add(gen)
        if keys is None or "requests_finished_total" in keys:
            finished = _column(ups, "requests_finished_total")
            if set(map(type, finished)) - {int, float, type(None)}:
                finished = [v if isinstance(v, int | float) else None for v in finished]
            c["finished"].add(finished)
        http = keys is None or not keys.isdisjoint(("http_seconds_total", "http_requests_total"))
        if http and (
            any(map(dict.__contains__, ups, repeat("http_seconds_total")))
            or any(map(dict.__contains__, ups, repeat("http_requests_total")))
        ):
            c["http_s"].add([number(e.get("http_seconds_total")) for e in ups])
            c["http_n"].add([number(e.get("http_requests_total")) for e in ups])
        if keys is not None and "hist" not in keys:
            return
        hists = _column(ups, "hist")
        for h in compress(hists, map(isinstance, hists, repeat(dict))):
            for name, fold in self._hists.items():
                fold.add(h.get(name))

    def _add_requests(self, reqs: list[Any]) -> None:
        for r in reqs:
            if isinstance(r, dict):
                key = tuple(r.get(k) for k in REQUEST_IDENTITY)
                if key not in self._seen:
                    self._seen.add(key)
                    self.requests.append(r)

    # ---- the figures ------------------------------------------------------

    def _columns(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Time, up and phase code per tick, as arrays."""
        t = np.frombuffer(self._t, dtype=np.float64) if len(self._t) else np.zeros(0)
        up = np.frombuffer(bytes(self._up), dtype=np.uint8).astype(bool)
        return t, up, np.array(self._phase, dtype=np.int64)

    @staticmethod
    def _in_order_sum(x: np.ndarray) -> float:
        """The sum of ``x`` added first to last (as a loop adds: cumsum is sequential, sum is not)."""
        return float(np.cumsum(x)[-1]) if x.size else 0.0

    def _pairs(self, skip: set[float]) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """(time to the next tick, both ticks up, the pair starts at a gap) for consecutive ticks."""
        t, up, _ = self._columns()
        both = up[:-1] & up[1:]
        at_gap = (
            np.isin(t[:-1], np.fromiter(skip, dtype=np.float64, count=len(skip))) if skip else np.zeros(both.size, bool)
        )
        return np.diff(t), both, at_gap

    def up_span_s(self, skip: set[float]) -> float:
        """Seconds the engine was answering: spans between consecutive up ticks, none starting at a gap."""
        dt, both, at_gap = self._pairs(skip)
        return self._in_order_sum(np.where(both & ~at_gap, dt, 0.0))

    def session_rate(self, which: str, span: float, skip: set[float]) -> float | None:
        """A token counter's increase over the watched time (increases across a gap left out)."""
        v = np.frombuffer(self._prompt if which == "prompt" else self._gen, dtype=np.float64)
        _, both, at_gap = self._pairs(skip)
        read = both & ~np.isnan(v[:-1]) & ~np.isnan(v[1:])
        if not read.any():
            return None
        va, vb = v[:-1], v[1:]
        inc = np.where(vb >= va, vb - va, vb)  # a drop is a restart from zero
        total = self._in_order_sum(np.where(read & ~at_gap, inc, 0.0))
        return total / span if span > 0 else None

    def phase_times(self) -> dict[str, dict[str, Any]]:
        """Ticks, time and share of time per engine phase (in the order the phases first came)."""
        t, _, codes = self._columns()
        dt = np.append(np.diff(t), 0.0)  # the last tick has no time after it
        by_name: dict[str, list[int]] = {}
        for raw, code in self._phase_names.items():
            by_name.setdefault(raw or "unknown", []).append(code)
        phases: dict[str, dict[str, Any]] = {}
        for name, mine_codes in by_name.items():
            mine = np.isin(codes, mine_codes)
            phases[name] = {"ticks": int(mine.sum()), "time_s": self._in_order_sum(np.where(mine, dt, 0.0))}
        total_t = sum(p["time_s"] for p in phases.values())
        for ph in phases.values():
            ph["share"] = ph["time_s"] / total_t if total_t > 0 else None
        return phases

    def finished_requests(self) -> float | None:
        e2e = self._hists["e2e_s"].total
        requests: float | None = e2e["count"] if e2e is not None else self._counters["finished"].total
        if requests is None and self.requests:
            requests = len(self.requests)
        return requests

    def http_overhead_s(self) -> float | None:
        c = self._counters
        return http_overhead_from(c["http_s"].total, c["http_n"].total, self._hists["e2e_s"].total)

    def report(self, analyzer: Any = None) -> dict[str, Any] | None:
        """The ``engine`` object of ``report --json``; None when no tick had an engine.

        With the finished :class:`~pcie_tui.analyze.session.SessionAnalyzer` of the same ticks, the
        recording's gaps are left out of the up time and rates, and the engine's own bytes and the
        copies between requests are added."""
        if self._pending:
            self._flush()
        if not self:
            return None
        gaps = getattr(analyzer, "gaps", ())
        skip = {float(a) for a, _ in gaps}
        span = self.up_span_s(skip)
        eng = registry.get(self.kind or "")
        per_req_eng = eng if eng is not None and eng.per_request_timing else None
        out: dict[str, Any] = {
            "kind": self.kind,
            "requests": self.finished_requests(),
            "up_s": span,
            "prompt_tokens_per_s": self.session_rate("prompt", span, skip),
            "generation_tokens_per_s": self.session_rate("gen", span, skip),
            "prompt_tokens": self._counters["prompt"].total,
            "generation_tokens": self._counters["gen"].total,
            **{name: hist_quantiles(self._hists[name].total) for name in LATENCIES},
            "quantile_method": QUANTILE_METHOD,
            "basis": "engine histograms, quantiles interpolated within buckets (estimates bounded by bucket edges)",
            "per_request": per_request_summary(self.requests),
            "phases": self.phase_times(),
            # The engine's own byte and prefix-cache counters, NVML's PCIe bytes beside them.
            "bytes": engine_bytes.report(getattr(analyzer, "engine_bytes", None), eng.display if eng else "the engine"),
            "between_requests": _between(analyzer),
        }
        if per_req_eng is None:
            with_http_overhead(out, self.http_overhead_s())
            if out.get("http_overhead_s") is not None:
                out["basis"] += (
                    f"; TTFT as the client waits: the engine's TTFT + {out['http_overhead_s'] * 1e3:.1f} ms mean per "
                    "request of API-server time outside it (HTTP duration - engine e2e latency)"
                )
            hists = {name: fold.total for name, fold in self._hists.items()}
            out["ttft_parts"] = ttft_parts(eng, hists, out.get("http_overhead_s"))
        else:
            self._per_request(out, per_req_eng)
        return out

    def _per_request(self, out: dict[str, Any], per_req_eng: Engine) -> None:
        """No histograms: exact quantiles over the requests the engine timed; queue time unknown."""
        per_request = self.requests
        out.update(per_req_eng.request_latencies(per_request))
        pr = out["per_request"]
        if pr is not None and pr.get("ttft_s") is None:
            # The engine's per-request TTFT has its own name in the requests (llama.cpp: prompt_ms, the
            # server-side time to first token): the same exact order statistics as ``ttft_s`` above.
            pr["ttft_s"] = out.get("ttft_s")
        n_client = sum(1 for r in per_request if isinstance(r.get("client_ttft_s"), int | float))
        out["quantile_method"] = quantile_method(per_req_eng) if per_request else None
        out["basis"] = per_req_eng.timing_basis(len(per_request), n_client) or out["basis"]


def engine_report(samples: Iterable[Sample], analyzer: Any = None) -> dict[str, Any] | None:
    """The ``engine`` object of ``report --json`` over ``samples``; None when no tick has an engine.

    With a finished :class:`~pcie_tui.analyze.session.SessionAnalyzer` of the same samples, the
    recording's gaps are left out and the engine's bytes and copies between requests added."""
    fold = EngineSessionFold()
    for s in samples:
        if s.engine is not None:
            fold.feed(s.t, s.engine)
    return fold.report(analyzer)


def _between(analyzer: Any) -> dict[str, Any] | None:
    """The engine's own copies in the housekeeping stretches between requests (None: no such stretch)."""
    br = getattr(analyzer, "between_requests", None)
    c = br.copies() if br is not None else None
    return c.to_json() if c is not None and c.stretches else None
