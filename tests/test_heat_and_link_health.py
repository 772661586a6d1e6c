"""Heat and link health (issue 25): throttled stretches tied to token timing, and link events, on generated
recordings whose truth is known by construction (the numbers are chosen, not measured: the analysis rules
are what is under test; tests/test_heat_capture.py runs the same analysis on readings from a real GPU)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pcie_tui.analyze.heat import CLOCK_CUT
from pcie_tui.analyze.session import SessionAnalyzer
from pcie_tui.core import clocks
from pcie_tui.core.model import EngineSample, GpuInfo, GpuSample, LinkInfo, Sample, SessionHeader
from pcie_tui.recording.reader import read_recording
from pcie_tui.recording.writer import RecordingWriter
from pcie_tui.report.text import build_report

DT = 0.1
MAX_MHZ = 1980.0
POWER_CAP = 0x4


def header(engine: bool = True) -> SessionHeader:
    link = LinkInfo(gen=5, width=16, max_gen=5, max_width=16, capacity_Bps=63e9)
    gpu = GpuInfo(0, "GPU-x", "NVIDIA H100 80GB HBM3", "00000000:01:00.0", link, 80 << 30, sm_clock_max_MHz=MAX_MHZ)
    eng = {"kind": "vllm", "url": "http://127.0.0.1:8000"} if engine else None
    return SessionHeader("2026-12-07T00:00:00Z", "gen", "0", (gpu,), engine=eng, interval_s=DT)


def phase_at(t: float) -> str:
    return "prefill" if t < 10 else "decode" if t < 110 else "idle"


def session(seconds: float = 120.0) -> list[Sample]:
    """Prefill 0-10 s, decode 10-110 s (power-capped 40-70 s: 30 tok/s and 33 ms ITL against 40 tok/s and
    25 ms), idle after; 250 PCIe replays at 90-95 s; the link at Gen3 under load 100-105 s, at Gen1 idle after."""
    out, gen, replays, itl_n, itl_sum = [], 0.0, 0, 0.0, 0.0
    for i in range(int(seconds / DT)):
        t = 1000.0 + i * DT
        rel = i * DT
        ph = phase_at(rel)
        thr = 40 <= rel < 70
        if ph == "decode":
            tok = (30.0 if thr else 40.0) * DT
            gen += tok
            itl_n += tok
            itl_sum += tok * (0.033 if thr else 0.025)
        busy = ph != "idle"
        read_health = i % 10 == 0
        if read_health and 90 <= rel < 95:
            replays += 50
        link_gen = 3 if 100 <= rel < 105 else 1 if ph == "idle" else 5
        g = GpuSample(
            0, pcie_tx_Bps=1e6, pcie_rx_Bps=5e9 if busy else 1e6, dram_bw_util=0.9 if busy else 0.0, mem_busy=0.5,
            sm_util=0.5 if busy else 0.0, mem_used_bytes=1 << 34, power_W=699.0 if thr else 500.0, link_gen=link_gen,
            link_width=16, temp_C=80.0 if thr else 60.0, sm_clock_MHz=1300.0 if thr else MAX_MHZ if busy else 345.0,
            mem_clock_MHz=2619.0, clock_events=POWER_CAP if thr else 0 if busy else 0x1, power_limit_W=700.0,
            pcie_replays=replays if read_health else None,
        )  # fmt: skip
        hist = {"itl_s": {"le": [0.1], "cum": [itl_n], "count": itl_n, "sum": itl_sum}}
        eng = EngineSample("vllm", True, ph, 0.0, gen, 1.0, 0.0, extra={"hist": hist})
        out.append(Sample(t, (g,), eng))
    return out


def analyzed(samples: list[Sample], chunk: int | None = None, engine: bool = True) -> SessionAnalyzer:
    an = SessionAnalyzer(header(engine))
    if chunk == 1:
        for s in samples:
            an.feed(s)
    else:
        an.feed_all(samples, chunk)
    an.finish()
    return an


def test_a_power_capped_stretch_is_found_and_tied_to_token_timing():
    heat = analyzed(session()).heat.report()
    assert heat is not None
    [s] = heat["stretches"]
    assert s["reason"] == "power cap" and s["phase"] == "decode"
    assert s["start"] == pytest.approx(1040.0, abs=0.15) and s["duration_s"] == pytest.approx(30.0, abs=0.15)
    assert s["sm_clock_MHz"] == 1300.0 and s["temp_max_C"] == 80.0 and s["power_limit_W"] == 700.0
    d = heat["phases"]["decode"]
    assert d["share"] == pytest.approx(0.3, abs=0.01)
    assert d["tokens_per_s"]["throttled"] == pytest.approx(30.0, rel=0.01)
    assert d["tokens_per_s"]["unthrottled"] == pytest.approx(40.0, rel=0.01)
    assert d["itl_s"]["throttled"] == pytest.approx(0.033, rel=0.01)
    assert d["itl_s"]["unthrottled"] == pytest.approx(0.025, rel=0.01)
    assert d["lost_s"] == pytest.approx(30 * (1 - 30 / 40), rel=0.02)
    assert heat["lost_share"] == pytest.approx(7.5 / 120, rel=0.03)
    assert "prefill" not in heat["phases"]  # never throttled there: nothing to compare


def test_chunking_does_not_change_the_answer():
    samples = session(60.0)
    want = analyzed(samples).heat.report()
    for chunk in (1, 7, 333):
        an = analyzed(samples, chunk)
        assert an.heat.report() == want
    assert [e.to_json() for e in analyzed(samples, 1).link_health.events] == [
        e.to_json() for e in analyzed(samples).link_health.events
    ]


def test_replays_and_downtraining_under_load_are_events_idle_downtraining_is_not():
    events = analyzed(session()).link_health.report()["events"]
    kinds = [e["kind"] for e in events]
    assert kinds == ["pcie_replays", "link_down"]
    rep, down = events
    assert rep["count"] == 250 and rep["phase"] == "decode"
    assert rep["text"].startswith("250 PCIe replays during decode (") and "check the riser or the slot" in rep["text"]
    assert rep["rate_per_s"] == pytest.approx(250 / 5, rel=0.25)
    assert down["gen"] == 3 and down["max_gen"] == 5 and down["phase"] == "decode"
    assert down["start"] == pytest.approx(1100.0, abs=0.15) and down["last"] == pytest.approx(1104.9, abs=0.15)
    assert "Gen3 x16 of Gen5 x16 under load (5.0 GB/s) during decode" in down["text"]


def test_a_counter_reset_is_not_a_rise():
    samples = session(30.0)
    out = []
    for i, s in enumerate(samples):  # a driver reload at 15 s: the counter restarts from 0 and stays there
        v = 5000 if i < 150 else 0
        out.append(Sample(s.t, (GpuSample(0, pcie_replays=v if i % 10 == 0 else None),), s.engine))
    assert analyzed(out).link_health.events == []


def test_memory_bound_while_clocks_were_cut_says_so():
    from pcie_tui.analyze.answer import answer

    samples = [s for s in session() if 1010.0 <= s.t < 1110.0]  # decode alone: memory-bound, 30 % power-capped
    an = analyzed(samples)
    [f] = [f for f in answer(an.header, an).findings[0] if f.phase == "decode"]
    assert f.bound == "memory"
    assert f.clocks_cut is not None and f.clocks_cut["share"] == pytest.approx(0.3, abs=0.01)
    assert "; clocks cut 30% of the phase (power cap, SM 1,300 of 1,980 MHz): memory-bound on a throttled GPU" in (
        f.evidence
    )


def test_an_older_recording_has_no_heat_and_says_so(tmp_path):
    old = [Sample(s.t, (GpuSample(0, sm_util=0.5, power_W=300.0),), s.engine) for s in session(20.0)]
    an = analyzed(old)
    assert an.heat.report() is None and an.link_health.report()["events"] == []


def test_the_report_and_its_json_carry_it(tmp_path):
    path = tmp_path / "heat.jsonl"
    with RecordingWriter(path, header()) as w:
        for s in session():
            w.write(s)
    rec = read_recording(path, warn=False)
    g = rec.samples[5].gpus[0]
    assert (g.temp_C, g.sm_clock_MHz, g.clock_events, g.power_limit_W, g.fan_util) == (60.0, MAX_MHZ, 0, 700.0, None)
    rep, _ = build_report(rec)
    json.dumps(rep, allow_nan=False)
    assert rep["heat"]["stretches"][0]["reason"] == "power cap"
    assert rep["link_health"]["events"][0]["count"] == 250
    from pcie_tui.cli.main import main

    code = main(["report", str(path)])
    assert code == 0


def test_report_text_shows_the_comparison(tmp_path, capsys):
    path = tmp_path / "heat.jsonl"
    with RecordingWriter(path, header()) as w:
        for s in session():
            w.write(s)
    from pcie_tui.cli.main import main

    assert main(["report", str(path)]) == 0
    text = " ".join(capsys.readouterr().out.split())
    assert "Heat and clocks" in text
    assert "decode: clocks cut 30% of 100.0 s; 30.0 tokens/s throttled vs 40.0 tokens/s unthrottled" in text
    assert "ITL 33.0 ms throttled vs 25.0 ms unthrottled" in text
    assert "lost to throttling: 7.5 s = 6% of the session" in text
    assert "250 PCIe replays during decode" in text and "Link health" in text


@settings(max_examples=40, deadline=None)
@given(st.lists(st.sampled_from([0, 0x1, 0x4, 0x20, 0x2, 0x100, 0x4 | 0x20]), min_size=2, max_size=120))
def test_stretches_cover_exactly_the_throttled_busy_ticks(masks):
    samples = []
    for i, m in enumerate(masks):
        clock = 1000.0 if m == 0x2 else MAX_MHZ
        g = GpuSample(0, sm_util=0.5, sm_clock_MHz=clock, clock_events=m)
        samples.append(Sample(1000.0 + i * DT, (g,), None, {"label": "work"}))
    an = SessionAnalyzer(header(engine=False))
    an.feed_all(samples)
    heat = an.heat.report()
    want = sum(1 for m in masks if clocks.throttling(m) or (m == 0x2 and CLOCK_CUT * MAX_MHZ > 1000.0))
    got = sum(s["ticks"] for s in heat["stretches"])
    assert got == want == heat["gpus"]["0"]["throttled_ticks"]
    ends = [(s["start"], s["end"]) for s in heat["stretches"]]
    assert all(a[1] < b[0] for a, b in zip(ends, ends[1:], strict=False))  # in order, never overlapping


def test_clock_reason_names():
    assert clocks.names(0x4 | 0x20 | 0x1) == ["idle", "power cap", "SW thermal"]
    assert clocks.label(0x1 | 0x2 | 0x100) == ""
    assert clocks.names(0x400) == ["bit 0x400"]


def test_aer_counts_read_from_sysfs(tmp_path: Path):
    from pcie_tui.sources.aer import parse_aer, read_aer

    dev = tmp_path / "0000:01:00.0"
    dev.mkdir()
    (dev / "aer_dev_correctable").write_text("RxErr 2\nBadTLP 3\nTOTAL_ERR_COR 5\n")
    (dev / "aer_dev_fatal").write_text("Undefined 0\nTOTAL_ERR_FATAL 0\n")
    assert read_aer("00000000:01:00.0", tmp_path) == {"correctable": 5, "fatal": 0}
    assert parse_aer("RxErr 2\nBadTLP 3\n") == 5 and parse_aer("garbage") is None
    assert read_aer("00000000:02:00.0", tmp_path) == {}


def test_the_tui_lists_them_as_events_and_the_gpu_row_shows_heat():
    from pcie_tui.tui.events import EVENT_COLUMNS, _event_cells
    from pcie_tui.tui.gpu_panel import figures_line, heat_field
    from pcie_tui.tui.state import ViewModel

    vm = ViewModel(header())
    samples = session()
    for s in samples[:650]:  # into the power-capped stretch (40-70 s)
        vm.feed(s)
    f = vm.frame()
    [live] = [e for e in f.events if e.resource == "power cap"]
    assert live.end_s is None and live.start_s == pytest.approx(40.0, abs=0.15)
    cells = _event_cells(live)
    assert cells[1] == "open" and cells[5] == "SM 1,300 MHz"
    assert cells[7] == "decode"
    assert heat_field(samples[600].gpus[0]) == "1,300 MHz power cap 80°C"
    assert figures_line(samples[600].gpus[0], None).endswith(" · 1,300 MHz power cap 80°C")
    assert heat_field(GpuSample(0, power_W=100.0)) == ""  # no readings: nothing shown, never 0
    for s in samples[650:]:
        vm.feed(s)
    f = vm.frame(ended=True)
    words = [_event_cells(e)[3] for e in f.events if e.detail is not None]
    assert words == ["power cap", "PCIe replays", "downtrained"]
    rep = [e for e in f.events if e.resource == "PCIe replays"][0]
    assert _event_cells(rep)[5].startswith("250 at ") and rep.end_s is not None
    down = [e for e in f.events if e.resource == "downtrained"][0]
    assert _event_cells(down)[5] == "Gen3 x16"
    assert all(len(c) <= w for e in f.events for c, (_, _, w) in zip(_event_cells(e), EVENT_COLUMNS, strict=True) if w)


@settings(max_examples=40, deadline=None)
@given(st.lists(st.integers(min_value=0, max_value=500), min_size=2, max_size=80), st.integers(1, 30))
def test_replay_events_count_every_rise_once(steps, every):
    """Counter reads every ``every`` ticks rising by ``steps``: the events' counts sum to the total rise."""
    samples, v = [], 1000
    for i, inc in enumerate(steps):
        v += inc
        for k in range(every):
            read = k == 0
            g = GpuSample(0, pcie_replays=v if read else None)
            samples.append(Sample(1000.0 + (i * every + k) * DT, (g,), None, {"label": "work"}))
    an = SessionAnalyzer(header(engine=False))
    an.feed_all(samples, chunk=17)
    an.finish()
    events = an.link_health.report()["events"]
    assert sum(e["count"] for e in events) == sum(steps[1:])
    assert all(e["count"] > 0 and e["phase"] == "work" and e["end"] is not None for e in events)
    gaps_s = [b["start"] - a["last"] for a, b in zip(events, events[1:], strict=False)]
    assert all(g > 10.0 - every * DT - 1e-9 for g in gaps_s)  # rises closer than MERGE_S are one event


