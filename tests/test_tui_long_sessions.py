"""A session hours long: the events' start and end times (fmt.offset) stay whole in their columns, each with
a space before the next column, at 80x24 and 200x50 (the column was sized for "+99.99 s": from +100 s a
time ran into the GPU column); the shared time axis reads in minutes and hours, the position bar in h:mm:ss."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from pcie_tui.core.model import GpuInfo, GpuSample, LinkInfo, Sample, SessionHeader
from pcie_tui.recording.reader import Recording
from pcie_tui.tui import fmt
from pcie_tui.tui.events import EVENT_COLUMNS, EventsPane
from pcie_tui.tui.headless import frame_at, paused_app, run, screen_text, wait_until
from pcie_tui.tui.timeline import TimelinePanel, axis

DT = 10.0  # a tick every 10 s: eleven hours in 3,960 ticks
CAPACITY = 63e9
# Link-saturated stretches (start, end) in seconds since the first tick: the times cross each format.
BURSTS = ((40, 80), (150, 200), (1200, 1260), (3720, 3800), (36_010, 36_100), (39_000, 39_600))


def _busy(rel: float) -> bool:
    return any(a <= rel < b for a, b in BURSTS)


def long_session(hours: float = 11.0) -> Recording:
    link = LinkInfo(gen=5, width=16, max_gen=5, max_width=16, capacity_Bps=CAPACITY)
    gpu = GpuInfo(0, "GPU-long", "NVIDIA H100 80GB HBM3", "00000000:01:00.0", link, 80 << 30, metrics_source="gpm")
    header = SessionHeader("2026-12-07T00:00:00Z", "gen", "0", (gpu,), interval_s=DT)
    samples = []
    for i in range(int(hours * 3600 / DT)):
        busy = _busy(i * DT)
        g = GpuSample(
            0, pcie_tx_Bps=1e6, pcie_rx_Bps=0.9 * CAPACITY if busy else 1e6, dram_bw_util=0.1, sm_util=0.1,
            mem_used_bytes=1 << 34, power_W=300.0,
        )  # fmt: skip
        samples.append(Sample(1000.0 + i * DT, (g,), None, extra={"label": "copy" if busy else "idle"}))
    return Recording(Path("long.jsonl"), header, samples)


def test_offsets_fit_eight_characters_under_ten_hours():
    cases = {
        0.0: "+0.00 s",
        99.994: "+99.99 s",
        99.996: "+100.0 s",
        123.44: "+123.4 s",
        999.94: "+999.9 s",
        999.96: "+0:16:40",
        3723.0: "+1:02:03",
        35_999.4: "+9:59:59",
        36_000.0: "+10:00:00",
    }
    assert {s: fmt.offset(s) for s in cases} == cases
    assert fmt.offset(None) == fmt.NA
    widths = {key: w for key, _, w in EVENT_COLUMNS}
    assert all(len(fmt.offset(s)) < widths["start"] for s in cases if s < 36_000)


@pytest.mark.parametrize("size", [(80, 24), (200, 50)], ids=lambda s: f"{s[0]}x{s[1]}")
def test_event_times_of_an_eleven_hour_session_stay_in_their_columns(size):
    rec = long_session()
    n = len(rec.samples) - 1  # paused on the last tick: ticks 0..n-1 shown
    app = paused_app(rec, n)
    out: dict = {}

    async def go() -> None:
        async with app.run_test(size=size) as pilot:
            await wait_until(pilot, lambda: frame_at(app, n), 20)
            await pilot.pause()
            pane = app.query_one(EventsPane)
            out["cells"] = [tuple(str(c) for c in pane.table.get_row_at(i)) for i in range(pane.table.row_count)]
            out["widths"] = pane.table.column_widths
            out["text"] = screen_text(app)

    run(go())
    starts = [c[0] for c in out["cells"]]
    # newest first: past 10 h, past 1 h, past 1,000 s, past 100 s, under 100 s
    assert starts == ["+10:50:00", "+10:00:10", "+1:02:00", "+0:20:00", "+150.0 s", "+40.00 s"], starts
    widths = out["widths"]
    for row in out["cells"]:
        assert len(row[0]) < widths["start"] and len(row[1]) < widths["end"], (row, widths)
    # on screen: start, a space, end, a space, the GPU: no time runs into the next column
    shown = [ln for ln in out["text"].splitlines() if re.search(r"\+\S+\s+\S+\s+0\s+link", ln)]
    assert shown, out["text"]
    for ln in shown:
        assert re.search(r"\+(\d+:\d\d:\d\d|\d+\.\d+ s) +(\+(\d+:\d\d:\d\d|\d+\.\d+ s)|open) +0 +link", ln), ln
    visible = {re.search(r"\+(\d+:\d\d:\d\d|\d+\.\d+ s)", ln).group(0) for ln in shown}
    assert visible <= set(starts) | {c[1] for c in out["cells"]}
    assert "+10:50:00" in visible and "+10:00:10" in visible


def test_eleven_hours_at_200x50_read_in_minutes_and_hours():
    """The shared time axis of a session hours long labels minutes and hours ("-45 min", "-1:30 h"), never two
    labels closer than two blank cells (they ran together: "-2580 s-2280 s"); the position bar and the
    history legends give times past 1,000 s as h:mm:ss (fmt.elapsed, the events' times unsigned), not
    "39580.00 s"."""
    rec = long_session()
    n = len(rec.samples) - 1
    app = paused_app(rec, n)
    out: dict = {}

    async def go() -> None:
        async with app.run_test(size=(200, 50)) as pilot:
            await wait_until(pilot, lambda: frame_at(app, n), 20)
            await pilot.pause()
            await pilot.pause()
            out["axis"] = str(app.query_one(TimelinePanel).axis.render())
            out["text"] = screen_text(app)

    run(go())
    labels = out["axis"].split()
    joined = re.findall(r"-\d+(?::\d\d)? (?:s|min|h)|now", out["axis"])
    assert " ".join(joined).split() == labels, out["axis"]  # nothing but whole labels on the axis
    assert len(joined) >= 4 and joined[-1] == "now" and all(" min" in x or " h" in x for x in joined[:-1]), joined
    spans = [m.span() for m in re.finditer(r"-\d+(?::\d\d)? (?:s|min|h)|now", out["axis"])]
    assert all(nxt[0] - prev[1] >= 2 for prev, nxt in zip(spans, spans[1:], strict=False)), out["axis"]
    position = next(ln for ln in out["text"].splitlines() if "tick " in ln and " / " in ln)
    assert re.search(r"10:59:\d\d / 10:59:\d\d", position), position
    assert "history 0:49:50" in out["text"] or "last 0:49:50" in out["text"], out["text"]
    assert not re.search(r"\d{4,}\.\d+ s", out["text"]), out["text"]


def test_axis_labels_keep_two_cells_apart_at_any_step():
    """From 0.1 s ticks to 1 min ticks, at any width: whole labels, two blank cells at least between them."""
    for width in (60, 120, 175):
        for interval in (0.1, 1.0, 10.0, 60.0):
            ax = str(axis(width, 300, 300, interval))
            spans = [m.span() for m in re.finditer(r"-\d+(?::\d\d)? (?:s|min|h)|now", ax)]
            assert len(spans) >= 2 and ax.rstrip().endswith("now"), ax
            assert " ".join(ax[a:b] for a, b in spans).split() == ax.split(), ax  # whole labels only
            assert all(nxt[0] - prev[1] >= 2 for prev, nxt in zip(spans, spans[1:], strict=False)), (
                width,
                interval,
                ax,
            )
