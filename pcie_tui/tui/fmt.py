"""Number formatting for the screen: every figure carries its unit, None is "n/a" (pcie_tui.core.units)."""

from __future__ import annotations

from collections.abc import Callable

from pcie_tui.core import units

# The formatters are the one set of units (pcie_tui.core.units); the screen's names for them:
NA = units.NA
rate = units.rate_sig  # a live reading: 3 significant digits (5.16 GB/s, 836 kB/s)
gbps = units.rate  # a link capacity or an answer's rate: GB/s with one decimal
pct = units.pct
gib = units.gib
seconds = units.seconds
tokens_per_s = units.tokens_per_s
elapsed = units.elapsed  # the replay's position and length: 15.10 s, then 1:02:03 (the events' times, unsigned)
ago = units.ago  # a time axis' labels: -45 s, -43 min, -1:05 h


def watts(w: float | None) -> str:
    return NA if w is None else f"{w:.0f} W"


def offset(s: float | None) -> str:
    """Session time since the first tick (:func:`pcie_tui.core.units.elapsed` with a sign): ``+12.35 s``,
    ``+123.4 s``, then ``+0:16:40``, ``+1:02:03``: at most 8 characters for a session under 10 hours."""
    return NA if s is None else f"+{units.elapsed(s)}"


def count(v: float | None, unit: str) -> str:
    return NA if v is None else f"{v:.0f} {unit}"


def link(gen: int | None, width: int | None) -> str:
    """``Gen5 x16``; unknown parts as ``Gen?``/``x?``."""
    g = f"Gen{gen}" if gen is not None else "Gen?"
    w = f"x{width}" if width is not None else "x?"
    return f"{g} {w}"


# The one-value formatters a row of pcie_tui.core.metrics can name in ``Show.fmt``.
FORMATS: dict[str, Callable[[float | None], str]] = {
    "rate": rate,
    "gbps": gbps,
    "pct": pct,
    "gib": gib,
    "watts": watts,
    "seconds": seconds,
    "tokens_per_s": tokens_per_s,
}
