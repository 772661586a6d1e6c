"""calibrate: counter-at-saturation ceilings, per-host storage, lookup validity, missing-backend error."""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import pytest

from pcie_tui.core import calibration
from pcie_tui.core.errors import UserError
from pcie_tui.doctor.calibrate import add_calibration_items, calibrate_main, measure
from pcie_tui.doctor.copybench import load_backend

FIX = Path(__file__).parent / "fixtures"
H200_RUN = json.loads((FIX / "h200-calibrate.json").read_text())


@pytest.fixture(autouse=True)
def config_home(tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "cfg"))
    return tmp_path / "cfg"


def test_store_is_per_host_config_and_keyed_by_uuid(config_home):
    entry = H200_RUN["gpus"][0]
    p = calibration.save_entries([entry])
    assert p == config_home / "pcie-tui" / "calibration.json"
    data = json.loads(p.read_text())
    assert list(data["gpus"]) == [entry["uuid"]] and data["gpus"][entry["uuid"]]["host"] == "vm"


def test_lookup_returns_the_counter_ceiling_only_for_the_calibrated_link():
    entry = H200_RUN["gpus"][0]
    calibration.save_entries([entry])
    uuid = entry["uuid"]
    # Measured on the H200 (2026-12-02): D2H GPM counter 59.98 GB/s at saturation, payload 55.2 GB/s.
    assert calibration.lookup(uuid, 5, 16) == pytest.approx(59.98e9, rel=1e-3)
    assert calibration.lookup(uuid, 4, 16) is None  # gen changed: machine changed shape
    assert calibration.lookup(uuid, 5, 8) is None  # width changed
    assert calibration.lookup(uuid, None, 16) is None
    assert calibration.lookup("GPU-unknown", 5, 16) is None
    # Idle links train down: Gen1 now, but the link's max is still the calibrated Gen5 x16.
    assert calibration.lookup(uuid, 1, 16, max_gen=5, max_width=16) == pytest.approx(59.98e9, rel=1e-3)
    assert calibration.lookup(uuid, 1, 16, max_gen=5, max_width=8) is None


def test_h200_calibration_is_physically_consistent():
    e = H200_RUN["gpus"][0]
    theo = e["theoretical_Bps"]
    assert theo == pytest.approx(63.0e9, rel=1e-3)
    for d in ("h2d", "d2h"):
        r = e[d]
        # Payload below the counter (protocol overhead counted), counter below line rate.
        assert 0.80 * theo < r["payload_Bps"] < r["counter_Bps"] < theo
        assert r["counter_source"] == "gpm" and r["link_during"] == {"gen": 5, "width": 16}


def test_doctor_warns_when_the_machine_changed_shape():
    calibration.save_entries([H200_RUN["gpus"][0]])
    report = json.loads((FIX / "h200-doctor.json").read_text())
    report["items"] = [i for i in report["items"] if i["check"] != "calibration"]
    report["summary"] = {"pass": 0, "warn": 0, "fail": 0}
    add_calibration_items(report)
    assert report["items"][-1]["status"] == "pass"
    assert report["items"][-1]["title"] == "calibrated ceiling 60.0 GB/s (counter) on Gen5 x16"
    # Same GPU, now trained to Gen4 x16 even under load (e.g. moved to another slot).
    gen4 = {"cur_gen": 4, "cur_width": 16, "max_gen": 4, "max_width": 16}
    report["gpus"][0]["link_idle"] = gen4
    report["load"]["links"] = {"0": gen4}
    report["items"] = []
    add_calibration_items(report)
    item = report["items"][-1]
    assert item["status"] == "warn" and item["title"] == "machine changed shape, recalibrate"


def test_missing_backend_names_the_extra(monkeypatch):
    for mod in ("torch", "cuda", "cuda.bindings", "cuda.bindings.runtime", "cuda.cudart"):
        monkeypatch.setitem(sys.modules, mod, None)
    with pytest.raises(UserError) as ei:
        load_backend()
    msg = str(ei.value)
    assert "pcie-tui[calibrate]" in msg and "cuda-python" in msg and "\n" not in msg


fakenvml = pytest.importorskip("fakenvml", reason="tests/fakenvml (replaying H200 stand-in) not present")


