"""Statistics the engines and the analysis share: quantiles of plain lists (no numpy: the live
collectors import this) and the finished requests of per-request-timing engines."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from pcie_tui.core.model import EngineSample

QUANTILES = (("p50", 0.50), ("p95", 0.95), ("p99", 0.99))


def quantile(sorted_values: list[float], q: float) -> float:
    """Linear-interpolated quantile of already sorted values."""
    if len(sorted_values) == 1:
        return sorted_values[0]
    pos = q * (len(sorted_values) - 1)
    lo = int(pos)
    hi = min(lo + 1, len(sorted_values) - 1)
    return sorted_values[lo] + (sorted_values[hi] - sorted_values[lo]) * (pos - lo)


# What tells two finished requests apart (a tick may repeat a scrape).
REQUEST_IDENTITY = ("t", "seq", "slot", "task", "prompt_n", "prompt_ms", "predicted_n", "predicted_ms")


def unique_requests(engines: Iterable[EngineSample | None]) -> list[dict[str, Any]]:
    """Finished requests of ``extra["requests"]`` over ticks, each once (a tick may repeat a scrape)."""
    seen: set[tuple[Any, ...]] = set()
    out: list[dict[str, Any]] = []
    for e in engines:
        reqs = e.extra.get("requests") if e is not None else None
        if not isinstance(reqs, list):
            continue
        for r in reqs:
            if not isinstance(r, dict):
                continue
            key = tuple(r.get(k) for k in REQUEST_IDENTITY)
            if key not in seen:
                seen.add(key)
                out.append(r)
    return out


def extra_counter_total(ticks: Iterable[tuple[float, EngineSample]], key: str) -> tuple[float, float] | None:
    """(increase, seconds) of the cumulative counter ``extra[key]`` over the answering ticks that carry it,
    timed when it was read (tick time less ``extra["read_age_s"]``; one point per reading); a drop is a
    restart from zero. None with fewer than two readings."""
    pts: list[tuple[float, float]] = []
    for t, e in ticks:
        v = e.extra.get(key) if e.up else None
        if not isinstance(v, int | float) or isinstance(v, bool):
            continue
        age = e.extra.get("read_age_s")
        read_t = t - (float(age) if isinstance(age, int | float) and 0 <= age < 3600 else 0.0)
        if pts and read_t - pts[-1][0] < 0.005:
            continue
        pts.append((read_t, float(v)))
    if len(pts) < 2 or pts[-1][0] <= pts[0][0]:
        return None
    total = sum(b - a if b >= a else b for (_, a), (_, b) in zip(pts, pts[1:], strict=False))
    return total, pts[-1][0] - pts[0][0]
