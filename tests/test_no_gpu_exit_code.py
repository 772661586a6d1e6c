"""No GPU is one exit code across commands (README "Exit codes"): 3, with one line on stderr. A stand-in
``pynvml`` whose library cannot start, as on a machine without the NVIDIA driver, stands in for NVML, and
engine discovery finds nothing, so it runs the same on a GPU machine and beside the suite's engines."""

from __future__ import annotations

import re
import sys
import types
from pathlib import Path

import pytest

from pcie_tui.cli.main import main
from pcie_tui.core.errors import NoGpuError, UserError

REPO = Path(__file__).resolve().parents[1]
NO_GPU = 3


def _no_driver() -> types.ModuleType:
    mod = types.ModuleType("pynvml")

    class NVMLError(Exception):
        def __str__(self) -> str:
            return "NVML Shared Library Not Found"

    def nvml_init() -> None:
        raise NVMLError()

    mod.NVMLError = NVMLError  # type: ignore[attr-defined]
    mod.nvmlInit = nvml_init  # type: ignore[attr-defined]
    return mod


@pytest.fixture
def no_gpu(monkeypatch: pytest.MonkeyPatch) -> None:
    from pcie_tui.engines import discover

    monkeypatch.setitem(sys.modules, "pynvml", _no_driver())
    monkeypatch.setattr(discover, "discover", lambda *a, **k: [])


def _one_line(capsys: pytest.CaptureFixture[str]) -> str:
    cap = capsys.readouterr()
    lines = cap.err.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in cap.err, cap.err
    return lines[0]


def test_no_gpu_is_one_exit_code_in_the_code() -> None:
    assert NoGpuError.exit_code == NO_GPU and UserError.exit_code == 2


def test_record_headless_without_a_gpu_or_an_engine_exits_3(no_gpu, tmp_path, capsys):
    """Nothing to watch: no NVML and no engine found. One line that says both, without "showing GPUs
    only" (there are none), and no file written."""
    out = tmp_path / "never.jsonl"
    assert main(["record", "--headless", "--duration", "1", "--out", str(out)]) == NO_GPU
    line = _one_line(capsys)
    assert line.startswith("pcie-tui: error: nothing to watch: GPU side unavailable (NVML could not start")
    assert "process found" in line and "showing GPUs only" not in line
    assert not out.exists()


def test_record_headless_no_engine_without_a_gpu_exits_3(no_gpu, tmp_path, capsys):
    out = tmp_path / "never.jsonl"
    assert main(["record", "--headless", "--no-engine", "--duration", "1", "--out", str(out)]) == NO_GPU
    assert _one_line(capsys).startswith("pcie-tui: error: NVML could not start (NVML Shared Library Not Found)")
    assert not out.exists()


@pytest.mark.parametrize("extra", [[], ["--json"]])
def test_doctor_without_a_gpu_exits_3(no_gpu, capsys, extra):
    assert main(["doctor", "--load-s", "0", *extra]) == NO_GPU
    line = _one_line(capsys)
    assert line == "pcie-tui: error: no NVIDIA GPU reachable: NVML could not start (NVML Shared Library Not Found)"


def test_calibrate_without_a_gpu_exits_3(no_gpu, capsys):
    assert main(["calibrate", "--no-save"]) == NO_GPU
    assert "NVML could not start" in _one_line(capsys)


def test_the_docs_give_the_one_code():
    readme = re.sub(r"\s+", " ", (REPO / "README.md").read_text())
    assert "`3` no GPU" in readme
    doctor = re.sub(r"\s+", " ", (REPO / "docs" / "doctor.md").read_text())
    assert "no NVML or no GPU: one line, exit 3" in doctor
