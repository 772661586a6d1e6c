"""NvmlCollector driven by tests/fakenvml, which replays NVML/GPM answers captured on the H200."""

from __future__ import annotations

import gzip
import json
import statistics
import sys
import time
from pathlib import Path

import pynvml
import pytest
from fakenvml import FakeNvml, ManualClock, from_probe, load_capture, probe_path

from pcie_tui.core.errors import NoGpuError, UserError
from pcie_tui.core.model import pcie_capacity_Bps
from pcie_tui.sources.gpm import GpmSampler
from pcie_tui.sources.nvml import NvmlCollector, nvml_unavailable_reason

MiB = 1 << 20
ROOT = Path(__file__).resolve().parents[1]
BUNDLED = ROOT / "pcie_tui" / "data" / "h200-reference.jsonl.gz"


@pytest.fixture(scope="module")
def cap():
    return load_capture()


def make(cap, clock=None, **kw):
    clock = clock or ManualClock()
    fake = FakeNvml(cap, clock=clock, **kw)
    return fake, NvmlCollector(nvml=fake, clock=clock, link_refresh_s=0.0), clock


# ---- static facts -----------------------------------------------------------


def test_gpu_infos_are_the_captured_answers(cap):
    fake, col, _ = make(cap)
    (info,) = col.gpu_infos()
    st = cap.static
    assert info.name == "NVIDIA H200" == st["name"]
    assert info.uuid == st["uuid"]
    assert info.pci_bus_id == st["pci_bus_id"]
    assert (info.link.gen, info.link.width, info.link.max_gen, info.link.max_width) == (5, 16, 5, 16)
    assert info.link.capacity_Bps == pcie_capacity_Bps(5, 16)
    assert info.memory_total_bytes == st["mem"][0]
    # NVLink state answered NotSupported on the H200 VM: no NVLink, not "0 links".
    assert info.nvlink_count is None and info.nvlink_capacity_Bps is None
    assert info.metrics_source == "gpm"
    col.close()


def test_metrics_source_nvml_without_gpm(cap):
    _fake, col, _ = make(cap, gpm_supported=False)
    assert col.gpu_infos()[0].metrics_source == "nvml"
    col.close()
    _fake, col, _ = make(cap)
    col.close()
    col = NvmlCollector(nvml=FakeNvml(cap), gpm=False)
    assert col.gpu_infos()[0].metrics_source == "nvml"
    col.close()


def test_running_pids_from_captured_process_list(cap):
    _fake, col, _ = make(cap)
    assert col.running_pids() == {0: [p[0] for p in cap.static["procs_compute"]]}
    col.close()


# ---- GPM path: exact unit conversions ----------------------------------------


def test_gpm_readings_convert_units_exactly(cap):
    fake, col, clock = make(cap)
    col.read()  # first tick: no window yet
    checked = 0
    for _ in range(int(cap.period / 0.13)):
        clock.advance(0.13)
        (s,) = col.read()
        now = fake.now()
        assert fake.windows[-1] == pytest.approx(0.13)
        raw = cap.gpm_at(now, fake.windows[-1])
        tick = cap.tick_at(now)
        assert s.pcie_tx_Bps == raw["NVML_GPM_METRIC_PCIE_TX_PER_SEC"] * MiB
        assert s.pcie_rx_Bps == raw["NVML_GPM_METRIC_PCIE_RX_PER_SEC"] * MiB
        assert s.dram_bw_util == raw["NVML_GPM_METRIC_DRAM_BW_UTIL"] / 100
        assert s.sm_util == raw["NVML_GPM_METRIC_SM_UTIL"] / 100
        assert s.mem_busy == tick["util"][1] / 100
        assert s.mem_used_bytes == tick["mem"][2]
        assert s.power_W == tick["power_mw"] / 1000
        assert (s.link_gen, s.link_width) == tuple(tick["link"])
        # GPM answers NVLINK_TOTAL 0.0 on a GPU without NVLink: that is not a reading.
        assert s.nvlink_tx_Bps is None and s.nvlink_rx_Bps is None
        checked += 1
    assert checked > 100
    assert fake.calls["nvmlDeviceGetPcieThroughput"] == 0  # GPM path never blocks
    col.close()


