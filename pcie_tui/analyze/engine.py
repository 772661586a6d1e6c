"""Engine token timing over a sliding window and over a whole session.

Pure functions over :class:`~pcie_tui.core.model.Sample` ticks; no I/O.

Counters (prompt/generation tokens) become rates from deltas between ticks; a
counter that goes down means the engine restarted, and the new value is the
amount counted since the restart. Latencies come from the engine's cumulative
histogram buckets (``engine.extra["hist"]``): bucket deltas over the window,
then quantiles linearly interpolated within a bucket, the way Prometheus'
``histogram_quantile`` does. That is an estimate bounded by the bucket edges,
and the snapshot says so in ``quantile_method``.

An engine with ``per_request_timing`` (see :mod:`pcie_tui.engines.base`) has no
histograms: its latencies are the engine's :meth:`~pcie_tui.engines.base.Engine.request_latencies`
over the requests that ended in the window (``engine.extra["requests"]``), exact order
statistics; its live token rates are the larger of the engine's
:meth:`~pcie_tui.engines.base.Engine.live_tokens` and the counters (both lower bounds). ``rate_source``
says which was used, ``quantile_method`` how the quantiles were computed.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterable, Sequence
from typing import Any

from pcie_tui.core.model import EngineSample, Sample
from pcie_tui.engines import registry
from pcie_tui.engines.base import Engine
from pcie_tui.engines.stats import QUANTILES, unique_requests

QUANTILE_METHOD = "interpolated within histogram buckets"
# Histograms the snapshot reports, by their key in extra["hist"].
# setup_s: the engine's own work before a request starts (llama-server: slot setup, its prompt cache).
LATENCIES = ("ttft_s", "itl_s", "prefill_s", "decode_s", "queue_s", "setup_s")
SNAPSHOT_KEYS = (
    "kind",
    "up",
    "phase",
    "error",
    "window_s",
    "span_s",
    "prompt_tokens_per_s",
    "generation_tokens_per_s",
    *LATENCIES,
    "ttft_engine_s",
    "http_overhead_s",
    "requests_running",
    "requests_waiting",
    "kv_cache_util",
    "prefix_cache_hit_rate",
    "kv_offload_Bps",
    "quantile_method",
    "rate_source",
    "requests_timed",
)

Hist = dict[str, Any]  # {"le": [finite upper bounds], "cum": [cumulative counts], "count": n, "sum": s}


# ---- counters -------------------------------------------------------------


def counter_increase(prev: float | None, cur: float | None) -> float | None:
    """Increase of a cumulative counter between two reads; a drop means a restart from zero."""
    if prev is None or cur is None:
        return None
    return cur - prev if cur >= prev else cur


def counter_total(values: Iterable[float | None]) -> float | None:
    """Total increase over a series of reads of one counter, across restarts."""
    total: float | None = None
    prev: float | None = None
    for v in values:
        if v is None:
            continue
        if prev is not None:
            inc = counter_increase(prev, v)
            total = (total or 0.0) + (inc or 0.0)
        prev = v
    return total


# ---- histograms -----------------------------------------------------------


def hist_delta(old: Hist | None, new: Hist | None) -> Hist | None:
    """Observations added between two reads of one cumulative histogram.

    If the counts went down (engine restart) or the bucket layout changed, the
    new histogram is what was observed since the restart.
    """
    if new is None:
        return None
    if old is None or old.get("le") != new.get("le"):
        return new if old is not None else None
    cum = [b - a for a, b in zip(old["cum"], new["cum"], strict=True)]
    count = new["count"] - old["count"]
    if count < 0 or any(c < 0 for c in cum):
        return new
    return {"le": new["le"], "cum": cum, "count": count, "sum": (new.get("sum") or 0.0) - (old.get("sum") or 0.0)}


def hist_add(a: Hist | None, b: Hist | None) -> Hist | None:
    """Sum of two delta histograms with the same buckets (else the later one)."""
    if a is None:
        return b
    if b is None:
        return a
    if a["le"] != b["le"]:
        return b
    return {
        "le": a["le"],
        "cum": [x + y for x, y in zip(a["cum"], b["cum"], strict=True)],
        "count": a["count"] + b["count"],
        "sum": (a.get("sum") or 0.0) + (b.get("sum") or 0.0),
    }


def hist_quantile(q: float, le: Sequence[float], cum: Sequence[float], count: float) -> float | None:
    """Quantile ``q`` of a cumulative histogram, linearly interpolated within its bucket.

    ``le`` are the finite upper bounds, ascending; ``cum[i]`` the observations
    <= ``le[i]``; ``count`` all observations (the +Inf bucket). A quantile in the
    +Inf bucket returns the highest finite bound, as Prometheus does. The first
    bucket is taken to start at 0 (latencies are never negative).
    """
    if count <= 0 or not le:
        return None
    rank = q * count
    lower, below = 0.0, 0.0
    for bound, c in zip(le, cum, strict=True):
        if c >= rank and c > below:
            return lower + (bound - lower) * (rank - below) / (c - below)
        lower, below = bound, c
    return float(le[-1])


def hist_quantiles(h: Hist | None) -> dict[str, float | None] | None:
    """p50/p95/p99 of a (delta) histogram, or None when it holds no observations."""
    if h is None or not h.get("count"):
        return None
    return {name: hist_quantile(q, h["le"], h["cum"], h["count"]) for name, q in QUANTILES}


def _hists(e: EngineSample | None) -> dict[str, Hist]:
    if e is None:
        return {}
    h = e.extra.get("hist")
    return h if isinstance(h, dict) else {}


def hist_window(engines: Sequence[EngineSample], name: str, base: Hist | None = None) -> Hist | None:
    """Observations of histogram ``name`` made between the first and last read, across restarts.

    Ticks may omit ``hist`` when it did not change since the last tick that
    carried it (recordings stay small); ``base`` is the last one seen before
    ``engines`` begins, if any.
    """
    total: Hist | None = None
    prev: Hist | None = base
    for e in engines:
        cur = _hists(e).get(name)
        if cur is None:
            continue
        if prev is not None:
            total = hist_add(total, hist_delta(prev, cur))
        prev = cur
    return total


def read_age_s(e: EngineSample) -> float:
    """How old the engine's reading was at its tick (``read_age_s``; 0 when absent or invalid)."""
    v = e.extra.get("read_age_s")
    return float(v) if isinstance(v, int | float) and not isinstance(v, bool) and 0 <= v < 3600 else 0.0