class _ReplayBackend:
    """Copies 'run' by moving the replayed NVML timeline into the captured copy phase.

    Payload rates are the capture's ground truth (bytes / seconds timed with CUDA syncs on the H200).
    """

    name = "replay"

    def __init__(self, nv, jump):
        self.nv, self.jump = nv, jump
        self.truth = nv.capture.truth
        self.spans = nv.capture.phase_spans()

    def device_count(self):
        return 1

    def bus_id(self, dev):
        return "0000:00:06.0"

    def copy_rate(self, dev, direction, size_bytes, duration_s, during=None, pinned=True):
        phase = f"{direction}_{'pinned' if pinned else 'pageable'}"
        if phase not in self.spans:  # the H200 capture has pageable copies host->device only
            phase = "h2d_pageable"
        self.jump(self.spans[phase][0] + 0.05)
        got = during() if during else None
        t = self.truth[phase]
        return t["bytes"] / t["secs"], got


def test_measure_stores_what_the_counter_reads_at_saturation():
    offset = [0.0]
    nv = fakenvml.FakeNvml(fakenvml.load_capture(), clock=lambda: offset[0] + time.monotonic())

    def jump(t):
        offset[0] += t - nv.now()

    nv.nvmlInit()
    entries = measure(nv, _ReplayBackend(nv, jump))
    (e,) = entries
    cap = nv.capture
    assert (e["gen"], e["width"]) == (5, 16)
    assert e["h2d"]["payload_Bps"] == pytest.approx(cap.truth["h2d_pinned"]["GBps"] * 1e9, rel=1e-6)
    # The stored counter is a GPM reading of that phase (MiB/s -> bytes/s), not the payload.
    for d, metric in (("h2d", "NVML_GPM_METRIC_PCIE_RX_PER_SEC"), ("d2h", "NVML_GPM_METRIC_PCIE_TX_PER_SEC")):
        seen = [
            g["metrics"][metric] * 2**20
            for g in cap.gpm
            if g["phase"] == f"{d}_pinned" and isinstance(g["metrics"].get(metric), float)
        ]
        assert e[d]["counter_source"] == "gpm"
        assert min(seen) <= e[d]["counter_Bps"] <= max(seen)
        assert e[d]["counter_Bps"] > e[d]["payload_Bps"]
    assert e["counter_Bps"] == max(e["h2d"]["counter_Bps"], e["d2h"]["counter_Bps"])
    # Pageable copies (the capture has them host->device): timed payload and the counter's reading of that phase.
    pg = e["h2d_pageable"]
    assert pg["payload_Bps"] == pytest.approx(cap.truth["h2d_pageable"]["GBps"] * 1e9, rel=1e-6)
    seen = [
        g["metrics"]["NVML_GPM_METRIC_PCIE_RX_PER_SEC"] * 2**20
        for g in cap.gpm
        if g["phase"] == "h2d_pageable" and isinstance(g["metrics"].get("NVML_GPM_METRIC_PCIE_RX_PER_SEC"), float)
    ]
    assert min(seen) <= pg["counter_Bps"] <= max(seen)
    assert e["pageable_counter_Bps"] == pg["counter_Bps"]  # host->device: the direction weights stream in
    assert e["pageable_counter_Bps"] < e["counter_Bps"] / 4  # staged copies: a fraction of the pinned ceiling
    calibration.save_entries(entries)
    assert calibration.lookup(e["uuid"], 5, 16) == e["counter_Bps"]
    assert calibration.lookup_pageable(e["uuid"], 5, 16) == e["pageable_counter_Bps"]
    assert calibration.lookup_pageable(e["uuid"], 4, 16) is None  # another link shape: no stored ceiling applies


def test_calibrate_cli_errors_are_one_line(monkeypatch):
    for mod in ("torch", "cuda", "cuda.bindings", "cuda.bindings.runtime", "cuda.cudart"):
        monkeypatch.setitem(sys.modules, mod, None)
    args = argparse.Namespace(gpu=None, size_mib=256, seconds=1.0, backend=None, no_save=True, json=True)
    nv = fakenvml.FakeNvml(fakenvml.load_capture())
    with pytest.raises(UserError, match=r"pcie-tui\[calibrate\]"):
        calibrate_main(args, nvml=nv)
    assert nv.inits == 0
    with pytest.raises(UserError, match="must be positive"):
        calibrate_main(argparse.Namespace(**{**vars(args), "size_mib": 0}), nvml=nv)
