"""Prometheus exposition text in its plainest shape (no labels), read in one pass."""

from __future__ import annotations

_TYPES = frozenset((b"counter", b"gauge", b"untyped", b"histogram", b"summary"))


def parse_plain(body: bytes) -> dict[str, float] | None:
    """The common shape (``# HELP``/``# TYPE`` lines and ``name value`` samples, no labels) in one pass;
    None when anything else is in the text (then prometheus_client's parser reads it).

    Names as prometheus_client gives them: a counter whose name lacks ``_total`` gets it.
    """
    out: dict[str, float] = {}
    renamed = b""  # the current family, when it is a counter named without _total
    for line in body.split(b"\n"):
        if not line:
            continue
        if line[0] == 35:  # "#"
            parts = line.split(None, 3)
            if len(parts) == 4 and parts[1] == b"TYPE" and parts[3] in _TYPES:
                renamed = parts[2] if parts[3] == b"counter" and not parts[2].endswith(b"_total") else b""
                continue
            if len(parts) >= 3 and parts[1] == b"HELP":
                continue
            return None
        parts = line.split()
        if len(parts) != 2 or b"{" in parts[0]:
            return None
        name = parts[0] + b"_total" if parts[0] == renamed else parts[0]
        try:
            out[name.decode("ascii")] = float(parts[1])
        except (ValueError, UnicodeDecodeError):
            return None
    return out
