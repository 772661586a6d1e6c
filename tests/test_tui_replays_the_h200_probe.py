"""Pilot tests of the Textual app, driven by the real H200 probe recording.

The recording (tests/fixtures/h200-probe.jsonl) holds real readings with phase
labels: idle, pinned H2D copy (2.2-5.3 s), pinned D2H, device-to-device copy,
matmul, H2D trickle. Expected verdicts come from the analyzer run independently
over the same ticks, and from the physics of the phases (an H2D copy fills the
GPU's RX side of a Gen5 x16 link).
"""

from __future__ import annotations

import re
import threading
from pathlib import Path
from typing import Any

import pytest
from textual.widgets import Static

from pcie_tui.analyze.session import SessionAnalyzer
from pcie_tui.core.model import Sample
from pcie_tui.recording.reader import Recording, read_recording
from pcie_tui.recording.replay import ReplaySource
from pcie_tui.recording.writer import RecordingWriter
from pcie_tui.tui import fmt
from pcie_tui.tui.app import PcieTuiApp, make_app
from pcie_tui.tui.engine_panel import EnginePanel
from pcie_tui.tui.events import EventsPane
from pcie_tui.tui.frame import Frame
from pcie_tui.tui.gpu_panel import GpuPanel
from pcie_tui.tui.headless import empty_bands, frame_at, run, saturated_moment, screen_text, wait_until
from pcie_tui.tui.screens import SourcesScreen
from pcie_tui.tui.widgets import PositionBar, Spark
from pcie_tui.tui.worker import FRAME_MIN_INTERVAL_S, FrameReady

PROBE = Path(__file__).parent / "fixtures" / "h200-probe.jsonl"


@pytest.fixture(scope="module")
def rec() -> Recording:
    return read_recording(PROBE)


def paused_at(rec: Recording, position: int) -> ReplaySource:
    src = ReplaySource(rec)
    src.seek_to_index(position)
    src.set_paused(True)
    return src


def static_text(app: PcieTuiApp, selector: str) -> str:
    return str(app.query_one(selector, Static).render())


def position_bar(app: PcieTuiApp) -> str:
    return str(app.query_one(PositionBar).render())


def panel(app: PcieTuiApp, index: int = 0) -> GpuPanel:
    return app.query_one(f"#gpu-{index}", GpuPanel)


def analyzer_events(rec: Recording, upto: int) -> list[tuple[str, float, float | None]]:
    an = SessionAnalyzer(rec.header, keep_series=False)
    an.feed_all(rec.samples[:upto])
    t0 = rec.samples[0].t
    return [(e.resource, round(e.start - t0, 6), None if e.end is None else round(e.end - t0, 6)) for e in an.events]


def frame_events(f: Frame) -> list[tuple[str, float, float | None]]:
    return [(e.resource, round(e.start_s, 6), None if e.end_s is None else round(e.end_s, 6)) for e in f.events]


class PacedLive:
    """Real recorded ticks handed out like a live collector: one per ``interval_s``, ``live`` True."""

    live = True

    def __init__(self, rec: Recording, interval_s: float) -> None:
        self.header = rec.header
        self.samples = rec.samples
        self.interval_s = interval_s
        self.i = 0
        self._closed = threading.Event()

    def read(self) -> Sample | None:
        if self._closed.wait(self.interval_s) or self.i >= len(self.samples):
            return None
        s = self.samples[self.i]
        self.i += 1
        return s

    def close(self) -> None:
        self._closed.set()


# ---- verdict and figures ------------------------------------------------------------


