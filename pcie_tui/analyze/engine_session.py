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

import math
from array import array
from collections.abc import Iterable, Mapping
from typing import Any

from pcie_tui.analyze import engine_bytes
from pcie_tui.analyze.engine import (
    LATENCIES,
    QUANTILE_METHOD,
    Hist,
    counter_increase,
    hist_add,
    hist_delta,
    hist_quantiles,
    http_overhead_from,
    with_http_overhead,
)
from pcie_tui.analyze.engine_requests import per_request_summary
from pcie_tui.core.model import EngineSample, Sample
from pcie_tui.engines import registry
from pcie_tui.engines.base import Engine
from pcie_tui.engines.stats import REQUEST_IDENTITY

_HISTS = (*LATENCIES, "e2e_s")
_NAN = math.nan


def _num(v: Any) -> float | None:
    return float(v) if isinstance(v, int | float) and not isinstance(v, bool) else None


class _CounterFold:
    """:func:`~pcie_tui.analyze.engine.counter_total` of a series of reads, one read at a time."""

    __slots__ = ("prev", "total")

    def __init__(self) -> None:
        self.prev: float | None = None
        self.total: float | None = None

    def add(self, v: float | None) -> None:
        if v is None:
            return
        if self.prev is not None:
            self.total = (self.total or 0.0) + (counter_increase(self.prev, v) or 0.0)
        self.prev = v


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
    """Feed every tick's engine reading in time order (:meth:`feed_raw` or :meth:`feed`), then
    :meth:`report` once."""

    def __init__(self) -> None:
        self.kind: str | None = None
        self._t = array("d")
        self._prompt = array("d")  # NaN: not read
        self._gen = array("d")
        self._up = bytearray()
        self._phase = bytearray()
        self._phase_names: dict[str | None, int] = {}
        self._hists = {name: _HistFold() for name in _HISTS}
        self._counters = {k: _CounterFold() for k in ("prompt", "gen", "finished", "http_s", "http_n")}
        self._seen: set[tuple[Any, ...]] = set()
        self.requests: list[dict[str, Any]] = []

    def __bool__(self) -> bool:
        return len(self._t) > 0

    def feed_raw(self, t: float, d: Mapping[str, Any]) -> None:
        """One tick's engine as the recording holds it (extra keys at the top level)."""
        self._feed(t, str(d.get("kind", "")), bool(d.get("up", False)), d.get("phase"), d, d)

    def feed(self, t: float, e: EngineSample) -> None:
        self._feed(t, e.kind, e.up, e.phase, {
            "prompt_tokens_total": e.prompt_tokens_total,
            "generation_tokens_total": e.generation_tokens_total,
        }, e.extra)  # fmt: skip

    def feed_rows(self, rows: Iterable[Mapping[str, Any]]) -> None:
        """The engine of every raw tick dict that has one."""
        feed = self.feed_raw
        for d in rows:
            e = d.get("engine")
            if type(e) is dict:
                feed(float(d["t"]), e)

    def _feed(
        self, t: float, kind: str, up: bool, phase: Any, typed: Mapping[str, Any], extra: Mapping[str, Any]
    ) -> None:
        if self.kind is None:
            self.kind = kind
        p, g = typed.get("prompt_tokens_total"), typed.get("generation_tokens_total")
        self._t.append(t)
        self._prompt.append(_NAN if p is None else p)
        self._gen.append(_NAN if g is None else g)
        self._up.append(up)
        code = self._phase_names.setdefault(phase, len(self._phase_names))
        self._phase.append(code)
        reqs = extra.get("requests")
        if isinstance(reqs, list):
            self._add_requests(reqs)
        if not up:
            return
        c = self._counters
        c["prompt"].add(p)
        c["gen"].add(g)
        fin = extra.get("requests_finished_total")
        c["finished"].add(fin if isinstance(fin, int | float) else None)
        c["http_s"].add(_num(extra.get("http_seconds_total")))
        c["http_n"].add(_num(extra.get("http_requests_total")))
        hists = extra.get("hist")
        if isinstance(hists, dict):
            for name, fold in self._hists.items():
                fold.add(hists.get(name))

    def _add_requests(self, reqs: list[Any]) -> None:
        for r in reqs:
            if isinstance(r, dict):
                key = tuple(r.get(k) for k in REQUEST_IDENTITY)
                if key not in self._seen:
                    self._seen.add(key)
                    self.requests.append(r)

    # ---- the figures ------------------------------------------------------

    def up_span_s(self, skip: set[float]) -> float:
        """Seconds the engine was answering: spans between consecutive up ticks, none starting at a gap."""
        t, up = self._t, self._up
        span = 0.0
        for i in range(len(t) - 1):
            if up[i] and up[i + 1] and t[i] not in skip:
                span += t[i + 1] - t[i]
        return span

    def session_rate(self, which: str, span: float, skip: set[float]) -> float | None:
        """A token counter's increase over the watched time (increases across a gap left out)."""
        t, up = self._t, self._up
        v = self._prompt if which == "prompt" else self._gen
        inc: float | None = None
        for i in range(len(t) - 1):
            va, vb = v[i], v[i + 1]
            if up[i] and up[i + 1] and va == va and vb == vb:  # noqa: PLR0124 - NaN: not read
                inc = (inc or 0.0) + (0.0 if t[i] in skip else (counter_increase(va, vb) or 0.0))
        return inc / span if inc is not None and span > 0 else None

    def phase_times(self) -> dict[str, dict[str, Any]]:
        """Ticks, time and share of time per engine phase."""
        names = {code: (name or "unknown") for name, code in self._phase_names.items()}
        phases: dict[str, dict[str, Any]] = {}
        t, codes = self._t, self._phase
        for i in range(len(t)):
            ph = phases.setdefault(names[codes[i]], {"ticks": 0, "time_s": 0.0})
            ph["ticks"] += 1
            if i + 1 < len(t):
                ph["time_s"] += t[i + 1] - t[i]
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
        out["quantile_method"] = (per_req_eng.quantile_method or QUANTILE_METHOD) if per_request else None
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
