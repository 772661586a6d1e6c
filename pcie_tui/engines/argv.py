"""Reading flags off an engine's command line (``--flag v``, ``--flag=v``, ``-f v``, ``-f=v``)."""

from __future__ import annotations

import os
import re
from collections.abc import Sequence
from pathlib import Path
from typing import Any


def flag_values(argv: Sequence[str], spec: dict[str, tuple[str, ...]]) -> dict[str, str | bool]:
    """Values of the flags in ``spec`` from ``--flag v``, ``--flag=v``, ``-f v`` and ``-f=v`` (last wins).

    A flag with no value after it (end of argv or another flag follows) reads True.
    """
    alias = {name: key for key, names in spec.items() for name in names}
    out: dict[str, str | bool] = {}
    i = 0
    while i < len(argv):
        a = argv[i]
        name, eq, val = a.partition("=")
        if name in alias:
            if eq:
                out[alias[name]] = val
            elif i + 1 < len(argv) and not is_flag(argv[i + 1]):
                out[alias[name]] = argv[i + 1]
                i += 1
            else:
                out[alias[name]] = True
        i += 1
    return out


def is_flag(a: str) -> bool:
    """``-x`` or ``--xyz``, but not a negative number."""
    return a.startswith("-") and not re.fullmatch(r"-\d+(\.\d+)?", a)


def int_or(v: str | bool | None, default: Any = None) -> Any:
    """``v`` as an int when it reads as one, the text when not, ``default`` when absent."""
    if v is None or isinstance(v, bool):
        return default
    try:
        return int(v)
    except ValueError:
        return v


def dist_version(argv: Sequence[str], glob: str, pattern: str) -> str | None:
    """An installed package's version, from the dist-info beside the interpreter in ``argv[0]`` (no import).

    ``glob`` picks the dist-info folders (``vllm*.dist-info``); ``pattern`` matches a folder name with
    the version as its first group.
    """
    exe = argv[0] if argv else ""
    if not os.path.isabs(exe):
        return None
    for d in sorted(Path(exe).parent.parent.glob(f"lib/python3*/site-packages/{glob}")):
        m = re.fullmatch(pattern, d.name)
        if m:
            return m.group(1)
    return None
