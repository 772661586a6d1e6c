"""llama-server token timing: per-request log timings and /slots token counts.

Pure functions over :class:`~pcie_tui.core.model.EngineSample` ticks; no I/O. The llama.cpp
engine's timing hooks (``live_tokens``, ``request_latencies``): llama-server has no
latency histograms and whose token counters move only when a prompt is done / a
request ends.

Per-request timings (``extra["requests"]``, from the log; ``prompt_n``, ``prompt_ms``,
``predicted_n``, ``predicted_ms``): ``prompt_ms`` runs from the slot's first prompt tokens in
a batch to its first token (prefill, server side) and ``predicted_ms`` spans ``predicted_n - 1``
inter-token gaps. Where the log also showed when the request arrived and was given its slot
(:mod:`.clock`: ``client_ttft_s``, ``queue_s``, ``slot_setup_s``, ``batch_wait_s``), TTFT is the
client's: wait for a slot + slot setup + wait for batch room + prefill. Else TTFT = prefill, a
lower bound, and the basis says so.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from pcie_tui.core.model import EngineSample
from pcie_tui.engines.base import RequestTiming
from pcie_tui.engines.stats import QUANTILES, quantile


def _num(v: Any) -> float | None:
    return float(v) if isinstance(v, int | float) and not isinstance(v, bool) else None


def _q3(vals: list[float]) -> dict[str, float] | None:
    if not vals:
        return None
    v = sorted(vals)
    return {name: quantile(v, q) for name, q in QUANTILES}


def request_timing(r: Mapping[str, Any]) -> RequestTiming | None:
    """One finished llama-server request as typed latencies (None: it holds no timing to read).

    prefill_s = ttft_s = prompt_ms / 1e3 (server side), for a request with prompt tokens (or no
    count); decode_s = predicted_ms / 1e3 and itl_mean_s = predicted_ms / (predicted_n - 1) / 1e3
    for a request that generated at least 2 tokens.
    """
    pn, pms = _num(r.get("prompt_n")), _num(r.get("prompt_ms"))
    gn, gms = _num(r.get("predicted_n")), _num(r.get("predicted_ms"))
    prompt_s = pms / 1e3 if pms is not None and pms >= 0 and (pn is None or pn > 0) else None
    timed = gn is not None and gms is not None and gn >= 2 and gms >= 0
    decode_s = gms / 1e3 if timed and gms is not None else None
    itl = gms / (gn - 1) / 1e3 if timed and gms is not None and gn is not None else None
    if prompt_s is None and decode_s is None:
        return None
    client, queue, setup = _num(r.get("client_ttft_s")), _num(r.get("queue_s")), _num(r.get("slot_setup_s"))
    ttft = client if client is not None and client >= 0 else prompt_s
    return RequestTiming(
        ttft_s=ttft, prefill_s=prompt_s, decode_s=decode_s, itl_mean_s=itl, queue_s=queue, setup_s=setup
    )


def request_latencies(requests: Sequence[Mapping[str, Any]]) -> dict[str, dict[str, float] | None]:
    """p50/p95/p99 of ttft_s, itl_s, prefill_s, decode_s, queue_s, setup_s over per-request llama-server timings
    (each request as :func:`request_timing` reads it; itl_s: each request's mean gap). TTFT and queue
    come from the requests whose arrival was seen when any were (the client's TTFT), else TTFT is the
    prefill (a lower bound) and the queue unknown."""
    timings = [t for r in requests if (t := request_timing(r)) is not None]
    prefill = [t.prefill_s for t in timings if t.prefill_s is not None]
    decode = [t.decode_s for t in timings if t.decode_s is not None]
    itl = [t.itl_mean_s for t in timings if t.itl_mean_s is not None]
    queue = [t.queue_s for t in timings if t.queue_s is not None]
    ttft = [t.ttft_s for t in timings if t.queue_s is not None and t.ttft_s is not None] if queue else prefill
    setup = [t.setup_s for t in timings if t.setup_s is not None]
    return {
        "ttft_s": _q3(ttft),
        "itl_s": _q3(itl),
        "prefill_s": _q3(prefill),
        "decode_s": _q3(decode),
        "queue_s": _q3(queue),
        "setup_s": _q3(setup),
    }


# ---- /slots token counts (llama-server) -----------------------------------


def slot_tokens_total(engines: Iterable[tuple[float, EngineSample]], key: str) -> tuple[float, float] | None:
    """(tokens, seconds) counted by /slots' per-slot ``key`` (n_decoded / n_prompt_processed).

    Sum over slots of each count's increases between ticks that carried /slots; a count
    that drops, or a slot that moved to another ``task``, belongs to a new request and
    adds its whole value; an idle slot that shows no count starts again from 0. Tokens a
    request produced after the last scrape before it ended are not seen. None with fewer
    than two ticks carrying the count.
    """
    prev: dict[Any, tuple[float, Any]] = {}
    total = 0.0
    t_first: float | None = None
    t_last: float | None = None
    for t, e in engines:
        slots = e.extra.get("slots") if e.up else None
        if not isinstance(slots, list):
            continue
        seen = False
        for s in slots:
            if not isinstance(s, dict):
                continue
            sid, cur, task = s.get("id"), _num(s.get(key)), s.get("task")
            if cur is None:
                if s.get("processing") is False:
                    prev[sid] = (0.0, None)
                continue
            seen = True
            if sid in prev:
                p, ptask = prev[sid]
                new_req = cur < p or (task is not None and ptask is not None and task != ptask)
                total += cur if new_req else cur - p
            prev[sid] = (cur, task)
        if seen:
            if t_first is None:
                t_first = t
            else:
                t_last = t
    if t_first is None or t_last is None or t_last <= t_first:
        return None
    return total, t_last - t_first