def test_link_saturated_badge_during_h2d(rec):
    pos = saturated_moment(rec, "link", "h2d")
    sample = rec.samples[pos - 1].gpus[0]
    assert rec.samples[pos - 1].extra["label"] == "h2d_pinned"
    app = make_app(paused_at(rec, pos))

    async def go():
        async with app.run_test(size=(80, 24)) as pilot:
            await wait_until(pilot, lambda: frame_at(app, pos))
            p = panel(app)
            badge = str(p.badge.render())
            assert "LINK SATURATED" in badge and "RX (into GPU)" in badge and "phase h2d_pinned" in badge
            assert p.badge.has_class("-link") and p.has_class("-link")
            # bold reverse red: the style the stylesheet gives the badge
            style = p.badge.styles
            assert style.text_style.bold and style.text_style.reverse
            assert style.color.r > 200 and style.color.g < 80 and style.color.b < 80
            rx_label = str(p.rx.label.render())
            # The shown rate is this tick's reading, and it is most of the link's one ceiling: this
            # uncalibrated probe read above the 56.7 GB/s default, so its highest reading (observed).
            assert fmt.rate(sample.pcie_rx_Bps) in rx_label
            m = re.search(r"(\d+) % of ([\d.]+) GB/s observed", rx_label)
            share, ceiling = int(m.group(1)), float(m.group(2))
            assert 85 <= share <= 100 and 56.7 < ceiling <= 63.0
            assert abs(share - sample.pcie_rx_Bps / (ceiling * 1e9) * 100) <= 1
            tx_share = int(re.search(r"(\d+) % of", str(p.tx.label.render())).group(1))
            assert tx_share < 20  # H2D: little leaves the GPU
            # 77 cells do not fit 80 columns: the short title, shown whole, with the one ceiling and its source
            assert p.border_title == f"GPU 0 · H200 · PCIe Gen5 x16 (= max) · {ceiling:.1f} GB/s/dir observed"
            assert p.border_title in screen_text(app)
            assert "LINK SATURATED" in screen_text(app)

    run(go())


def test_badge_seen_while_playing_the_h2d_phase(rec):
    """Played through the worker at speed: frames during h2d_pinned carry the link verdict, and the UI shows it."""
    frames: list[Frame] = []

    def hook(msg: Any) -> None:
        if isinstance(msg, FrameReady):
            frames.append(msg.frame)

    # Speed 2: the recording's 2.2 s idle opening lasts 1.1 s of wall time, so frames land in it even when the
    # app's start is slow on a loaded machine (at speed 4, 0.55 s, it was missed under load).
    src = ReplaySource(rec, speed=2.0)
    app = make_app(src)

    async def go():
        async with app.run_test(size=(80, 24), message_hook=hook) as pilot:
            await wait_until(pilot, lambda: app.frame is not None and app.frame.gpus[0].verdict == "link", 15)
            await pilot.press("space")
            await wait_until(pilot, lambda: app.frame.replay.paused)
            f = app.frame
            held = f.ticks
            # Wherever the pause landed, the screen shows the analyzer's verdict for exactly those ticks.
            an = SessionAnalyzer(rec.header, keep_series=False).feed_all(rec.samples[:held])
            assert f.gpus[0].verdict == an.verdict(0)
            assert ("LINK SATURATED" in str(panel(app).badge.render())) == (an.verdict(0) == "link")
            await pilot.pause(0.4)
            assert app.frame.ticks == held and src.position == held

    run(go())
    h2d = [f for f in frames if f.phase == "h2d_pinned"]
    assert h2d, "no frame rendered during the H2D phase"
    assert any(f.gpus[0].verdict == "link" for f in h2d)
    idle = [f for f in frames if f.phase == "idle"]
    assert idle and all(f.gpus[0].verdict == "none" for f in idle)