def test_gpm_rates_match_timed_truth_of_each_phase(cap):
    """Replayed readings against the copies timed with CUDA syncs during the same capture."""
    fake, col, clock = make(cap)
    by_phase: dict[str, list] = {}
    col.read()
    for _ in range(int(cap.period / 0.1)):
        clock.advance(0.1)
        (s,) = col.read()
        by_phase.setdefault(cap.tick_at(fake.now())["phase"], []).append(s)
    col.close()
    # PCIe counts protocol bytes: 1.072 (RX) / 1.090 (TX) x payload, measured on the first probe.
    for phase, attr, factor in (("h2d_pinned", "pcie_rx_Bps", 1.072), ("d2h_pinned", "pcie_tx_Bps", 1.090)):
        got = statistics.median(getattr(s, attr) for s in by_phase[phase][2:] if getattr(s, attr) is not None)
        assert got == pytest.approx(cap.truth[phase]["GBps"] * 1e9 * factor, rel=0.10)
    dram = statistics.median(s.dram_bw_util for s in by_phase["d2d_copy"][2:] if s.dram_bw_util is not None)
    assert dram == pytest.approx(cap.truth["d2d_copy"]["GBps"] * 1e9 / 4.8e12, rel=0.10)
    sm = statistics.median(s.sm_util for s in by_phase["matmul_bf16"][2:] if s.sm_util is not None)
    assert sm > 0.85


# ---- GPM window rule and NaN ---------------------------------------------------


def test_gpm_windows_are_never_shorter_than_100ms(cap):
    fake, col, clock = make(cap)
    for _ in range(400):
        clock.advance(0.05)  # ticking at 20 Hz
        col.read()
    assert fake.windows and min(fake.windows) >= 0.1
    assert max(fake.windows) < 0.2 + 1e-9  # rolled, not growing
    col.close()


@pytest.mark.parametrize("step_s", [0.001, 0.013, 0.3])
def test_gpm_ring_stays_short_and_windows_bounded_at_any_rate(cap, step_s):
    fake, col, clock = make(cap)
    for _ in range(2000):
        clock.advance(step_s)
        col.read()
    assert min(fake.windows) >= 0.1
    assert max(fake.windows) <= max(0.1 + 2 * 0.0125, step_s) + 1e-6 or step_s >= 0.1
    assert len(col.devices[0].gpm._ring) <= 12
    assert fake.calls["nvmlGpmSampleAlloc"] <= 13  # buffers are recycled, not leaked
    col.close()
    assert not fake._bufs


def test_first_tick_has_no_gpm_metrics_but_has_nvml_ones(cap):
    _fake, col, _ = make(cap)
    (s,) = col.read()
    assert s.pcie_rx_Bps is None and s.dram_bw_util is None and s.sm_util is None
    assert s.mem_busy is not None and s.power_W is not None
    col.close()


def test_nan_windows_become_none_never_zero(cap):
    """Short windows replay the H200's NaN answers; a void window must not leak its false 0s."""
    clock = ManualClock()
    fake = FakeNvml(cap, clock=clock)
    fake.nvmlInit()
    h = fake.nvmlDeviceGetHandleByIndex(0)
    sampler = GpmSampler(fake, h, min_window_s=0.02)
    readings = []
    for _ in range(int(cap.period / 0.02)):
        clock.advance(0.02)
        readings.append((cap.tick_at(fake.now())["phase"], sampler.tick(clock())))
    assert fake.void_answers > 50  # the quirk was exercised
    for phase, r in readings:
        if r is None:
            continue
        assert r.dram_bw_pct is not None
        if phase in ("h2d_pinned", "h2d_half_duty") and r.window_s <= 0.03:
            assert r.pcie_rx_MiBps and r.pcie_rx_MiBps > 1000
    assert sum(r is None for _p, r in readings) > 20
    sampler.close()
    assert not fake._bufs


