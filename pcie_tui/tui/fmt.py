"""Number formatting for the screen: every figure carries its unit, None is "n/a"."""

from __future__ import annotations

from collections.abc import Callable

NA = "n/a"


def rate(Bps: float | None) -> str:
    """Bytes/s with an SI unit picked for the magnitude (GB = 1e9 B)."""
    if Bps is None:
        return NA
    v = abs(Bps)
    for div, unit in ((1e12, "TB/s"), (1e9, "GB/s"), (1e6, "MB/s"), (1e3, "kB/s")):
        if v >= div:
            x = Bps / div
            return f"{x:.2f} {unit}" if abs(x) < 10 else f"{x:.1f} {unit}" if abs(x) < 100 else f"{x:.0f} {unit}"
    return f"{Bps:.0f} B/s"


def gbps(Bps: float | None) -> str:
    """A link capacity, always in GB/s so ceilings compare at a glance."""
    return NA if Bps is None else f"{Bps / 1e9:.1f} GB/s"


def pct(util: float | None) -> str:
    """A fraction 0..1 as a whole percentage."""
    return NA if util is None else f"{util * 100:.0f} %"


def gib(n_bytes: float | None) -> str:
    return NA if n_bytes is None else f"{n_bytes / 2**30:.1f} GiB"


def watts(w: float | None) -> str:
    return NA if w is None else f"{w:.0f} W"


def seconds(s: float | None) -> str:
    """A latency: ms below one second, s above."""
    if s is None:
        return NA
    if abs(s) < 1.0:
        return f"{s * 1e3:.1f} ms" if abs(s) < 0.01 else f"{s * 1e3:.0f} ms"
    return f"{s:.2f} s"


def offset(s: float | None) -> str:
    """Session time since the first tick, e.g. ``+12.35 s``."""
    return NA if s is None else f"+{s:.2f} s"


def tokens_per_s(v: float | None) -> str:
    return NA if v is None else f"{v:.1f} tok/s" if v < 100 else f"{v:.0f} tok/s"


def count(v: float | None, unit: str) -> str:
    return NA if v is None else f"{v:.0f} {unit}"


def link(gen: int | None, width: int | None) -> str:
    """``Gen5 x16``; unknown parts as ``Gen?``/``x?``."""
    g = f"Gen{gen}" if gen is not None else "Gen?"
    w = f"x{width}" if width is not None else "x?"
    return f"{g} {w}"


# The one-value formatters a row of pcie_tui.metrics can name in ``Show.fmt``.
FORMATS: dict[str, Callable[[float | None], str]] = {
    "rate": rate,
    "gbps": gbps,
    "pct": pct,
    "gib": gib,
    "watts": watts,
    "seconds": seconds,
    "tokens_per_s": tokens_per_s,
}
