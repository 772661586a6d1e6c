"""Layering contracts: the data layer never imports Textual (import-linter + a runtime check)."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).parent.parent


def test_import_linter_contracts_hold():
    lint = Path(sys.executable).parent / "lint-imports"
    exe = str(lint) if lint.exists() else shutil.which("lint-imports")
    assert exe, "import-linter is a dev dependency; make test installs it"
    p = subprocess.run([exe], cwd=REPO, capture_output=True, text=True)
    assert p.returncode == 0, p.stdout + p.stderr
    assert "KEPT" in p.stdout and "BROKEN" not in p.stdout


def test_data_layer_imports_without_textual():
    code = (
        "import sys, importlib, pkgutil\n"
        "import pcie_tui\n"
        "for pkg in ('pcie_tui.model', 'pcie_tui.collect', 'pcie_tui.engines', 'pcie_tui.analyze', 'pcie_tui.record'):\n"
        "    m = importlib.import_module(pkg)\n"
        "    for info in pkgutil.walk_packages(getattr(m, '__path__', []), pkg + '.'):\n"
        "        importlib.import_module(info.name)\n"
        "assert not any(k == 'textual' or k.startswith('textual.') for k in sys.modules), 'textual imported'\n"
    )
    p = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True)
    assert p.returncode == 0, p.stderr
