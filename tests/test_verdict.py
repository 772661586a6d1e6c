"""Verdict engine: thresholds, hysteresis and events, on real H200 readings and on properties."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from pcie_tui.analyze.session import analyze
from pcie_tui.analyze.tracker import GpuVerdictTracker
from pcie_tui.analyze.verdict import Thresholds, tick_ceiling, utilisation
from pcie_tui.core.model import GpuInfo, GpuSample, LinkInfo, pcie_capacity_Bps
from pcie_tui.recording.reader import read_recording

GEN5X16 = pcie_capacity_Bps(5, 16)


def _info(measured: float | None = None, source: str = "gpm", nvlink: float | None = None) -> GpuInfo:
    link = LinkInfo(5, 16, 5, 16, GEN5X16, measured)
    return GpuInfo(0, "GPU-x", "test", "0000:00:06.0", link, 141 << 30, nvlink, 4 if nvlink else None, source)


def test_link_capacity_matches_pcie_physics():
    # REFERENCE.md section 3: per lane Gen3 0.985, Gen4 1.969, Gen5 3.938 GB/s.
    assert abs(pcie_capacity_Bps(5, 16) / 1e9 - 63.0) < 0.05
    assert abs(pcie_capacity_Bps(4, 16) / 1e9 - 31.5) < 0.05
    assert abs(pcie_capacity_Bps(4, 4) / 1e9 - 7.88) < 0.01
    assert abs(pcie_capacity_Bps(3, 16) / 1e9 - 15.75) < 0.01
    assert pcie_capacity_Bps(None, 16) is None
    assert pcie_capacity_Bps(5, 0) is None


def test_probe_phases_get_the_right_verdicts(probe_recording_path):
    rec = read_recording(probe_recording_path)
    an = analyze(rec.header, rec.samples)
    phases = an.phase_summary(0)
    assert phases["h2d_pinned"]["dominant"] == "link"
    assert phases["d2h_pinned"]["dominant"] == "link"
    assert phases["d2d_copy"]["dominant"] == "memory"
    assert phases["idle"]["verdict_share"]["none"] == 1.0
    # A 1.3 GB/s trickle is 2 % of Gen5 x16: never the link.
    assert phases["h2d_trickle"]["verdict_share"]["link"] == 0.0
    # Void GPM windows (< 100 ms) are unknown, not zero: the matmul is still compute-bound.
    assert phases["matmul"]["dominant"] == "compute"
    assert phases["matmul"]["verdict_share"]["link"] == 0.0
    events = [e for e in an.events if e.resource == "link"]
    assert len(events) == 1
    ev = events[0]
    # Timed truth: 53.8 GB/s H2D payload; GPM counts ~7 % protocol overhead on top.
    assert 55e9 < ev.peak_Bps < 63e9
    assert ev.direction_label == "both"  # H2D (rx) then D2H (tx), joined across a 0.45 s gap


def _feed(tr: GpuVerdictTracker, series: list[tuple[float, GpuSample]]) -> list[str]:
    return [tr.update(t, s)[0] for t, s in series]


def _rx(t: float, rate: float) -> tuple[float, GpuSample]:
    return t, GpuSample(0, pcie_tx_Bps=1e6, pcie_rx_Bps=rate, dram_bw_util=0.01, sm_util=0.0)


def test_sustained_saturation_enters_after_hold_and_leaves_after_hold():
    tr = GpuVerdictTracker(_info(), 0)
    ticks = [_rx(i * 0.1, 57e9) for i in range(20)] + [_rx(2.0 + i * 0.1, 1e6) for i in range(10)]
    v = _feed(tr, ticks)
    assert v[4] == "none"  # 0.4 s above: not yet
    assert v[5] == "link"  # 0.5 s above
    assert v[24] == "link"  # 0.4 s below: still held
    assert v[25] == "none"
    ev = tr.close_all(3.0) or None
    assert ev is None or ev == []


def test_half_duty_link_does_not_fire():
    # A link alternating full/idle every 100 ms window averages ~45 % and never holds 0.5 s.
    tr = GpuVerdictTracker(_info(), 0)
    ticks = [_rx(i * 0.1, 57e9 if i % 2 == 0 else 2e9) for i in range(100)]
    assert set(_feed(tr, ticks)) == {"none"}


def test_missing_readings_hold_state_and_never_count_as_zero():
    tr = GpuVerdictTracker(_info(), 0)
    series = []
    for i in range(30):
        rate = None if i % 3 == 1 else 57e9
        series.append((i * 0.1, GpuSample(0, pcie_rx_Bps=rate, pcie_tx_Bps=rate)))
    v = _feed(tr, series)
    assert v[-1] == "link"


def test_priority_link_over_memory_over_compute():
    tr = GpuVerdictTracker(_info(), 0)
    s = GpuSample(0, pcie_rx_Bps=58e9, pcie_tx_Bps=1e6, dram_bw_util=0.9, sm_util=0.99)
    v = _feed(tr, [(i * 0.1, s) for i in range(10)])
    assert v[-1] == "link"
    tr = GpuVerdictTracker(_info(), 0)
    s = GpuSample(0, pcie_rx_Bps=1e6, pcie_tx_Bps=1e6, dram_bw_util=0.876, sm_util=0.98)
    assert _feed(tr, [(i * 0.1, s) for i in range(10)])[-1] == "memory"
    tr = GpuVerdictTracker(_info(), 0)
    s = GpuSample(0, pcie_rx_Bps=1e6, pcie_tx_Bps=1e6, dram_bw_util=0.16, sm_util=0.95)
    assert _feed(tr, [(i * 0.1, s) for i in range(10)])[-1] == "compute"


def test_proxy_memory_only_without_gpm_and_stricter():
    nvml_only = _info(source="nvml")
    u = utilisation(nvml_only, GpuSample(0, mem_busy=0.22))
    assert u.memory == 0.22 and u.memory_proxy
    # With GPM, a missing DRAM window stays unknown rather than borrowing the proxy.
    u = utilisation(_info(), GpuSample(0, mem_busy=1.0))
    assert u.memory is None and not u.memory_proxy
    th = Thresholds()
    assert th.enter("memory", proxy=True) > th.enter("memory")


def test_measured_ceiling_is_the_denominator_unless_link_trained_down():
    info = _info(measured=58e9)
    c = tick_ceiling(info, None, {})
    assert (c.Bps, c.source) == (58e9, "calibrated")
    # The tick reports Gen5 x8: the default of the narrower link (0.90 x its 31.5 GB/s) wins.
    c = tick_ceiling(info, GpuSample(0, link_gen=5, link_width=8), {})
    assert c.source == "default" and abs(c.Bps - 0.90 * pcie_capacity_Bps(5, 8)) < 1
    assert c.theoretical_Bps == pcie_capacity_Bps(5, 8)


def test_one_ceiling_nothing_reads_above_it():
    """Uncalibrated: 0.90 x theoretical; a reading above it becomes the ceiling from that tick on."""
    tr = GpuVerdictTracker(_info(), 0)
    below = 0.85 * GEN5X16
    tr.update(0.0, GpuSample(0, pcie_rx_Bps=below, link_gen=5, link_width=16))
    assert (
        abs(tr.last_util.link_ceiling_Bps - 0.90 * GEN5X16) < 1
        and abs(tr.last_util.link - below / (0.9 * GEN5X16)) < 1e-9
    )
    above = 0.95 * GEN5X16
    tr.update(0.1, GpuSample(0, pcie_rx_Bps=above, link_gen=5, link_width=16))
    assert tr.last_util.link == 1.0 and tr.last_util.link_ceiling_Bps == above
    tr.update(0.2, GpuSample(0, pcie_rx_Bps=below, link_gen=5, link_width=16))
    assert abs(tr.last_util.link - below / above) < 1e-9  # the observed ceiling holds
    c = tick_ceiling(_info(), GpuSample(0, link_gen=5, link_width=16), tr.observed)
    assert c.source == "observed" and c.Bps == above and "above the default 56.7 GB/s" in c.detail
    # An unknown link stays unknown: no share from the GPU's own highest reading.
    blind = GpuVerdictTracker(GpuInfo(0, "GPU-x", "t", "0", LinkInfo(None, None, None, None, None), None), 0)
    blind.update(0.0, GpuSample(0, pcie_rx_Bps=5e9))
    assert blind.last_util.link is None


def test_nvlink_counts_as_link():
    info = _info(nvlink=450e9)
    u = utilisation(info, GpuSample(0, pcie_rx_Bps=1e6, pcie_tx_Bps=1e6, nvlink_tx_Bps=400e9, nvlink_rx_Bps=1e9))
    assert u.link_bus == "nvlink" and u.link_dir == "tx" and abs(u.link - 400 / 450) < 1e-9


@settings(max_examples=200, deadline=None)
@given(st.lists(st.floats(min_value=0, max_value=70e9), min_size=1, max_size=120))
def test_link_verdict_needs_sustained_reading(rates):
    """Property: 'link' is reported only after >= hold_s of consecutive readings above enter (of the
    one ceiling: 0.90 x theoretical, raised to the highest reading so far up to the theoretical rate)."""
    th = Thresholds()
    tr = GpuVerdictTracker(_info(), 0, th)
    run_start = None
    top = 0.0
    for i, r in enumerate(rates):
        t = i * 0.1
        v, opened, _ = tr.update(t, GpuSample(0, pcie_rx_Bps=r, pcie_tx_Bps=0.0))
        top = max(top, min(r, GEN5X16))
        ceiling = max(0.90 * GEN5X16, top)
        run_start = (t if run_start is None else run_start) if min(r / ceiling, 1.0) >= th.link_enter else None
        if opened:
            assert run_start is not None and t - run_start >= th.hold_s - 1e-9
            assert opened[0].start == run_start


@settings(max_examples=100, deadline=None)
@given(st.lists(st.floats(min_value=0, max_value=1.0), min_size=2, max_size=80))
def test_timeline_covers_the_session_without_gaps(utils):
    from pcie_tui.analyze.session import SessionAnalyzer
    from pcie_tui.core.model import Sample, SessionHeader

    hdr = SessionHeader("now", "h", "t", (_info(),))
    an = SessionAnalyzer(hdr)
    for i, u in enumerate(utils):
        an.feed(Sample(t=100 + i * 0.1, gpus=(GpuSample(0, pcie_rx_Bps=u * GEN5X16, pcie_tx_Bps=0.0, dram_bw_util=u),)))
    an.finish()
    segs = an.timeline(0)
    assert segs[0]["start"] == 100
    assert abs(segs[-1]["end"] - (100 + (len(utils) - 1) * 0.1)) < 1e-9
    for a, b in zip(segs, segs[1:], strict=False):
        assert a["end"] == b["start"] and a["saturated"] != b["saturated"]
