"""doctor on the project's H200: replayed NVML (tests/fakenvml) on the captured sysfs, and the real run's output."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from pcie_tui.doctor.render import render_doctor
from pcie_tui.doctor.run import run_doctor

FIX = Path(__file__).parent / "fixtures"
fakenvml = pytest.importorskip("fakenvml", reason="tests/fakenvml (replaying H200 stand-in) not present")


def test_doctor_runs_clean_on_the_replayed_h200():
    nv = fakenvml.FakeNvml(fakenvml.load_capture())
    r = run_doctor(
        nvml=nv,
        sysfs_root=str(FIX / "sysfs" / "h200-vm"),
        proc_root=str(FIX / "sysfs" / "h200-vm" / "proc"),
        load_s=0.2,
        backend_factory=None,
    )
    assert r["ok"] and r["summary"]["fail"] == 0 and r["summary"]["warn"] == 0, [
        (i["check"], i["title"]) for i in r["items"] if i["status"] != "pass"
    ]
    by = {i["check"]: i for i in r["items"]}
    assert by["link"]["title"].endswith("Gen5 x16 of max Gen5 x16")
    assert by["chain"]["data"]["attach"] == "direct"
    assert "virtual machine" in by["chain"]["title"]
    # NUMA: NVML says Not Supported in this VM; sysfs numa_node is -1: shown as n/a, not as node 0.
    assert by["numa"]["data"]["gpu_node"] is None
    assert "Not Supported" in by["numa"]["evidence"][0]
    assert by["nvlink"]["title"] == "no NVLink (PCIe only)"
    # The capture answered NotSupported for the PCIe counter fields: listed as n/a, never as 0.
    assert by["pcie_errors"]["data"]["delta"] == {}
    assert nv.inits == 0  # NVML shut down again


def test_real_h200_run_output():
    """The report doctor --json produced on the H200 (2026-12-02) under torch-generated load."""
    r = json.loads((FIX / "h200-doctor.json").read_text())
    assert r["ok"] is True and r["summary"]["fail"] == 0
    assert r["load"]["how"] == "generated" and r["load"]["loaded"] == {"0": True}
    assert r["load"]["links"]["0"]["cur_gen"] == 5 and r["load"]["links"]["0"]["cur_width"] == 16
    assert r["chains"]["0"]["attach"] == "direct"
    errors = next(i for i in r["items"] if i["check"] == "pcie_errors")
    # Counters since boot were non-zero there (e.g. bad_tlp) but did not move during the check.
    assert errors["data"]["after"]["bad_tlp"] > 0 and errors["data"]["delta"]["bad_tlp"] == 0
    assert errors["status"] == "pass"
    text = render_doctor(r)
    assert "[PASS] GPU0" in text and "under load" in text


@pytest.mark.parametrize("phase,how", [("matmul_bf16", "engine"), ("idle", "idle")])
def test_without_a_load_generator_it_reads_while_the_gpu_works(phase, how):
    """No torch/cuda-python: doctor reads during the GPU's own work (replayed H200 phase) and says so."""
    cap = fakenvml.load_capture()
    start = cap.phase_spans()[phase][0] + (0.5 if phase == "idle" else 0.1)  # idle: past the first busy ticks
    nv = fakenvml.FakeNvml(cap, offsets_s=[start])
    r = run_doctor(
        nvml=nv,
        sysfs_root=str(FIX / "sysfs" / "h200-vm"),
        proc_root=str(FIX / "sysfs" / "h200-vm" / "proc"),
        load_s=0.4,
        backend_factory=None,
    )
    assert r["load"]["how"] == how
    link = next(i for i in r["items"] if i["check"] == "link")
    assert link["status"] == "pass"
    assert link["title"].startswith("link at its maximum " + ("under load" if how == "engine" else "even idle"))
