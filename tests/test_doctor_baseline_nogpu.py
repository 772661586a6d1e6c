"""``doctor --save-baseline`` without NVML: the baseline still holds the host facts and ``gpu_error``."""

from __future__ import annotations

import argparse
import json
import re
from pathlib import Path

import pytest

from pcie_tui.core.errors import NoGpuError
from pcie_tui.doctor.cli import doctor_main

REPO = Path(__file__).resolve().parents[1]


class NoNvml:
    """An NVML whose library cannot start, as on a machine without the driver."""

    class NVMLError(Exception):
        def __str__(self) -> str:
            return "NVML Shared Library Not Found"

    def nvmlInit(self) -> None:
        raise self.NVMLError()


def _args(save: str | None, as_json: bool = False) -> argparse.Namespace:
    return argparse.Namespace(
        json=as_json,
        pid=None,
        load_s=0.0,
        sysfs_root="/sys",
        proc_root="/proc",
        save_baseline=save,
        since=None,
        now=None,
        recording=None,
    )


@pytest.mark.parametrize("as_json", [False, True])
def test_save_baseline_without_nvml_writes_the_host_facts(tmp_path, capsys, as_json):
    out_dir = tmp_path / "bl"
    with pytest.raises(NoGpuError, match="NVML could not start"):
        doctor_main(_args(str(out_dir), as_json), nvml=NoNvml())
    files = list(out_dir.glob("baseline-*.json"))
    assert len(files) == 1
    fp = json.loads(files[0].read_text())
    assert fp["format"] == "pcie-tui/baseline" and fp["source"] == "doctor" and fp["gpus"] == []
    assert "NVML could not start (NVML Shared Library Not Found)" in fp["gpu_error"]
    assert fp["host"]["hostname"] and fp["host"]["cpu_count"]  # read from /proc, never 0
    assert fp["host"]["driver_version"] is None
    cap = capsys.readouterr()
    assert cap.out == ""  # stdout stays clean (JSON consumers); the note goes to stderr
    assert f"baseline saved to {files[0]}" in cap.err


def test_without_save_baseline_nothing_is_written(tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path))
    with pytest.raises(NoGpuError):
        doctor_main(_args(None), nvml=NoNvml())
    assert not list(tmp_path.rglob("baseline-*.json"))


def test_the_doc_says_what_the_code_does():
    doc = re.sub(r"\s+", " ", (REPO / "docs" / "doctor.md").read_text())
    assert "Without NVML the baseline holds the host facts and `gpu_error` saying why" in doc
    assert "still writes the baseline" in doc