def test_dram_verdict_during_device_copy_and_na_for_missing(rec):
    pos = saturated_moment(rec, "memory", "d2d")
    app = make_app(paused_at(rec, pos))

    async def go():
        async with app.run_test(size=(80, 24)) as pilot:
            await wait_until(pilot, lambda: frame_at(app, pos))
            p = panel(app)
            assert "DRAM BANDWIDTH SATURATED" in str(p.badge.render())
            mem = str(p.mem.label.render())
            # GPM DRAM_BW_UTIL during the copy reads ~87 % (4.22 of 4.8 TB/s timed).
            pct = int(re.search(r"DRAM BW\s+(\d+) %", mem).group(1))
            assert 80 <= pct <= 95
            assert "proxy" not in mem
            misc = str(p.misc.render())
            # The probe did not read memory used or power: n/a, never 0.
            assert "mem used n/a of 140.4 GiB" in misc and "power n/a" in misc
            assert not re.search(r"\b0 W\b", screen_text(app))
            assert not p.nvlink.display  # no NVLink on this GPU
            assert "no engine attached" in str(app.query_one(EnginePanel).text.render())

    run(go())


def test_proxy_only_gpu_says_duty_cycle_not_bandwidth(rec):
    """A GPU without GPM: memory shows as the NVML busy duty cycle, labelled as a proxy."""
    import dataclasses

    infos = tuple(dataclasses.replace(g, metrics_source="nvml") for g in rec.header.gpus)
    header = dataclasses.replace(rec.header, gpus=infos)
    # Same real ticks without the GPM readings this GPU would not have.
    ticks = [
        dataclasses.replace(s, gpus=tuple(dataclasses.replace(g, dram_bw_util=None, sm_util=None) for g in s.gpus))
        for s in rec.samples
    ]
    nogpm = Recording(rec.path, header, ticks)
    pos = 70  # inside the device-to-device copy, where NVML memory busy reads 100 %
    assert ticks[pos - 1].extra["label"] == "d2d_copy"
    app = make_app(paused_at(nogpm, pos))

    async def go():
        async with app.run_test(size=(80, 24)) as pilot:
            await wait_until(pilot, lambda: frame_at(app, pos))
            mem = str(panel(app).mem.label.render())
            assert re.search(r"mem busy\s+100 % \(duty-cycle proxy\)", mem)
            assert "DRAM BW" not in mem and "bandwidth" not in mem
            assert "SM n/a" in str(panel(app).misc.render())
            await pilot.press("question_mark")
            await wait_until(pilot, lambda: isinstance(app.screen, SourcesScreen))
            text = screen_text(app)
            assert "nvmlDeviceGetPcieThroughput" in text and "nvmlDeviceGetUtilizationRates().memory" in text

    run(go())


# ---- events, seeking, pausing -----------------------------------------------------------


def test_events_recorded_and_seek_rebuilds(rec):
    n = len(rec.samples)
    src = ReplaySource(rec, speed=1000.0)
    app = make_app(src)

    async def go():
        async with app.run_test(size=(100, 30)) as pilot:
            await wait_until(pilot, lambda: frame_at(app, n), 10)
            f = app.frame
            assert f.replay.position == n
            assert frame_events(f) == analyzer_events(rec, n)
            kinds = [e.resource for e in f.events]
            # H2D+D2H copies on the link; the D2D copy in DRAM (its SMs busy too); the matmul on the SMs
            assert kinds == ["link", "memory", "compute", "compute"]
            table = app.query_one(EventsPane).table
            # no cursor, no focus: arrow keys always reach the app (seek), never the table
            assert not table.can_focus and not hasattr(table, "cursor_coordinate")
            assert table.row_count == 4
            newest = [str(c) for c in table.get_row_at(0)]
            assert newest[3] == "compute" and newest[7] == "matmul"
            dram_row = [str(c) for c in table.get_row_at(2)]
            assert dram_row[3] == "DRAM BW" and dram_row[7] == "d2d_copy"
            link_row = [str(c) for c in table.get_row_at(3)]
            assert link_row[3] == "link (PCIe)" and link_row[0] == "+2.21 s"
            assert "GB/s" in link_row[5]

            await pilot.press("space")
            await wait_until(pilot, lambda: app.frame.replay.paused)
            await pilot.press("left")  # 5 s back: the D2D event was still open then
            await wait_until(pilot, lambda: app.frame.ticks == src.position and app.frame.ticks < n)
            back = app.frame
            assert back.t_rel == pytest.approx(rec.samples[n - 1].t - rec.samples[0].t - 5.0, abs=0.3)
            assert frame_events(back) == analyzer_events(rec, back.ticks)
            assert table.row_count == len(back.events)

            await pilot.press("home")
            await wait_until(pilot, lambda: app.frame.ticks == 0)
            assert app.frame.events == () and table.row_count == 0
            assert "none yet" in app.query_one(EventsPane).border_title
            assert "waiting for the first reading" in str(panel(app).badge.render())

            for _ in range(2):
                before = app.frame.ticks
                await pilot.press("right")
                await wait_until(pilot, lambda b=before: app.frame.ticks > b)
            fwd = app.frame
            assert fwd.ticks == src.position
            assert frame_events(fwd) == analyzer_events(rec, fwd.ticks)
            assert "PAUSED" in position_bar(app)

    run(go())


