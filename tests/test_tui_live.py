"""The app on the real live path: LiveSource + NvmlCollector, with NVML answering from the H200 capture.

tests/fakenvml replays pynvml answers captured on the project's H200 (in NVML's own
units and timing); everything above it is the production code: the collector's GPM
and PCIe reads, LiveSource's pacing, the app's reader thread, the recorder.
"""

from __future__ import annotations

import re

import pytest

from pcie_tui.recording.reader import read_recording
from pcie_tui.recording.writer import RecordingWriter
from pcie_tui.sources.live import LiveSource
from pcie_tui.sources.nvml import NvmlCollector
from pcie_tui.tui.app import make_app
from pcie_tui.tui.gpu_panel import GpuPanel
from pcie_tui.tui.headless import run, wait_until

fakenvml = pytest.importorskip("fakenvml", reason="tests/fakenvml (replaying H200 stand-in) not present")


def test_live_nvml_panel_and_recording(tmp_path):
    collector = NvmlCollector(nvml=fakenvml.FakeNvml(fakenvml.load_capture()))
    source = LiveSource(collector, interval_s=0.1, calibrate=False)
    out = tmp_path / "live.jsonl.gz"
    app = make_app(source, recorder_factory=lambda: RecordingWriter(out, source.header), status="live test")

    written: list[int] = []

    async def go():
        async with app.run_test(size=(100, 30)) as pilot:
            await wait_until(pilot, lambda: app.frame is not None and app.frame.ticks >= 3, 10)
            panel = app.query_one("#gpu-0", GpuPanel)
            assert "GPU 0 · NVIDIA H200 · PCIe Gen5 x16 (max Gen5 x16)" in panel.border_title
            tx = str(panel.tx.label.render())
            assert re.search(r"PCIe TX\s+[\d.]+ [kMGT]?B/s\s+\d+ % of (56\.7 GB/s default|[\d.]+ GB/s observed)", tx), (
                tx
            )
            misc = str(panel.misc.render())
            # The capture holds memory and power answers: real figures with units, not n/a.
            assert re.search(r"mem used [\d.]+ GiB of 140\.4 GiB · power \d+ W", misc), misc
            await pilot.press("r")
            assert app.recorder is not None
            await wait_until(pilot, lambda: app.recorded_ticks >= 10, 10)
            await pilot.press("r")
            written.append(app.recorded_ticks)

    try:
        run(go())
    finally:
        source.close()
    back = read_recording(out, warn=False)
    assert len(back.samples) == written[0]
    assert back.header.gpus[0].metrics_source == "gpm"
    dt = [b.t - a.t for a, b in zip(back.samples, back.samples[1:], strict=False)]
    assert 0.07 < sorted(dt)[len(dt) // 2] < 0.2  # ticks at the 0.1 s interval


def test_a_gpu_that_stops_answering_is_said_on_screen_and_the_watching_goes_on():
    """Issue 25: the live view says when a GPU falls off the bus (a toast and the position line) and keeps
    drawing ticks (which carry no readings from then on)."""
    import time

    import pynvml

    fake = fakenvml.FakeNvml(fakenvml.load_capture())
    lost_at = [None]

    class Failing:
        def __getattr__(self, name):
            f = getattr(fake, name)
            if not callable(f) or not name.startswith("nvml") or name in ("nvmlInit", "nvmlShutdown"):
                return f

            def call(*a, **k):
                if lost_at[0] is not None and time.monotonic() > lost_at[0]:
                    raise pynvml.NVMLError(pynvml.NVML_ERROR_GPU_IS_LOST)
                return f(*a, **k)

            return call

    collector = NvmlCollector(nvml=Failing())
    source = LiveSource(collector, interval_s=0.1, calibrate=False)
    app = make_app(source, status="live test")

    async def go():
        async with app.run_test(size=(120, 30)) as pilot:
            await wait_until(pilot, lambda: app.frame is not None and app.frame.ticks >= 3, 10)
            lost_at[0] = time.monotonic()
            await wait_until(pilot, lambda: bool(app._position_w.fault), 10)
            ticks = app.frame.ticks
            await wait_until(pilot, lambda: app.frame.ticks >= ticks + 5, 10)
            line = app._position_w.render().plain
            assert "GPU 0 stopped answering at" in line and "fell off the bus" in line, line
            assert "LIVE" in line

    try:
        run(go())
    finally:
        source.close()
