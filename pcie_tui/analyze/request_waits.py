"""What finished requests waited on, accumulated tick by tick (the analyzer's chunks, in order): each request's
time to first token as its client waited and the engine's own work before it started (llama-server: slot
setup, where its host prompt cache saves and loads; see :mod:`pcie_tui.engines.llamacpp.clock`), and the
engine's count of prompt tokens served from a cache. The price of a housekeeping fix rests on these."""

from __future__ import annotations

from dataclasses import dataclass
from itertools import compress, repeat
from operator import is_not, itemgetter
from typing import Any

from pcie_tui.analyze.columns import Chunk
from pcie_tui.analyze.engine_bytes import chunk_up_fields
from pcie_tui.engines.stats import REQUEST_IDENTITY, quantile

CACHED = "prompt_tokens_cached_total"  # llama-server's /metrics: prompt tokens reused from a cache


@dataclass(frozen=True)
class Waits:
    """Medians over the finished requests that carry them (None: none did)."""

    n: int = 0
    ttft_p50_s: float | None = None
    setup_p50_s: float | None = None
    cached_tokens: float | None = None  # prompt tokens the engine served from its cache over the session


def _num(v: Any) -> float | None:
    return float(v) if isinstance(v, int | float) and not isinstance(v, bool) else None


class RequestWaits:
    """Fed the analyzer's chunks; :meth:`waits` gives the medians so far."""

    def __init__(self) -> None:
        self._seen: set[tuple[Any, ...]] = set()
        self._ttft: list[float] = []
        self._setup: list[float] = []
        self._cached_first: float | None = None
        self._cached_last: float | None = None
        self._cached_sum = 0.0

    def feed_chunk(self, ch: Chunk) -> None:
        keys = ch.engine_keys  # (None: not known; else no sweep for a key no reading of the block holds)
        want_cached, want_requests = keys is None or CACHED in keys, keys is None or "requests" in keys
        if not (want_cached or want_requests):
            return
        ups = chunk_up_fields(ch)
        xs: list[dict[str, Any]] = list(compress(ups, map(is_not, ups, repeat(None))))  # type: ignore[arg-type]
        cached = (
            list(map(itemgetter(CACHED), compress(xs, map(dict.__contains__, xs, repeat(CACHED)))))
            if want_cached
            else []
        )
        if cached:
            self._cached(cached if set(map(type, cached)) <= {float, int} else list(map(_num, cached)))
        if not want_requests:
            return
        for x in compress(xs, map(dict.__contains__, xs, repeat("requests"))):  # C-level sweeps: most have none
            for r in x["requests"] or ():
                if isinstance(r, dict):
                    self._request(r)

    def _request(self, r: dict[str, Any]) -> None:
        key = tuple(r.get(k) for k in REQUEST_IDENTITY)
        if key in self._seen:
            return
        self._seen.add(key)
        ttft, setup = _num(r.get("client_ttft_s")), _num(r.get("slot_setup_s"))
        if ttft is not None and setup is not None:
            self._ttft.append(ttft)
            self._setup.append(setup)

    def _cached(self, values: list[float | None]) -> None:
        """The cached-prompt-token counter's reads, in order (None: not read)."""
        first, last, total = self._cached_first, self._cached_last, self._cached_sum
        for v in values:
            if v is None:
                continue
            if first is None:
                first = v
            elif last is not None and v < last:  # restarted from zero
                total += last - (first or 0.0)
                first = 0.0
            last = v
        self._cached_first, self._cached_last, self._cached_sum = first, last, total

    def waits(self) -> Waits:
        cached = None
        if self._cached_first is not None and self._cached_last is not None:
            cached = self._cached_sum + self._cached_last - self._cached_first
        return Waits(
            n=len(self._ttft),
            ttft_p50_s=quantile(sorted(self._ttft), 0.5) if self._ttft else None,
            setup_p50_s=quantile(sorted(self._setup), 0.5) if self._setup else None,
            cached_tokens=cached,
        )