def test_seek_back_out_of_saturation_clears_badge(rec):
    pos = saturated_moment(rec, "link", "h2d")
    src = paused_at(rec, pos)
    app = make_app(src)

    async def go():
        async with app.run_test(size=(80, 24)) as pilot:
            await wait_until(pilot, lambda: frame_at(app, pos))
            assert "LINK SATURATED" in str(panel(app).badge.render())
            await pilot.press("home")
            await wait_until(pilot, lambda: app.frame.ticks == 0)
            await pilot.press("right")
            await wait_until(pilot, lambda: app.frame.ticks > 0)
            # +5 s lies inside the link event (+2.2 to +8.8 s): rebuilt from the start, saturated again
            assert app.frame.gpus[0].verdict == "link"
            await pilot.press("home")
            await wait_until(pilot, lambda: app.frame.ticks == 0)
            badge = str(panel(app).badge.render())
            assert "LINK SATURATED" not in badge and not panel(app).has_class("-link")

    run(go())


def test_speed_keys_and_position_bar(rec):
    src = paused_at(rec, 10)
    app = make_app(src)

    async def go():
        async with app.run_test(size=(80, 24)) as pilot:
            await wait_until(pilot, lambda: frame_at(app, 10))
            await pilot.press("plus", "plus")
            await wait_until(pilot, lambda: app.frame.replay.speed == 4.0)
            assert src.speed == 4.0
            bar = position_bar(app)
            assert bar.startswith("PAUSED 4x") and "/ 19.62 s" in bar and "tick 10/130" in bar
            await pilot.press("minus", "minus", "minus")
            await wait_until(pilot, lambda: app.frame.replay.speed == 0.5)
            await pilot.press("end")
            await wait_until(pilot, lambda: app.frame.ticks == 129)

    run(go())


# ---- live: recording, pausing, render rate -------------------------------------------------


def test_live_record_toggle_writes_the_ticks(rec, tmp_path):
    made: list[RecordingWriter] = []

    def recorder() -> RecordingWriter:
        w = RecordingWriter(tmp_path / f"rec{len(made)}.jsonl", rec.header)
        made.append(w)
        return w

    src = PacedLive(rec, interval_s=0.02)
    app = make_app(src, recorder_factory=recorder)

    async def go():
        async with app.run_test(size=(80, 24)) as pilot:
            await wait_until(pilot, lambda: app.frame is not None and app.frame.ticks >= 5)
            assert "r to record" in static_text(app, "#rec")
            assert app.check_action("seek", (5,)) is False  # no seeking live
            await pilot.press("r")
            assert app.recorder is made[0]
            assert "● REC" in static_text(app, "#rec") and "rec0.jsonl" in static_text(app, "#rec")
            await wait_until(pilot, lambda: app.recorded_ticks >= 20)
            await pilot.press("r")
            assert app.recorder is None
            assert "r to record" in static_text(app, "#rec")
            n = app.recorded_ticks
            consumed = src.i
            back = read_recording(tmp_path / "rec0.jsonl", warn=False)
            assert len(back.samples) == n
            # The written ticks are consecutive real ticks of the source, unchanged.
            first = next(i for i, s in enumerate(rec.samples) if s.t == back.samples[0].t)
            assert [s.to_json() for s in back.samples] == [s.to_json() for s in rec.samples[first : first + n]]
            assert first + n <= consumed
            # live pause freezes the display but keeps analysing
            await pilot.press("space")
            shown = position_bar(app)
            assert "display paused" in shown
            ticks = app.frame.ticks
            await wait_until(pilot, lambda: app.frame.ticks >= ticks + 5)
            assert position_bar(app) == shown
            await pilot.press("space")
            assert "display paused" not in position_bar(app)

    try:
        run(go())
    finally:
        src.close()


