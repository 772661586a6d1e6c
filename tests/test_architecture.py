"""Layering contracts: model/record <- collect/engines <- analyze <- outputs, no cycles, no Textual in the data layer."""

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
        "for pkg in ('pcie_tui.core.model', 'pcie_tui.sources', 'pcie_tui.engines', 'pcie_tui.analyze', 'pcie_tui.recording'):\n"
        "    m = importlib.import_module(pkg)\n"
        "    for info in pkgutil.walk_packages(getattr(m, '__path__', []), pkg + '.'):\n"
        "        importlib.import_module(info.name)\n"
        "assert not any(k == 'textual' or k.startswith('textual.') for k in sys.modules), 'textual imported'\n"
    )
    p = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True)
    assert p.returncode == 0, p.stderr


def test_layers_and_cycles_are_enforced(tmp_path):
    """The contracts are not vacuous: a copy of the package with an engine module importing the
    analysis (a layer upwards) breaks the layers contract, and a base-layer cycle breaks the other."""
    lint = Path(sys.executable).parent / "lint-imports"
    exe = str(lint) if lint.exists() else shutil.which("lint-imports")
    assert exe
    shutil.copytree(REPO / "pcie_tui", tmp_path / "pcie_tui", ignore=shutil.ignore_patterns("__pycache__", "data"))
    shutil.copy(REPO / "pyproject.toml", tmp_path / "pyproject.toml")
    http = tmp_path / "pcie_tui" / "engines" / "http.py"
    http.write_text(http.read_text() + "\nfrom pcie_tui.analyze import session as _s  # noqa\n")
    errors = tmp_path / "pcie_tui" / "core" / "errors.py"
    errors.write_text(errors.read_text() + "\nfrom pcie_tui.core import model as _m  # noqa\n")
    model = tmp_path / "pcie_tui" / "core" / "model.py"
    if "pcie_tui.core.errors" not in model.read_text():
        model.write_text(model.read_text() + "\nfrom pcie_tui.core import errors as _e  # noqa\n")
    p = subprocess.run([exe], cwd=tmp_path, capture_output=True, text=True)
    assert p.returncode != 0
    assert "pcie_tui.engines is not allowed to import pcie_tui.analyze" in p.stdout, p.stdout
    assert "No cycles are allowed in pcie_tui." in p.stdout, p.stdout


def _modules():
    import ast

    root = Path(__file__).resolve().parent.parent
    for p in sorted((root / "pcie_tui").rglob("*.py")):
        yield p.relative_to(root).as_posix(), ast.parse(p.read_text(encoding="utf-8"))


def test_no_module_imports_another_modules_private_names():
    import ast

    bad = [
        f"{path}: from {n.module} import {a.name}"
        for path, tree in _modules()
        for n in ast.walk(tree)
        if isinstance(n, ast.ImportFrom) and (n.module or "").startswith("pcie_tui")
        for a in n.names
        if a.name.startswith("_") and not a.name.startswith("__")
    ]
    assert not bad, bad


def test_no_import_error_fallback_around_the_projects_own_modules():
    """``try: from pcie_tui... except ImportError`` hides a broken module behind a quiet fallback."""
    import ast

    def catches_import_error(h: ast.ExceptHandler) -> bool:
        names = [h.type] if not isinstance(h.type, ast.Tuple) else list(h.type.elts)
        return any(isinstance(x, ast.Name) and x.id in ("ImportError", "ModuleNotFoundError") for x in names)

    bad = []
    for path, tree in _modules():
        for n in ast.walk(tree):
            if isinstance(n, ast.Try) and any(catches_import_error(h) for h in n.handlers):
                own = [
                    i
                    for stmt in n.body
                    for i in ast.walk(stmt)
                    if isinstance(i, ast.ImportFrom)
                    and (i.module or "").startswith("pcie_tui")
                    or isinstance(i, ast.Import)
                    and any(a.name.startswith("pcie_tui") for a in i.names)
                ]
                if own:
                    bad.append(f"{path}:{n.lineno}")
    assert not bad, bad


def test_pynvml_is_imported_in_one_place():
    """The one NVML wrapper (collect/nvml.load_nvml) imports pynvml; doctor and everything else go through it."""
    import ast

    seen = sorted(
        path
        for path, tree in _modules()
        for n in ast.walk(tree)
        if isinstance(n, ast.Import)
        and any(a.name == "pynvml" for a in n.names)
        or isinstance(n, ast.ImportFrom)
        and n.module == "pynvml"
    )
    assert seen == ["pcie_tui/sources/nvml.py"], seen


def test_mypy_covers_the_data_layer_the_outputs_and_the_tui():
    """``make lint`` runs mypy on pyproject's [tool.mypy] files: the TUI is among them (it was not, and
    widgets._shape passed Textual a styles object where a rules mapping is typed)."""
    import tomllib

    files = tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["mypy"]["files"]
    for pkg in ("core", "analyze", "recording", "sources", "engines", "export", "tui"):
        assert f"pcie_tui/{pkg}" in files, pkg
    assert "$(VENV)/bin/mypy" in (REPO / "Makefile").read_text()