def test_a_stale_link_read_as_a_burst_starts_is_not_downtraining():
    """Idle at Gen1; a burst starts and the link retrains up, but the 1 Hz link read still says Gen1 for
    0.9 s: no event. The same link held at Gen1 under load for 3 s is one."""
    samples = []
    for i in range(100):
        rel = i * DT
        busy = rel >= 5.0
        stale = 5.0 <= rel < 5.9 or 7.0 <= rel < 10.0  # a second burst at 7 s really runs at Gen1
        g = GpuSample(0, pcie_tx_Bps=1e6, pcie_rx_Bps=20e9 if busy else 1e6, link_gen=1 if (not busy or stale) else 5,
                      link_width=16)  # fmt: skip
        samples.append(Sample(1000.0 + rel, (g,), None, {"label": "work"}))
    events = analyzed(samples, engine=False).link_health.report()["events"]
    assert [(e["kind"], e["gen"], round(e["start"] - 1000, 1)) for e in events] == [("link_down", 1, 7.0)]


def test_the_exporter_carries_temperature_clocks_reasons_and_replays():
    from pcie_tui.export.prometheus import ExportState, PrometheusCollector

    st = ExportState()
    st.start(header(), "replay", "generated")
    samples = session()
    for s in samples[:601]:
        st.feed(s)
    fams = {f.name: f for f in PrometheusCollector(st).collect()}
    reasons = {x.labels["reason"]: x.value for x in fams["pcie_clock_event_reason"].samples}
    assert reasons["power cap"] == 1.0 and reasons["SW thermal"] == 0.0 and len(reasons) == len(clocks.REASONS)
    assert [x.value for x in fams["pcie_gpu_temperature_celsius"].samples] == [80.0]
    assert {x.labels["clock"]: x.value for x in fams["pcie_gpu_clock_mhz"].samples} == {"sm": 1300.0, "mem": 2619.0}
    assert [x.value for x in fams["pcie_power_limit_watts"].samples] == [700.0]
    assert "pcie_fan_speed_ratio" not in fams  # no fan reading: no sample, never 0
    assert [x.value for x in fams["pcie_link_replays"].samples] == [0.0]  # tick 600 read the counter