def test_renders_at_most_10_hz_and_keeps_peaks(rec):
    frames: list[Frame] = []

    def hook(msg: Any) -> None:
        if isinstance(msg, FrameReady):
            frames.append(msg.frame)

    n = len(rec.samples)
    src = PacedLive(rec, interval_s=0.005)  # 200 ticks/s, 20x the render rate
    app = make_app(src)

    async def go():
        async with app.run_test(size=(80, 24), message_hook=hook) as pilot:
            await wait_until(pilot, lambda: app.frame is not None and app.frame.ended, 10)

    try:
        run(go())
    finally:
        src.close()
    last = frames[-1]
    assert last.ticks == n
    live_frames = frames[:-1]  # the last one is the end-of-source flush
    # The reader thread builds a frame at most every FRAME_MIN_INTERVAL_S (arrival on the UI side may bunch).
    gaps = [b.built_s - a.built_s for a, b in zip(live_frames, live_frames[1:], strict=False)]
    assert min(gaps) >= FRAME_MIN_INTERVAL_S, f"{min(gaps):.3f} s between two frames"
    assert len(live_frames) < n / 4  # coalesced, not one per tick
    # Every tick reached the history, so the peak of the copy survives coalescing.
    true_peak = max(s.gpus[0].pcie_rx_Bps for s in rec.samples if s.gpus[0].pcie_rx_Bps is not None)
    assert max(v for v in last.gpus[0].hist_rx if v is not None) == true_peak
    assert len(last.gpus[0].hist_rx) == n
    # Peak-since-last-frame is at least the latest reading in every frame.
    for f in live_frames:
        g = f.gpus[0]
        if g.sample is not None and g.peak_rx_Bps is not None and g.sample.pcie_rx_Bps is not None:
            assert g.peak_rx_Bps >= g.sample.pcie_rx_Bps


# ---- screens and layout ----------------------------------------------------------------


def test_sources_screen_lists_where_numbers_come_from(rec):
    app = make_app(paused_at(rec, 20))

    async def go():
        async with app.run_test(size=(140, 45)) as pilot:
            await wait_until(pilot, lambda: frame_at(app, 20))
            await pilot.press("question_mark")
            await wait_until(pilot, lambda: isinstance(app.screen, SourcesScreen))
            text = screen_text(app)
            for needle in (
                "NVML_GPM_METRIC_PCIE_TX_PER_SEC",
                "NVML_GPM_METRIC_DRAM_BW_UTIL",
                "MiB/s",
                "56.7 GB/s",
                "0.90 x theoretical",
            ):
                assert needle in text, needle
            await pilot.press("escape")
            assert not isinstance(app.screen, SourcesScreen)
            await pilot.press("i")
            assert isinstance(app.screen, SourcesScreen)

    run(go())


