"""The client's wait for its first token, in parts, for an engine that times its requests in histograms.

An engine that names the parts of its TTFT it times itself (``Engine.ttft_parts``: vLLM's queue and prefill
histograms, each a disjoint interval inside its TTFT) gets its TTFT decomposed:

    client TTFT = API-server time outside the engine (HTTP) + the engine's own hand-off (``ttft_rest``)
                  + queue + prefill

Per part, p50/p95/p99 come from the part's own histogram (interpolated within buckets, as every histogram
quantile here). Histograms carry no request identity, so those quantiles do not add up; the means do: each
part's mean is its histogram's sum over its count over the same readings, the hand-off is the engine's mean
TTFT less its timed parts, and the HTTP time is the API server's mean duration less the engine's mean e2e
latency (:func:`pcie_tui.analyze.engine.http_overhead_from`). Where a part cannot be measured the result says
which and why (``unmeasured``, in the engine's words: ``Engine.unmeasured_waits``). Pure; no I/O.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from pcie_tui.analyze.engine import Hist, hist_quantiles
from pcie_tui.engines.base import Engine

# Counts of the parts' histograms may differ from TTFT's by requests in flight at the ends (TTFT is observed at
# the first token, the parts when a request finishes): beyond this share the means are over different requests.
COUNT_SLACK = 0.10


def _mean(h: Hist | None) -> float | None:
    if h is None or not h.get("count") or h.get("sum") is None:
        return None
    return float(h["sum"]) / float(h["count"])


REST_SLACK_S = 0.005  # histogram means of separately timed parts may exceed TTFT's by rounding, no more


def ttft_parts(eng: Engine | None, hists: Mapping[str, Hist | None], http_s: float | None) -> dict[str, Any] | None:
    """``report --json``'s ``engine.ttft_parts`` over the session's histogram windows (``hists``: key -> the
    window's observations); None where the engine names no parts or no TTFT was observed."""
    if eng is None or not eng.ttft_parts:
        return None
    ttft = hists.get("ttft_s")
    ttft_mean = _mean(ttft)
    if ttft is None or ttft_mean is None:
        return None
    n = float(ttft["count"])
    parts = {k: _mean(hists.get(k)) for k in eng.ttft_parts}
    counts = {k: float(h["count"]) for k in eng.ttft_parts if (h := hists.get(k)) is not None and h.get("count")}
    timed = [v for v in parts.values() if v is not None]
    apart = [k for k, c in counts.items() if abs(c - n) > max(1.0, COUNT_SLACK * n)]
    rest = ttft_mean - sum(timed) if len(timed) == len(parts) else None
    unmeasured = list(eng.unmeasured_waits)
    if rest is not None and (apart or rest < -REST_SLACK_S):
        # means over different requests, or parts that do not fit inside TTFT: the difference is no hand-off time
        unmeasured.append(
            f"{eng.ttft_rest}: the parts' means "
            + ("cover different requests" if apart else f"exceed TTFT's mean by {-rest * 1e3:.1f} ms")
        )
        rest = None
    client = ttft_mean + http_s if http_s is not None else None
    means: dict[str, float | None] = {"http_s": http_s, "rest_s": rest, **parts}
    if http_s is None:
        unmeasured.append("the API server's HTTP time: not exposed or its request counts disagree with the engine's")
    pre = hists.get("preemptions_n")
    return {
        "requests": n,
        "parts": ["http_s", "rest_s", *eng.ttft_parts],
        "rest_is": eng.ttft_rest,
        "mean_s": means,
        "sum_s": sum(v for v in means.values() if v is not None),
        "ttft_engine_mean_s": ttft_mean,
        "ttft_client_mean_s": client,
        "quantiles": {k: hist_quantiles(hists.get(k)) for k in (*eng.ttft_parts, "ttft_s", "decode_s", "itl_s")},
        "counts": counts,
        "counts_apart": apart or None,  # parts whose count is not TTFT's (means over different requests)
        # The engine's count of preemptions per finished request (its mean) and in all: their time is not known.
        "preemptions_per_request": _mean(pre),
        "preemptions": pre.get("sum") if pre is not None else None,
        "unmeasured": unmeasured,
    }


def parts_line(tp: Mapping[str, Any]) -> str:
    """The report's one line of the decomposition: each part's mean, their sum, the client's mean TTFT."""
    m = tp.get("mean_s") or {}
    names = {"http_s": "HTTP (API server, outside the engine)", "rest_s": str(tp.get("rest_is") or "the rest")}
    names |= {"queue_s": "queue", "prefill_s": "prefill", "setup_s": "setup"}
    shown = [
        f"{names.get(k, k)} {'n/a' if m.get(k) is None else f'{m[k] * 1e3:.1f} ms'}" for k in tp.get("parts") or ()
    ]
    total = tp.get("ttft_client_mean_s") or tp.get("ttft_engine_mean_s")
    return (
        f"TTFT in parts (means over {tp.get('requests', 0):g} requests): " + " + ".join(shown)
        + f" = {tp.get('sum_s', 0.0) * 1e3:.1f} ms (TTFT mean {'n/a' if total is None else f'{total * 1e3:.1f} ms'})"
    )  # fmt: skip
