"""No function or method in pcie_tui/ is over 60 lines: one that grows past that is split along a real seam.

Lines are counted with ast, ``end_lineno - lineno + 1`` (decorators excluded). Data tables are not
functions, so they are not counted. ALLOWED lists the functions still waiting to be split; it only
shrinks.
"""

from __future__ import annotations

import ast
from pathlib import Path

PACKAGE = Path(__file__).parent.parent / "pcie_tui"
MAX_LINES = 60
ALLOWED: set[tuple[str, str]] = set()


def _sizes() -> dict[tuple[str, str, int], int]:
    """(module path, function name, first line) -> lines, for every function and method in the package."""
    out = {}
    for p in sorted(PACKAGE.rglob("*.py")):
        path = p.relative_to(PACKAGE.parent).as_posix()
        for node in ast.walk(ast.parse(p.read_text(encoding="utf-8"), filename=path)):
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                assert node.end_lineno is not None
                out[(path, node.name, node.lineno)] = node.end_lineno - node.lineno + 1
    return out


def test_every_function_is_at_most_60_lines():
    sizes = _sizes()
    assert len({path for path, _, _ in sizes}) > 50, f"found functions in too few modules under {PACKAGE}"
    over = {key: n for key, n in sizes.items() if n > MAX_LINES and key[:2] not in ALLOWED}
    assert not over, "over {} lines (split along a real seam): {}".format(
        MAX_LINES, ", ".join(f"{p}:{line} {name} ({n})" for (p, name, line), n in sorted(over.items()))
    )


def test_the_allowlist_holds_only_functions_still_over_60_lines():
    """An entry whose function was split (or renamed) is dropped, so it cannot hide a new long one."""
    longest: dict[tuple[str, str], int] = {}
    for (path, name, _line), n in _sizes().items():
        longest[(path, name)] = max(n, longest.get((path, name), 0))
    stale = sorted(key for key in ALLOWED if longest.get(key, 0) <= MAX_LINES)
    assert not stale, f"no longer over {MAX_LINES} lines (or gone): drop from ALLOWED: {stale}"