def test_void_window_falls_back_to_the_older_snapshot(cap):
    clock = ManualClock()
    fake = FakeNvml(cap, clock=clock)
    fake.nvmlInit()
    sampler = GpmSampler(fake, fake.nvmlDeviceGetHandleByIndex(0), min_window_s=0.02)
    fell_back = 0
    for _ in range(int(cap.period / 0.02)):
        clock.advance(0.02)
        before = len(fake.windows)
        r = sampler.tick(clock())
        asked = fake.windows[before:]
        if len(asked) == 2:
            assert asked[1] > asked[0]  # second try uses an older snapshot
            fell_back += r is not None
    assert fell_back > 5
    sampler.close()


# ---- unsupported -> None ----------------------------------------------------------


class _NoPower(FakeNvml):
    def nvmlDeviceGetPowerUsage(self, h):
        self.calls["nvmlDeviceGetPowerUsage"] += 1
        raise pynvml.NVMLError(pynvml.NVML_ERROR_NOT_SUPPORTED)


def test_unsupported_calls_read_none_and_are_not_retried(cap):
    clock = ManualClock()
    fake = _NoPower(cap, clock=clock)
    col = NvmlCollector(nvml=fake, clock=clock)
    for _ in range(5):
        clock.advance(0.1)
        (s,) = col.read()
        assert s.power_W is None
        assert s.mem_used_bytes is not None
    assert fake.calls["nvmlDeviceGetPowerUsage"] == 1
    col.close()


def test_gpm_metric_error_code_reads_none_and_the_rest_stand():
    """A metric answered with an error code (nvmlReturn != SUCCESS) is None, not 0."""
    cap = load_capture()
    for g in cap.gpm:
        g["metrics"]["NVML_GPM_METRIC_SM_UTIL"] = f"ret {pynvml.NVML_ERROR_NOT_SUPPORTED}"
    fake, col, clock = make(cap)
    col.read()
    clock.advance(0.13)
    (s,) = col.read()
    assert s.sm_util is None
    assert s.dram_bw_util is not None and s.pcie_rx_Bps is not None
    col.close()


# ---- NVML fallback: KB/s, blocking, parallel ---------------------------------------


def test_pcie_fallback_is_kBps_times_1024_and_parallel(cap):
    clock = ManualClock()
    n = 4
    fake = FakeNvml(cap, n_gpus=n, clock=clock, gpm_supported=False, block_s=0.05)
    clock.advance(4.5)  # inside the pinned H2D phase of the capture
    col = NvmlCollector(nvml=fake, clock=clock)
    t0 = time.perf_counter()
    samples = col.read()
    wall = time.perf_counter() - t0
    tick = cap.tick_at(fake.now())
    assert tick["phase"] == "h2d_pinned"
    for s in samples:
        assert s.pcie_tx_Bps == tick["pcie_kBps"][0] * 1024
        assert s.pcie_rx_Bps == tick["pcie_kBps"][1] * 1024
        assert s.sm_util == tick["util"][0] / 100
        assert s.dram_bw_util is None  # only GPM measures DRAM bandwidth
    assert fake.max_inflight == 2 * n  # every GPU and direction at once
    # Serial would take 2 x n x 50 ms = 400 ms.
    assert wall < 0.5 * (2 * n * fake.block_s)
    col.close()