def test_layout_uses_the_room_it_gets(rec):
    sizes = {}

    async def measure(size):
        app = make_app(paused_at(rec, 40))
        async with app.run_test(size=size) as pilot:
            await wait_until(pilot, lambda: frame_at(app, 40))
            p = panel(app)
            spark = p.rx.query_one(Spark)
            events = app.query_one(EventsPane)
            screen_h = size[1]
            # every row of the panel is on screen
            for w in (p.badge, p.tx, p.rx, p.mem, p.misc):
                assert 0 <= w.region.y < screen_h - 2
            n = len(app.frame.events)
            assert n >= 1 and events.region.height >= n + 3  # its rows, the header, the borders at least
            sizes[size] = (spark.size.width, spark.size.height, events.region.height)
            assert "LINK SATURATED" in screen_text(app)

    run(measure((80, 24)))
    run(measure((160, 50)))
    narrow, wide = sizes[(80, 24)], sizes[(160, 50)]
    assert wide[0] > narrow[0] + 60  # sparklines get the width
    assert wide[1] > narrow[1] >= 1  # and more rows when tall (test_tui_layout_keys_and_headline: how many)
    assert wide[2] < 3 * wide[1]  # the room left goes to the charts first, the events box gets its rows


def test_several_gpus_each_get_a_panel_and_share_the_rows(rec):
    """Four GPUs: a panel each where four panels fit 60 % of the rows, their charts sharing the rows the
    others leave (they scrolled within 60 % before, the rest of the screen an empty events box: issue 22),
    one line each where not (80x24). GPUs 1-3 replay GPU 0's real readings (relabelled): this tests layout,
    not data."""
    import dataclasses

    infos = tuple(dataclasses.replace(rec.header.gpus[0], index=i, uuid=f"GPU-{i}") for i in range(4))
    header = dataclasses.replace(rec.header, gpus=infos)
    ticks = [
        dataclasses.replace(s, gpus=tuple(dataclasses.replace(s.gpus[0], index=i) for i in range(4)))
        for s in rec.samples
    ]
    four = Recording(rec.path, header, ticks)
    app = make_app(paused_at(four, 20))

    async def go():
        async with app.run_test(size=(120, 60)) as pilot:
            await wait_until(pilot, lambda: frame_at(app, 20))
            panels = list(app.query(GpuPanel))
            assert [p.index for p in panels] == [0, 1, 2, 3] and all(p.display for p in panels)
            await pilot.pause()
            gpus = app.query_one("#gpus")
            assert gpus.virtual_size.height == gpus.size.height > 0.6 * 60  # all of them, no scrolling
            assert app.query_one(EventsPane).region.height >= 4
            assert not empty_bands(app), screen_text(app)
            assert all("LINK SATURATED" in str(p.badge.render()) for p in panels)
            await pilot.resize_terminal(80, 24)  # the panels do not fit: a line each, the history kept
            await wait_until(pilot, lambda: app.query_one("#gpu-rows").display)
            await pilot.pause()
            text = screen_text(app)
            assert not any(p.display for p in panels)
            assert [ln.split("│")[1].split()[:2] for ln in text.splitlines() if ln.startswith("│ GPU")] == [
                ["GPU", str(i)] for i in range(4)
            ]
            assert text.count("LINK RX") == 4
            await pilot.resize_terminal(120, 60)
            await wait_until(pilot, lambda: all(p.display for p in panels))
            assert len(app.frame.gpus[3].hist_rx) == 20  # the history survived the switch

    run(go())


def test_quit_key_ends_the_app_and_its_reader(rec):
    src = ReplaySource(rec, speed=1.0)
    app = make_app(src)

    async def go():
        async with app.run_test(size=(80, 24)) as pilot:
            await wait_until(pilot, lambda: app.frame is not None)
            await pilot.press("q")
            await pilot.pause()
        assert app._drained.wait(2.0)

    run(go())
    assert app.return_code == 0


