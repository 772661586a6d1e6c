"""Argument types and widths of the command line (no pcie_tui imports: :mod:`pcie_tui.cli.main` uses them)."""

from __future__ import annotations

import argparse
import contextlib
import math
import os
import sys
from collections.abc import Callable, Iterator, Sequence
from typing import Any

from pcie_tui.core.errors import UserError


def positive(kind: type = float, hi: float | None = None, lo: float | None = None) -> Callable[[str], Any]:
    """A finite number > 0 (and >= ``lo``, <= ``hi`` where given); nan, inf and the rest are one clear error."""

    def conv(s: str) -> Any:
        try:
            v = kind(s)
        except ValueError:
            raise argparse.ArgumentTypeError(f"not a number: {s!r}") from None
        if not math.isfinite(v) or v <= 0:
            raise argparse.ArgumentTypeError(f"must be a number > 0: {s!r}")
        if lo is not None and v < lo:
            raise argparse.ArgumentTypeError(f"must be >= {lo:g}: {s!r}")
        if hi is not None and v > hi:
            raise argparse.ArgumentTypeError(f"must be <= {hi:g}: {s!r}")
        return v

    return conv


# 10 Hz is the fastest useful rate with GPM (its samples need >= 100 ms), 100 Hz the most any
# counter here can change at; a minute between ticks is the slowest a monitor is useful at.
INTERVAL_MIN_S, INTERVAL_MAX_S = 0.01, 60.0
SPEED_MAX = 1000.0


def gpu_list(s: str) -> list[int]:
    try:
        out = [int(x) for x in s.split(",") if x.strip()]
    except ValueError:
        out = []
    if not out or any(i < 0 for i in out):
        raise argparse.ArgumentTypeError(f"expected GPU indices like 0,1: {s!r}")
    return out


def piped_width() -> int:
    """Piped or redirected there is no terminal to follow: COLUMNS when it is set (40-1000), else
    160, so that a pipe does not wrap at 80 columns."""
    try:
        cols = int(os.environ.get("COLUMNS", ""))
    except ValueError:
        return 160
    return cols if 40 <= cols <= 1000 else 160


def need_terminal(command: str, instead: str) -> None:
    """The live view reads keys from stdin and draws on stderr (Textual): refuse, in one line, where
    either is not a terminal (a pipe, a file, cron) rather than write escape codes into it."""
    if os.environ.get("TEXTUAL_DRIVER"):  # `textual serve` and other drivers that are not a terminal's
        return
    streams = {"stdin": sys.__stdin__, "stderr": sys.__stderr__}
    missing = [name for name, f in streams.items() if f is None or not isatty(f)]
    if missing:
        what = f"{missing[0]} is not a terminal" if len(missing) == 1 else "stdin and stderr are not terminals"
        raise UserError(f"{command} draws a live view and {what}; {instead}")


def isatty(f: Any) -> bool:
    try:
        return bool(f.isatty())
    except (OSError, ValueError):  # closed or detached
        return False


@contextlib.contextmanager
def one_blas_thread() -> Iterator[None]:
    """numpy's bundled OpenBLAS starts one thread per core at import, and they spin: 2.3 s of CPU at
    start-up on a 16-core H200 host (0.35 s with one thread; bench/results.md). pcie-tui does no BLAS
    work: one thread, unless the user set it. OpenBLAS reads it once, at load, so the caller's
    environment is given back on the way out."""
    if "OPENBLAS_NUM_THREADS" in os.environ:
        yield
        return
    os.environ["OPENBLAS_NUM_THREADS"] = "1"
    try:
        yield
    finally:
        os.environ.pop("OPENBLAS_NUM_THREADS", None)


def pick_engine(found: Sequence[Any], interactive: bool) -> Any:
    """Several engines found: ask on a terminal, else one line naming them."""
    lines = [f"  [{i}] {c.kind} pid {c.pid} {c.url or '(no port yet)'}" for i, c in enumerate(found)]
    if not interactive or not isatty(sys.stdin):
        raise UserError(
            "several engines are running; pick one with --pid or --url: " + "; ".join(x.strip() for x in lines)
        )
    print("Several inference engines are running:", file=sys.stderr)
    print("\n".join(lines), file=sys.stderr)
    while True:
        ans = input(f"attach to which [0-{len(found) - 1}]? ").strip()
        if ans.isdigit() and int(ans) < len(found):
            return found[int(ans)]
        print("  type one of the numbers in brackets", file=sys.stderr)