def number(v: Any) -> float | None:
    """A reading as a float; None for anything not a number (a bool is not one)."""
    return float(v) if isinstance(v, int | float) and not isinstance(v, bool) else None


def _extra_total(e: EngineSample, keys: Sequence[str]) -> float | None:
    """The sum of the engine's cumulative counters ``keys`` in ``extra`` (None: it has none of them)."""
    vals = [v for k in keys if (v := number(e.extra.get(k))) is not None]
    return sum(vals) if vals else None


def http_overhead_s(engines: Sequence[EngineSample]) -> float | None:
    """The mean time per request a client waits outside the engine's own interval: the API server's
    HTTP duration of its generation requests (vLLM: ``http_request_duration_seconds``, HTTP in to the
    last byte out, read into ``http_seconds_total`` / ``http_requests_total``) less the engine's
    end-to-end latency (arrival to finish), both over the same readings. None where either is missing
    or their request counts disagree by more than one request and 10 % (requests in flight at an end)."""
    up = [e for e in engines if e.up]
    secs = counter_total(number(e.extra.get("http_seconds_total")) for e in up)
    n = counter_total(number(e.extra.get("http_requests_total")) for e in up)
    return http_overhead_from(secs, n, hist_window(up, "e2e_s"))


def http_overhead_from(secs: float | None, n: float | None, e2e: Hist | None) -> float | None:
    """:func:`http_overhead_s` from the HTTP seconds and requests counted and the e2e histogram's window."""
    if secs is None or not n or e2e is None or not e2e.get("count") or e2e.get("sum") is None:
        return None
    if abs(n - e2e["count"]) > max(1.0, 0.1 * max(n, e2e["count"])):
        return None
    return max(secs / n - e2e["sum"] / e2e["count"], 0.0)


def with_http(out: dict[str, Any], engines: Sequence[EngineSample]) -> None:
    """TTFT as the client waits, for an engine whose TTFT starts after its API server took the request:
    its quantiles shifted by :func:`http_overhead_s` (the engine's own kept as ``ttft_engine_s``)."""
    with_http_overhead(out, http_overhead_s(engines))


def with_http_overhead(out: dict[str, Any], over: float | None) -> None:
    """:func:`with_http` with the overhead already known."""
    out["http_overhead_s"] = over
    q = out.get("ttft_s")
    if over is None or not isinstance(q, dict):
        return
    out["ttft_engine_s"] = q
    out["ttft_s"] = {k: (v + over if isinstance(v, int | float) else v) for k, v in q.items()}


# ---- sliding window -------------------------------------------------------