def test_two_gpus_one_throttled_the_session_counts_it_once():
    link = LinkInfo(gen=5, width=16, max_gen=5, max_width=16, capacity_Bps=63e9)
    gpus = tuple(
        GpuInfo(i, f"GPU-{i}", "H100", f"0000:0{i}:00.0", link, 80 << 30, sm_clock_max_MHz=MAX_MHZ) for i in (0, 1)
    )
    hdr = SessionHeader("x", "gen", "0", gpus, interval_s=DT)
    samples = []
    for i in range(200):
        thr = 50 <= i < 150
        g0 = GpuSample(0, sm_util=0.9, sm_clock_MHz=MAX_MHZ, clock_events=0)
        g1 = GpuSample(1, sm_util=0.9, sm_clock_MHz=1400.0 if thr else MAX_MHZ, clock_events=0x20 if thr else 0)
        samples.append(Sample(1000.0 + i * DT, (g0, g1), None, {"label": "train"}))
    for chunk in (1, 64):
        an = SessionAnalyzer(hdr)
        an.feed_all(samples, chunk)
        heat = an.heat.report()
        assert [(s["gpu"], s["ticks"], s["reason"]) for s in heat["stretches"]] == [(1, 100, "SW thermal")]
        assert heat["gpus"]["0"]["throttled_ticks"] == 0
        p = heat["phases"]["train"]
        assert p["share"] == pytest.approx(0.5, abs=0.01)
        assert p["sm_clock_MHz"] == {"throttled": 1400.0, "unthrottled": MAX_MHZ}  # per GPU-tick, as throttled or not
        assert p["lost_basis"].startswith("SM clock")