def test_probe_readings_replay_exactly():
    """The shared first probe through the same collector: NVML and GPM units."""
    probe = json.loads(probe_path().read_text())
    cap = from_probe()
    clock = ManualClock()
    fake = FakeNvml(cap, clock=clock, gpm_supported=False, block_s=0.0)
    clock.advance(cap.phase_spans()["h2d_pinned"][0] + 0.3)
    col = NvmlCollector(nvml=fake, clock=clock)
    (s,) = col.read()
    rx = {p["rx"] * 1024 for p in probe["samples"] if p["phase"] == "h2d_pinned"}
    assert s.pcie_rx_Bps in rx
    col.close()
    fake = FakeNvml(cap, clock=clock)
    clock.advance(cap.phase_spans()["h2d_pinned"][0] + 0.3)
    col = NvmlCollector(nvml=fake, clock=clock)
    col.read()
    clock.advance(0.147)
    (s,) = col.read()
    gpm_rx = {p["gpm"]["NVML_GPM_METRIC_PCIE_RX_PER_SEC"] * MiB for p in probe["samples"] if p["phase"] == "h2d_pinned"}
    assert s.pcie_rx_Bps in gpm_rx and s.pcie_rx_Bps > 50e9
    col.close()


# ---- no GPU ----------------------------------------------------------------------


def test_missing_pynvml_names_the_package(monkeypatch):
    monkeypatch.setitem(sys.modules, "pynvml", None)
    with pytest.raises(NoGpuError, match=r"nvidia-ml-py.*pcie-tui demo"):
        NvmlCollector()


@pytest.mark.parametrize(
    ("code", "text"),
    [
        (pynvml.NVML_ERROR_LIBRARY_NOT_FOUND, "NVML Shared Library Not Found"),
        (pynvml.NVML_ERROR_DRIVER_NOT_LOADED, "Driver Not Loaded"),
    ],
)
def test_nvml_init_failure_is_one_clear_line(cap, code, text):
    with pytest.raises(NoGpuError) as e:
        NvmlCollector(nvml=FakeNvml(cap, init_error=code))
    msg = str(e.value)
    assert text in msg and "pcie-tui demo" in msg and "\n" not in msg


def test_zero_devices(cap):
    fake = FakeNvml(cap, n_gpus=0)
    with pytest.raises(NoGpuError, match="no NVIDIA GPU.*pcie-tui demo"):
        NvmlCollector(nvml=fake)
    assert fake.inits == 0  # NVML shut down again


def test_bad_index_is_a_user_error_not_no_gpu(cap):
    fake = FakeNvml(cap, n_gpus=2)
    with pytest.raises(UserError, match="index") as e:
        NvmlCollector([0, 5], nvml=fake)
    assert not isinstance(e.value, NoGpuError)
    assert fake.inits == 0


def test_unavailable_reason(cap):
    assert nvml_unavailable_reason(FakeNvml(cap)) is None
    why = nvml_unavailable_reason(FakeNvml(cap, init_error=pynvml.NVML_ERROR_DRIVER_NOT_LOADED))
    assert why and "Driver Not Loaded" in why


def test_close_frees_everything_and_is_idempotent(cap):
    fake, col, clock = make(cap)
    for _ in range(5):
        clock.advance(0.1)
        col.read()
    col.close()
    col.close()
    assert not fake._bufs and fake.inits == 0


# ---- the bundled demo session (recorded on the H200 by scripts/make_reference_session.py) ----


def test_bundled_reference_session_verdicts():
    from pcie_tui.analyze.session import analyze
    from pcie_tui.recording.reader import read_recording

    assert BUNDLED.stat().st_size < 1_000_000
    rec = read_recording(BUNDLED, warn=False)
    assert not rec.warnings
    truth = rec.header.extra["ground_truth"]
    phases = an_phases = analyze(rec.header, rec.samples).phase_summary(0)
    for p in rec.header.extra["phases"]:
        label, expect = p["label"], p["expect"]
        assert label in truth and label in an_phases
        dom = phases[label]["dominant"]
        assert dom == expect if expect != "none" else dom != "link", (label, dom)
    # The recorded link reading during pinned H2D against its own timed truth.
    h2d = phases["h2d_pinned"]["link_Bps"]["median"]
    assert h2d == pytest.approx(truth["h2d_pinned"]["GBps"] * 1e9 * 1.072, rel=0.10)
    with gzip.open(BUNDLED, "rt") as f:
        header = json.loads(f.readline())
    assert header["gpus"][0]["metrics_source"] == "gpm"
