"""Unknown is an answer (issue 21): a bound rests on the counters it needs. Real H200 sessions with readings
taken away or spoiled the way real GPUs, drivers and counters do: the phase reads "unknown" with the reason,
no fix is proposed from it, the what-if leaves those ticks out; a phase of a tick or two is too short."""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import numpy as np
import pytest

from pcie_tui.analyze.suspect import STUCK_TICKS, SuspectFilter
from pcie_tui.core.model import GpuInfo, LinkInfo
from pcie_tui.recording import demos
from pcie_tui.recording.reader import read_recording
from pcie_tui.report.text import build_report


def _spoil(tmp_path: Path, name: str, change) -> dict:
    """The demo with ``change(gpu_dict, phase, k)`` applied to every GPU reading (k: the tick's number)."""
    out = tmp_path / f"{name}-spoiled.jsonl"
    with gzip.open(demos.resolve(name), "rt") as f, out.open("w") as w:
        for k, line in enumerate(f):
            d = json.loads(line)
            if "t" in d and isinstance(d.get("gpus"), list):
                phase = (d.get("engine") or {}).get("phase")
                for g in d["gpus"]:
                    change(g, phase, k)
            w.write(json.dumps(d) + "\n")
    rep, _ = build_report(read_recording(out, warn=False))
    return rep


def _finding(rep: dict, phase: str) -> dict:
    return next(f for f in rep["attribution"]["findings"]["0"] if f["phase"] == phase)


def test_a_gpu_that_reports_tx_only_has_no_bound(tmp_path):
    """h200-pageable with every RX reading null: it used to say "host-bound 100 %" and propose a VRAM fix."""
    rep = _spoil(tmp_path, "h200-pageable", lambda g, p, k: g.update(pcie_rx_Bps=None))
    f = _finding(rep, "prefill")
    assert f["bound"] == "unknown" and f["shares"]["unknown"] > 0.99
    assert f["unknown_why"] == "PCIe RX not reported" and not f["advice"]
    head = rep["headline"]
    assert head["bound"] == "unknown" and head["fix"] is None and "PCIe RX not reported" in head["text"]
    wg = rep["whatif"]["gpus"][0]
    assert all(p["link_busy_share"] is None for p in wg["phases"].values())
    assert all(s["time_ratio"] is None for s in wg["scenarios"])


def test_half_the_sm_readings_missing_is_said_with_its_share(tmp_path):
    rep = _spoil(tmp_path, "h200-pageable", lambda g, p, k: g.update(sm_util=None) if k % 2 else None)
    f = _finding(rep, "prefill")
    assert 0.4 < f["shares"]["unknown"] < 0.6 and "SM use not reported" in (f["unknown_why"] or "")


def test_a_wrapped_counter_is_not_a_saturated_link(tmp_path):
    """h200-pinned's prefill with RX at 200 GB/s (a Gen5 x16 link carries 63 GB/s): read as 100 % it would be
    link-saturated; it is set aside, and the phase says why."""

    def wrap(g, phase, k):
        if phase == "prefill":
            g["pcie_rx_Bps"] = 200e9

    f = _finding(_spoil(tmp_path, "h200-pinned", wrap), "prefill")
    assert f["bound"] == "unknown" and "above the link's theoretical rate" in f["unknown_why"]
    assert f["shares"]["link"] == 0.0


def test_a_stuck_counter_is_set_aside_after_two_seconds(tmp_path):
    def stick(g, phase, k):
        if phase == "prefill":
            g["pcie_rx_Bps"] = 33.3e9

    f = _finding(_spoil(tmp_path, "h200-pinned", stick), "prefill")
    assert f["bound"] == "unknown" and f["unknown_why"].startswith("PCIe RX stuck at one value")


def test_the_filter_carries_over_chunks():
    """Stuck is counted across chunks: a run split over two chunks is caught as one."""
    info = GpuInfo(0, "u", "x", "0000:01:00.0", LinkInfo(5, 16, 5, 16, 63e9), None)
    cols = np.zeros((11, STUCK_TICKS + 5))
    cols[0] = 5e9  # RX stuck
    cols[1] = np.arange(cols.shape[1]) * 1e6 + 1  # TX moving
    cols[7], cols[8] = 5, 16  # link_gen, link_width
    whole, _ = SuspectFilter().apply(info, cols.copy(), 7, 8)
    f = SuspectFilter()
    a, _ = f.apply(info, cols[:, :7].copy(), 7, 8)
    b, _ = f.apply(info, cols[:, 7:].copy(), 7, 8)
    assert np.array_equal(np.isnan(whole[0]), np.isnan(np.concatenate([a[0], b[0]], axis=0)))
    assert np.isnan(whole[0]).sum() == cols.shape[1] - (STUCK_TICKS - 1) and not np.isnan(whole[1]).any()


def test_a_phase_of_one_tick_is_too_short_to_judge():
    """h200-llama-partial opens with one tick the engine gave no phase: it names no bound ("too short to
    judge") and empties no table: the what-if still prices every other phase."""
    rep, _ = build_report(read_recording(demos.resolve("h200-llama-partial"), warn=False))
    short = [f for fs in rep["attribution"]["findings"].values() for f in fs if f["ticks"] < 3]
    assert short and all(f["bound"] in ("unknown", "idle") for f in short)
    assert all(f["too_short"] or f["bound"] == "idle" for f in short)
    assert all(s["time_ratio"] is not None for s in rep["whatif"]["gpus"][0]["scenarios"])


@pytest.mark.parametrize("name", ["h200-pinned", "h200-pageable", "h200-prompt-cache"])
def test_real_sessions_keep_their_answer(name):
    """Nothing is set aside in the real recordings' work phases: the answers stay what they were."""
    rep, _ = build_report(read_recording(demos.resolve(name), warn=False))
    for f in rep["attribution"]["findings"]["0"]:
        if f["phase"] in ("prefill", "decode"):
            assert f["shares"].get("unknown", 0.0) < 0.05, (f["phase"], f["shares"])