def test_measured_ceiling_from_calibration(rec):
    """With the H200's calibrated counter ceiling (tests/fixtures/h200-calibrate.json) the share uses it."""
    import dataclasses
    import json

    cal = json.loads((Path(__file__).parent / "fixtures" / "h200-calibrate.json").read_text())["gpus"][0]
    measured = float(cal["counter_Bps"])
    infos = tuple(
        dataclasses.replace(g, link=dataclasses.replace(g.link, measured_Bps=measured)) for g in rec.header.gpus
    )
    calibrated = Recording(rec.path, dataclasses.replace(rec.header, gpus=infos), rec.samples)
    pos = saturated_moment(rec, "link", "h2d")
    rx = rec.samples[pos - 1].gpus[0].pcie_rx_Bps
    app = make_app(paused_at(calibrated, pos))

    async def go():
        async with app.run_test(size=(80, 24)) as pilot:
            await wait_until(pilot, lambda: frame_at(app, pos))
            p = panel(app)
            label = str(p.rx.label.render())
            assert f"of {measured / 1e9:.1f} GB/s calib." in label
            assert f"{round(rx / measured * 100)} %" in label
            # 75 cells do not fit 80 columns: the short title, shown whole (not cut with an ellipsis)
            assert (
                p.border_title
                == f"GPU 0 · NVIDIA H200 · PCIe Gen5 x16 (max Gen5 x16) · {measured / 1e9:.1f} GB/s/dir calib."
            )
            assert p.border_title in screen_text(app)
            await pilot.press("question_mark")
            await wait_until(pilot, lambda: isinstance(app.screen, SourcesScreen))
            body = app.screen.query_one("#sources-body")
            body.scroll_end(animate=False)
            await pilot.pause()
            assert "pcie-tui calibrate" in screen_text(app)

    run(go())


def test_link_trained_down_is_flagged():
    """A reference tick whose link state is set to Gen1 x16 (as an idle H200 reports at P8)."""
    import dataclasses

    ref = read_recording(Path(__file__).parent.parent / "pcie_tui" / "data" / "h200-reference.jsonl.gz")
    ticks = list(ref.samples[:21])  # position 20: ticks 0..19 shown
    ticks[19] = dataclasses.replace(
        ticks[19], gpus=(dataclasses.replace(ticks[19].gpus[0], link_gen=1, link_width=16),)
    )
    app = make_app(paused_at(Recording(ref.path, ref.header, ticks), 20))

    async def go():
        async with app.run_test(size=(100, 24)) as pilot:
            await wait_until(pilot, lambda: frame_at(app, 20))
            title = panel(app).border_title
            assert "PCIe Gen1 x16 (max Gen5 x16)" in title and "trained down" in title
            # The ceiling follows the link as it is now: Gen1 x16 = 4.0 GB/s theoretical, 3.6 default.
            assert "3.6 GB/s/dir default" in title
            assert "of 3.6 GB/s default" in str(panel(app).rx.label.render())

    run(go())


def test_looping_replay_starts_the_analysis_over(rec):
    """``pcie-tui demo`` loops: each wrap is a jump back to tick 0, so events and history restart."""
    short = Recording(rec.path, rec.header, rec.samples[:20])  # idle, then the start of the H2D copy: 2.9 s
    n = len(short.samples)
    src = ReplaySource(short, speed=4.0, loop=True)  # 0.7 s a loop: frames (2 Hz) mid-loop and at each wrap
    app = make_app(src)
    seen: list[Frame] = []

    def hook(msg: Any) -> None:
        if isinstance(msg, FrameReady):
            seen.append(msg.frame)

    async def go():
        async with app.run_test(size=(80, 24), message_hook=hook) as pilot:
            await wait_until(pilot, lambda: src.generation >= 2 and app.frame is not None, 10)
            await pilot.press("space")
            await wait_until(pilot, lambda: app.frame.replay.paused)
            f = app.frame
            assert f.ticks == src.position <= n
            assert frame_events(f) == analyzer_events(short, f.ticks)
            assert len(f.gpus[0].hist_rx) == f.ticks

    run(go())
    # ticks went down at least once (a wrap), never past the end
    assert any(b.ticks < a.ticks for a, b in zip(seen, seen[1:], strict=False))
    assert max(f.ticks for f in seen) <= n
