"""The engine's own copies between requests, measured (issue 24: named and priced, never assumed).

The H200 demo h200-prompt-cache (llama.cpp b11434, 6 sequential 9,600-token prompts, host prompt cache on
by default) saves the slot's KV state to host memory before each request after the first; its A/B twin
h200-prompt-cache-off (--cache-ram 0) has no such stretch. Hand calculation of one save (docs/engines.md
"Between requests"): (9,600 prompt + 31 generated tokens in the KV) x 16 layers x 4,096 x 2 (K and V) x
2 bytes (f16) = 2.52 GB, GPU->host.
"""

from __future__ import annotations

import pytest

from pcie_tui.analyze.between_requests import BetweenRequests
from pcie_tui.analyze.columns import from_rows
from pcie_tui.analyze.session import SessionAnalyzer
from pcie_tui.recording import demos
from pcie_tui.recording.reader import read_recording, read_rows
from pcie_tui.report.text import build_report

KV_BYTES = (9600 + 31) * 16 * 4096 * 2 * 2


def _report(name: str) -> dict:
    rep, _ = build_report(read_recording(demos.resolve(name)))
    return rep


def test_each_prompt_cache_save_moves_the_slots_kv_state_gpu_to_host():
    rep = _report("h200-prompt-cache")
    br = rep["engine"]["between_requests"]
    assert br["stretches"] == 5  # six requests: the first had no slot state to save
    assert br["bytes_per_stretch"]["d2h"] == pytest.approx(KV_BYTES, rel=0.05)
    assert br["bytes_per_stretch"]["h2d"] < 0.001 * KV_BYTES  # nothing loaded back: no prompt repeated
    # The copy's own rate, over the ticks that carried it: far below the link (pageable), above idle.
    assert 5e9 < br["rate_p50_Bps"]["d2h"] < 20e9
    assert "h2d" not in br["rate_p50_Bps"]
    # Some of each save shows in the next phase's first tick (a reading covers the interval before it).
    assert 0 < br["spill_s"] <= 5 * 0.5
    f = next(f for f in rep["attribution"]["findings"]["0"] if f["phase"] == "housekeeping")
    ev = " ".join(f["advice"][0]["evidence"])
    assert "GPU->host 2.5" in ev and "GB in 0.2" in ev and "of the pinned ceiling 56.7 GB/s" in ev
    assert "pageable" in ev


def test_no_housekeeping_no_copies():
    rep = _report("h200-prompt-cache-off")
    assert rep["engine"]["between_requests"] is None
    assert all(f["phase"] != "housekeeping" for f in rep["attribution"]["findings"]["0"])


def test_chunking_does_not_change_the_sums():
    _, rows, _, _ = read_rows(demos.resolve("h200-prompt-cache"))
    whole, ticks = BetweenRequests(), BetweenRequests()
    for ch in from_rows(rows):
        whole.feed_chunk(ch)
    for ch in from_rows(rows, 1):
        ticks.feed_chunk(ch)
    a, b = whole.copies(), ticks.copies()
    assert a.stretches == b.stretches and a.d2h_bytes == pytest.approx(b.d2h_bytes)
    assert a.copy_s == pytest.approx(b.copy_s) and a.spill_s == pytest.approx(b.spill_s)


def _tick(t: float, phase: str, tx: float | None, rx: float | None) -> dict:
    g = {"index": 0, "pcie_tx_Bps": tx, "pcie_rx_Bps": rx}
    return {"t": t, "gpus": [g], "engine": {"kind": "llamacpp", "up": True, "phase": phase}}


def _copies(rows: list[dict]):
    br = BetweenRequests()
    for ch in from_rows(rows):
        br.feed_chunk(ch)
    return br.copies()


def test_a_copy_runs_on_into_the_next_phase_only_while_it_dominates():
    rows = [
        _tick(0.0, "idle", 0.0, 0.0),
        _tick(0.1, "housekeeping", 0.0, 0.0),
        _tick(0.2, "housekeeping", 10e9, 0.0),
        _tick(0.3, "prefill", 10e9, 1e9),  # the copy's tail: counted
        _tick(0.4, "prefill", 3e9, 1e9),  # 3 GB/s is not 4x 1 GB/s: prefill's own traffic, not counted
        _tick(0.5, "prefill", 10e9, 0.0),  # the tail ended above: not counted again
    ]
    c = _copies(rows)
    assert c.stretches == 1 and c.seconds == pytest.approx(0.2)
    assert c.d2h_bytes == pytest.approx(2e9)  # 10 GB/s x 0.1 s, twice
    assert c.h2d_bytes == pytest.approx(0.0)  # the tail counts only its own direction
    assert c.spill_s == pytest.approx(0.1) and c.copy_s == pytest.approx({"d2h": 0.2, "h2d": 0.0})


def test_no_pcie_readings_is_unknown_not_zero():
    rows = [_tick(0.1 * i, "housekeeping" if 1 <= i <= 3 else "idle", None, None) for i in range(6)]
    c = _copies(rows)
    assert c.stretches == 1 and c.d2h_bytes is None and c.h2d_bytes is None and c.rate_p50_Bps is None


def test_two_stretches_each_counted_once():
    phases = ["idle", "housekeeping", "housekeeping", "prefill", "decode", "housekeeping", "prefill"]
    rows = [_tick(0.1 * i, p, 2e9 if p == "housekeeping" else 0.0, 0.0) for i, p in enumerate(phases)]
    c = _copies(rows)
    assert c.stretches == 2 and c.per_stretch("d2h") == pytest.approx(3 * 2e9 * 0.1 / 2)


def test_the_exporter_shows_the_same_copies():
    from pcie_tui.export.prometheus import ExportState, PrometheusCollector

    rec = read_recording(demos.resolve("h200-prompt-cache"))
    st = ExportState()
    st.start(rec.header, "replay", "h200-prompt-cache")
    for s in rec.samples:
        st.feed(s)
    st.finish()
    fams = {f.name: f for f in PrometheusCollector(st).collect()}
    per = {x.labels["direction"]: x.value for x in fams["pcie_between_requests_bytes_per_stretch"].samples}
    an = SessionAnalyzer(rec.header).feed_rows(read_rows(demos.resolve("h200-prompt-cache"))[1])
    assert per["d2h"] == pytest.approx(an.between_requests.copies().per_stretch("d2h"))
    assert fams["pcie_between_requests_stretches"].samples[0].value == 5
