"""No module in pcie_tui/ is over 400 lines: a module that grows past that is split along a real seam."""

from __future__ import annotations

from pathlib import Path

PACKAGE = Path(__file__).parent.parent / "pcie_tui"
MAX_LINES = 400


def _sizes() -> dict[str, int]:
    return {
        p.relative_to(PACKAGE.parent).as_posix(): len(p.read_text(encoding="utf-8").splitlines())
        for p in sorted(PACKAGE.rglob("*.py"))
    }


def test_every_module_is_at_most_400_lines():
    sizes = _sizes()
    assert len(sizes) > 50, f"found only {len(sizes)} modules under {PACKAGE}"
    over = {path: n for path, n in sizes.items() if n > MAX_LINES}
    assert not over, "over {} lines (split along a real seam): {}".format(
        MAX_LINES, ", ".join(f"{p} ({n})" for p, n in sorted(over.items()))
    )
