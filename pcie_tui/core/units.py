"""The one set of units: every rate, size, percentage, duration and token rate the tool prints.

Base layer: imports nothing from the project, nor Textual or Rich. Every formatter takes None
for "no reading" and answers :data:`NA`; a zero reading is a reading and keeps its unit.

A number and its unit never wrap apart: :func:`bind_units` glues each "number unit" pair with a
character that no wrapper breaks at, :func:`unbind_units` puts the plain space back, and
:func:`wrap` is a word wrap of plain text built on the two (the report and the TUI headline use it).
"""

from __future__ import annotations

import re
import textwrap

NA = "n/a"
NBSP = "\u00a0"

_SI = ((1e12, "TB"), (1e9, "GB"), (1e6, "MB"), (1e3, "kB"))


def _si(v: float, suffix: str) -> str:
    """3 significant digits with an SI prefix (GB = 1e9 B): 2.62 MB, 16.4 kB, 63.0 GB/s, 0 B/s."""
    a = abs(v)
    for scale, unit in _SI:
        if a >= scale * 0.9995:
            x = v / scale
            return f"{x:.{0 if abs(x) >= 99.95 else 1 if abs(x) >= 9.995 else 2}f} {unit}{suffix}"
    return f"{v:.0f} B{suffix}" if a >= 1 or v == 0 else f"{v:.2g} B{suffix}"


def rate(Bps: float | None) -> str:
    """A rate in bytes/s, the one format of every answer: GB/s with one decimal from 1 GB/s up
    (53.8 GB/s, a ceiling 63.0 GB/s); below, MB/s or kB/s with 3 significant digits (a quiet link is
    "249 kB/s", never "0.0 GB/s")."""
    if Bps is None:
        return NA
    return f"{Bps / 1e9:.1f} GB/s" if Bps >= 0.9995e9 else _si(Bps, "/s")


def rate_sig(Bps: float | None) -> str:
    """A rate in bytes/s with 3 significant digits at any size (5.16 GB/s, 836 kB/s, 4.22 TB/s):
    live readings that move, and the link model's budgets."""
    return NA if Bps is None else _si(Bps, "/s")


def size(n: float | None) -> str:
    """Bytes with 3 significant digits and an SI prefix: 2.62 MB, 16.4 kB."""
    return NA if n is None else _si(n, "")


def gib(n: float | None) -> str:
    """Memory in binary units, one decimal: 140.4 GiB."""
    return NA if n is None else f"{n / 2**30:.1f} GiB"


def pct(frac: float | None, *, space: bool = True, digits: int = 0) -> str:
    """A fraction 0..1 as a percentage: "88 %" in tables and panels, "88%" (``space=False``) inside a
    sentence (the headline and findings)."""
    if frac is None:
        return NA
    return f"{frac * 100:.{digits}f}{' ' if space else ''}%"


def seconds(s: float | None) -> str:
    """A latency or short duration: ms below one second (5.2 ms, 92 ms), s above (2.34 s)."""
    if s is None:
        return NA
    if abs(s) < 1.0:
        return f"{s * 1e3:.1f} ms" if abs(s) < 0.01 else f"{s * 1e3:.0f} ms"
    return f"{s:.2f} s"


def duration(s: float | None) -> str:
    """A span of a session, one decimal of a second: 18.6 s."""
    return NA if s is None else f"{s:.1f} s"


def elapsed(s: float | None) -> str:
    """Time into a session (or its length): ``12.35 s`` below 100 s, ``123.4 s`` below 1,000 s, then hours,
    minutes and seconds, ``0:16:40``, ``1:02:03``: at most 7 characters under 10 hours."""
    if s is None:
        return NA
    if round(s, 2) < 100:
        return f"{s:.2f} s"
    if round(s, 1) < 1000:
        return f"{s:.1f} s"
    minutes, sec = divmod(round(s), 60)
    hours, minutes = divmod(minutes, 60)
    return f"{hours}:{minutes:02d}:{sec:02d}"


def ago(s: float) -> str:
    """How long before now, for a time axis: ``-45 s`` under a minute, ``-43 min`` (``-1:30 min`` where the
    seconds are not whole minutes) under an hour, then ``-1:05 h`` (``-1:05:30 h``): never rounded, so two
    marks of an axis never read the same."""
    secs = round(s)
    if secs < 60:
        return f"-{s:g} s"
    minutes, sec = divmod(secs, 60)
    if minutes < 60:
        return f"-{minutes} min" if sec == 0 else f"-{minutes}:{sec:02d} min"
    hours, minutes = divmod(minutes, 60)
    return f"-{hours}:{minutes:02d} h" if sec == 0 else f"-{hours}:{minutes:02d}:{sec:02d} h"


def tokens_per_s(v: float | None) -> str:
    """A token rate: one decimal below 100 tok/s (11.7 tok/s), whole above (1572 tok/s)."""
    return NA if v is None else f"{v:.1f} tok/s" if v < 100 else f"{v:.0f} tok/s"


# ---- number and unit stay together ------------------------------------------------------------

UNITS = (
    "TB/s", "GB/s", "MB/s", "kB/s", "B/s", "tok/s", "TB", "GB", "MB", "kB", "B", "TiB", "GiB", "MiB", "KiB",
    "%", "s", "ms", "us", "µs", "ns", "min", "h", "W", "GHz", "MHz", "tokens", "token", "ticks", "tick",
)  # fmt: skip
# A space between a number (digit last) and one of UNITS that ends there (not "3 steps", "5 Bytes").
_PAIR = re.compile(
    r"(?<=\d) (?=(?:" + "|".join(re.escape(u) for u in sorted(UNITS, key=len, reverse=True)) + r")(?![\w/]))"
)


def bind_units(text: str, glue: str = NBSP) -> str:
    """Each "number unit" pair joined by ``glue`` instead of a space (a wrapper never breaks there)."""
    return _PAIR.sub(glue, text)


def unbind_units(text: str, glue: str = NBSP) -> str:
    """:func:`bind_units` undone: the plain space back."""
    return text.replace(glue, " ")


def wrap(text: str, width: int) -> list[str]:
    """One line of plain text wrapped at spaces to ``width`` columns, greedy, never between a
    number and its unit, nor at a hyphen ("link-saturated" stays whole)."""
    if len(text) <= width:
        return [text]
    lines = textwrap.wrap(bind_units(text), max(1, width), break_on_hyphens=False)
    return [unbind_units(ln) for ln in lines] or [""]