class EngineStats:
    """Token rates and latency quantiles of the attached engine over the last ``window_s``."""

    def __init__(self, window_s: float = 10.0) -> None:
        self.window_s = window_s
        self._ticks: deque[tuple[float, EngineSample]] = deque()
        # Last histogram of each name from ticks that left the window: the base for deltas.
        self._base: dict[str, Hist] = {}

    def reset(self) -> None:
        self._ticks.clear()
        self._base.clear()

    def feed(self, sample: Sample) -> None:
        """Add one tick (ticks without an engine are ignored)."""
        e = sample.engine
        if e is None:
            return
        if self._ticks and sample.t < self._ticks[-1][0]:
            self.reset()  # time went backwards: a replay seek
        self._ticks.append((sample.t, e))
        # Keep one tick at or before the window start as the base for deltas.
        start = sample.t - self.window_s
        while len(self._ticks) > 1 and self._ticks[1][0] <= start:
            _, old = self._ticks.popleft()
            if old.up:
                self._base.update(_hists(old))

    def _rate(self, attr: str) -> float | None:
        # Over the time the counters were read (tick time minus the reading's age), not tick time.
        pts: list[tuple[float, Any]] = []
        for t, e in self._ticks:
            v = getattr(e, attr) if not attr.startswith("extra.") else _extra_total(e, attr[6:].split("+"))
            if not e.up or v is None:
                continue
            read_t = t - read_age_s(e)
            if pts and read_t - pts[-1][0] < 0.005:
                continue  # the same reading again (its age is rounded to ms): one point per reading
            pts.append((read_t, v))
        if len(pts) < 2:
            return None
        inc = counter_total(v for _, v in pts)
        return None if inc is None else inc / (pts[-1][0] - pts[0][0])

    def _hit_rate(self) -> float | None:
        """Share of the prompt tokens looked up in the engine's prefix cache over the window that were
        found there (``prefix_cache_hits_total`` / ``prefix_cache_queries_total`` increases), None: none."""
        up = [e.extra for _, e in self._ticks if e.up]
        hits = counter_total(number(x.get("prefix_cache_hits_total")) for x in up)
        queries = counter_total(number(x.get("prefix_cache_queries_total")) for x in up)
        return min(max(hits / queries, 0.0), 1.0) if hits is not None and queries else None

    def snapshot(self) -> dict[str, Any]:
        """Current figures; None wherever the engine does not expose one or no data yet."""
        last = self._ticks[-1][1] if self._ticks else None
        engines = [e for _, e in self._ticks if e.up]
        eng = registry.get(last.kind) if last is not None else None
        per_req_eng = eng if eng is not None and eng.per_request_timing else None
        sources: list[str] = []
        out: dict[str, Any] = {
            "kind": last.kind if last else None,
            "up": last.up if last else False,
            "phase": last.phase if last else None,
            "error": last.error if last else None,
            "window_s": self.window_s,
            # The time the ticks held cover: shorter than the window in its first seconds.
            "span_s": min(self.window_s, self._ticks[-1][0] - self._ticks[0][0]) if len(self._ticks) > 1 else None,
        }
        for key, attr, what in (
            ("prompt_tokens_per_s", "prompt_tokens_total", "prompt"),
            ("generation_tokens_per_s", "generation_tokens_total", "generation"),
        ):
            # Both are lower bounds where an engine has live_tokens: llama-server's counters move
            # only when a prompt or a request ends (nothing during a long prefill), its /slots miss
            # requests that start and end between two polls. The larger one is shown, unless the
            # engine's live count is exact (SGLang's realtime counters).
            got = eng.live_tokens(self._ticks, what) if eng is not None else None
            live = got[0] / got[1] if got is not None else None
            counted = self._rate(attr)
            exact = eng is not None and eng.live_tokens_exact
            if live is not None and (counted is None or live >= counted or exact):
                out[key] = live
                sources.append(f"{what}: {got[2]}" if got is not None else what)
            else:
                out[key] = counted
                if counted is not None:
                    sources.append(f"{key.split('_')[0]}: counter")
        # Ticks that left the window are dropped; the first tick may be the base at or
        # before the window start, whose requests ended before the window.
        ticks = list(self._ticks)
        if ticks and last is not None and ticks[0][0] <= ticks[-1][0] - self.window_s:
            ticks = ticks[1:]
        reqs = unique_requests(e for _, e in ticks) if per_req_eng else []
        self._latencies(out, engines, per_req_eng.request_latencies(reqs) if per_req_eng else None)
        up = last is not None and last.up
        out["requests_running"] = last.requests_running if up and last else None
        out["requests_waiting"] = last.requests_waiting if up and last else None
        kv = last.extra.get("kv_cache_util") if up and last else None
        out["kv_cache_util"] = kv if isinstance(kv, int | float) else None
        out["prefix_cache_hit_rate"] = self._hit_rate()
        out["kv_offload_Bps"] = self._rate("extra.kv_offload_h2d_bytes_total+kv_offload_d2h_bytes_total")
        out["quantile_method"] = quantile_method(per_req_eng)
        out["rate_source"] = ", ".join(sources) or None
        out["requests_timed"] = len(reqs) if per_req_eng else None
        return out

    def _latencies(self, out: dict[str, Any], engines: list[EngineSample], per_req: dict[str, Any] | None) -> None:
        """The latency quantiles: the engine's per-request ones, else its histograms' over the window (TTFT
        with the API server's time outside the engine's interval, where it exposes it)."""
        for name in LATENCIES:
            if per_req is not None:
                out[name] = per_req.get(name)
            else:
                out[name] = hist_quantiles(hist_window(engines, name, self._base.get(name)))
        out["ttft_engine_s"] = out["http_overhead_s"] = None
        if per_req is None:
            with_http(out, engines)


def quantile_method(eng: Engine | None) -> str:
    """How the latency quantiles were computed: the engine's own words, else histogram buckets."""
    return (eng.quantile_method if eng is not None else None) or QUANTILE_METHOD
