"""Per-request statistics of engines that time each finished request (``Engine.per_request_timing``)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from pcie_tui.engines.stats import QUANTILES, quantile


def per_request_summary(requests: Sequence[dict[str, Any]]) -> dict[str, Any] | None:
    """Hook for engines that report per-request timings (``Engine.per_request_timing``).

    Each tick's ``engine.extra["requests"]`` lists the requests that finished
    since the previous tick, each a dict with any of ``prompt_tokens``,
    ``prompt_s``, ``generation_tokens``, ``generation_s``, ``ttft_s``. Returns
    p50/p95/p99 of per-request prompt tokens/s, generation tokens/s, prompt
    latency and TTFT (exact order statistics, not bucket estimates).
    """
    if not requests:
        return None

    def q3(vals: list[float]) -> dict[str, float] | None:
        if not vals:
            return None
        v = sorted(vals)
        return {name: quantile(v, q) for name, q in QUANTILES}

    def num(r: dict[str, Any], key: str, raw: str, scale: float = 1.0) -> float | None:
        # Older recordings carry only the server's own names (prompt_n, prompt_ms, ...).
        v = r.get(key)
        if isinstance(v, int | float):
            return float(v)
        v = r.get(raw)
        return float(v) * scale if isinstance(v, int | float) else None

    def rate(r: dict[str, Any], kind: str) -> float | None:
        raw = "prompt" if kind == "prompt" else "predicted"
        tok, sec = num(r, f"{kind}_tokens", f"{raw}_n"), num(r, f"{kind}_s", f"{raw}_ms", 1e-3)
        return tok / sec if tok is not None and sec is not None and tok > 0 and sec > 0 else None

    prompt_rates = [x for r in requests if (x := rate(r, "prompt")) is not None]
    gen_rates = [x for r in requests if (x := rate(r, "generation")) is not None]
    prompt_s = [x for r in requests if (x := num(r, "prompt_s", "prompt_ms", 1e-3)) is not None]
    ttft = [float(r["ttft_s"]) for r in requests if isinstance(r.get("ttft_s"), int | float)]
    return {
        "n": len(requests),
        "prompt_tokens_per_s": q3(prompt_rates),
        "generation_tokens_per_s": q3(gen_rates),
        "prompt_s": q3(prompt_s),
        "ttft_s": q3(ttft),
        "quantile_method": "exact over per-request timings",
    }
