"""The live screen at every terminal size (issue 22): bundled demos replayed at 80x24, 120x40, 160x45,
200x50 and 240x67, each at three moments (a quarter, half and nine tenths of the recording), checked as a
user reads the screen: no band of blank rows above 2 (the 160x45 screen had 19-22), the panels the size
promises present, the headline's phase the GPU panel's, no bound named before the evidence threshold.
Every bundled demo, at every size and moment: no empty band as :func:`headless.empty_bands` sees one, rows
blank inside a box (an events box with no events held 4-19 of them), across the screen but for borders, or
an area no box covers (13-27 rows under the engine box beside the taller GPU panel from 160x45).
A demo scaled to 8 GPUs (and 16 at 80x24): one line per GPU, all 8 from 120x40 up, "+N more" where not all fit;
scaled to 2, 8 and 16 GPUs, no empty band either at any size and moment (8 GPUs' lines beside the engine left
8-9 rows uncovered under them, and their events box 6-14 blank rows from 120x40): the lines' link histories
under them, the GPU panels' charts and the engine's charts beside them take the rows.
From 200x50 up: link TX/RX, DRAM and tokens/s stacked on one time axis (the same ticks in the same cells)."""

from __future__ import annotations

import re

import pytest

from pcie_tui.recording import demos
from pcie_tui.recording.reader import read_recording
from pcie_tui.tui.headless import empty_bands, frame_at, paused_app, run, scaled_gpus, screen_text, wait_until
from pcie_tui.tui.timeline import TimelinePanel
from pcie_tui.tui.widgets import HeadlineBar

SIZES = [(80, 24), (120, 40), (160, 45), (200, 50), (240, 67)]
MOMENTS = (0.25, 0.5, 0.9)
DEMOS = ("h200-pinned", "h200-prompt-cache")


@pytest.fixture(scope="module", params=DEMOS)
def rec(request):
    return read_recording(demos.resolve(request.param), warn=False)


def _look(rec, position: int, size: tuple[int, int]) -> dict:
    app = paused_app(rec, position)
    out: dict = {}

    async def go() -> None:
        async with app.run_test(size=size) as pilot:
            await wait_until(pilot, lambda: frame_at(app, position), 20)
            await pilot.pause()
            await pilot.pause()  # the sparklines are fitted after a refresh
            out["text"] = screen_text(app)
            out["bands"] = empty_bands(app)
            out["headline"] = app.query_one(HeadlineBar).text
            out["frame"] = app.frame
            out["shown"] = {
                sel: app.query_one(sel).display and app.query_one(sel).region.height > 0
                for sel in ("#headline", "#gpu-0", "#engine", "#events", "#position")
            }

    run(go())
    return out


def _longest_blank_run(text: str) -> int:
    best = cur = 0
    for line in text.splitlines():
        cur = cur + 1 if not line.strip() else 0
        best = max(best, cur)
    return best


@pytest.mark.parametrize("size", SIZES, ids=lambda s: f"{s[0]}x{s[1]}")
def test_every_size_uses_its_rows(rec, size):
    n = len(rec.samples)
    for m in MOMENTS:
        pos = int(m * (n - 1))
        got = _look(rec, pos, size)
        text = got["text"]
        assert len(text.splitlines()) >= size[1] - 1
        assert _longest_blank_run(text) <= 2, f"{size} at {m:.0%}:\n{text}"
        assert not got["bands"], f"{size} at {m:.0%}: {got['bands']}\n{text}"
        shown = got["shown"]
        assert shown["#headline"] and shown["#gpu-0"] and shown["#engine"] and shown["#position"], shown
        assert shown["#events"], f"{size}: no events box"  # at 80x24 too: the engine panel is two lines there
        # The headline's phase is the GPU panel's (the engine's phase of the tick), and a phase still being
        # measured names no bound (the rule over every tick: test_tui_layout_keys_and_headline.py).
        phase, head = got["frame"].phase, got["headline"] or ""
        if phase and phase not in ("idle", "down"):
            assert head.startswith(phase), (phase, head)
        if "measuring" in head.split("\n")[0]:
            assert not re.search(r"-bound|link-saturated", head.split("\n")[0]), head


def _bands_at_every_size(rec, position: int) -> dict[tuple[int, int], tuple[list[str], str]]:
    """One app at ``position``, resized through SIZES as a user drags the window: (bands, screen) per size."""
    app = paused_app(rec, position)
    out: dict = {}

    async def go() -> None:
        async with app.run_test(size=SIZES[0]) as pilot:
            await wait_until(pilot, lambda: frame_at(app, position), 20)
            for size in SIZES:
                await pilot.resize_terminal(*size)
                await pilot.pause()
                await pilot.pause()  # the charts are fitted after a refresh
                out[size] = (empty_bands(app), screen_text(app))

    run(go())
    return out


@pytest.mark.parametrize("name", list(demos.available()))
def test_no_empty_band_in_any_demo_at_any_size(name):
    """Every bundled demo (the pageable one's empty events box held 4-6 blank rows at every size; beside the
    GPU panel the engine box left 13 rows empty from 160x45), at each size of the issue and three moments."""
    rec = read_recording(demos.resolve(name), warn=False)
    for m in MOMENTS:
        for size, (bands, text) in _bands_at_every_size(rec, int(m * (len(rec.samples) - 1))).items():
            assert not bands, f"{name} {size} at {m:.0%}: {bands}\n{text}"


def test_empty_bands_sees_blank_rows_inside_a_box_and_beside_a_panel():
    """The check itself, on the pageable demo at 160x45 laid out as before: an events box with no events
    and 3 rows inside, an engine box 12 rows shorter than the GPU panel beside it. Both are named; the charts'
    own headroom (a link at 1 % of its ceiling: rows blank above the bars) is not."""
    from pcie_tui.tui.gpu_panel import GpuPanel

    rec = read_recording(demos.resolve("h200-pageable"), warn=False)
    pos = len(rec.samples) // 2
    app = paused_app(rec, pos)
    out: dict = {}

    async def go() -> None:
        async with app.run_test(size=(160, 45)) as pilot:
            await wait_until(pilot, lambda: frame_at(app, pos), 20)
            await pilot.pause()
            await pilot.pause()
            out["now"] = empty_bands(app)
            for row in app.query_one("#gpu-0", GpuPanel).charts:  # 3 rows to the events box below, which has none
                row.spark.styles.height = row.spark.outer_size.height - 1
            engine = app.query_one("#engine")
            engine.styles.max_height = engine.outer_size.height - 12
            await pilot.pause()
            await pilot.pause()
            out["before"] = empty_bands(app)

    run(go())
    assert out["now"] == []
    assert any(b.startswith("#events: rows") for b in out["before"]), out["before"]
    assert any(b.startswith("uncovered: columns 96-159") for b in out["before"]), out["before"]  # beside the GPU panel


# ---- many GPUs: one line each where the panels do not fit ------------------------------------------


@pytest.mark.parametrize(
    ("name", "n_gpus"), [("h200-pinned", 2), ("h200-pinned", 8), ("h200-pinned", 16), ("h200-prompt-cache", 8)]
)
def test_no_empty_band_with_many_gpus_at_any_size(name, n_gpus):
    """Several GPUs (panels each where they fit, else a line each), at each size of the issue and three moments."""
    rec = scaled_gpus(read_recording(demos.resolve(name), warn=False), n_gpus)
    for m in MOMENTS:
        for size, (bands, text) in _bands_at_every_size(rec, int(m * (len(rec.samples) - 1))).items():
            assert not bands, f"{name} x{n_gpus} {size} at {m:.0%}: {bands}\n{text}"


@pytest.fixture(scope="module")
def rec8():
    return scaled_gpus(read_recording(demos.resolve("h200-pinned"), warn=False), 8)


def _gpu_lines(text: str) -> dict[int, list[str]]:
    """The screen's compact GPU lines, by GPU index (a line per GPU: each index once)."""
    out: dict[int, list[str]] = {}
    for line in text.splitlines():
        m = re.match(r"│ GPU (\d+) ", line)
        if m:  # the line inside its box (the engine panel may stand beside it)
            out.setdefault(int(m.group(1)), []).append(line.split("│")[1])
    return out


@pytest.mark.parametrize("size", SIZES, ids=lambda s: f"{s[0]}x{s[1]}")
def test_eight_gpus_one_line_each(rec8, size):
    pos = int(0.5 * (len(rec8.samples) - 1))
    got = _look(rec8, pos, size)
    text = got["text"]
    assert _longest_blank_run(text) <= 2, f"{size}:\n{text}"
    assert not got["bands"], f"{size}: {got['bands']}\n{text}"
    lines = _gpu_lines(text)
    assert all(len(v) == 1 for v in lines.values()), lines  # one row per GPU
    more = re.search(r"\+(\d+) more GPUs?", text)
    if size >= (120, 40):
        assert sorted(lines) == list(range(8)) and more is None, f"{size}:\n{text}"
    else:  # as many as fit, and how many more
        assert len(lines) + (int(more.group(1)) if more else 0) == 8, text
    for line in lines.values():  # every figure with its unit: the shares of the ceiling, DRAM and SM
        assert len(re.findall(r"\d+ %|n/a", line[0])) == 4, line
    shown = got["shown"]
    assert shown["#headline"] and shown["#engine"] and shown["#events"] and not shown["#gpu-0"], shown


def test_sixteen_gpus_at_80x24_end_in_a_more_line():
    rec16 = scaled_gpus(read_recording(demos.resolve("h200-pinned"), warn=False), 16)
    got = _look(rec16, len(rec16.samples) // 2, (80, 24))
    lines = _gpu_lines(got["text"])
    more = re.search(r"\+(\d+) more GPUs", got["text"])
    assert more and 0 < len(lines) < 16 and len(lines) + int(more.group(1)) == 16, got["text"]
    assert sorted(lines) == list(range(len(lines)))  # the first ones; up/down bring the others


# ---- 200x50 and up: link, DRAM and token timing on one time axis ---------------------------------------


def _timeline(rec, position: int, size: tuple[int, int]) -> dict:
    app = paused_app(rec, position)
    out: dict = {}

    async def go() -> None:
        async with app.run_test(size=size) as pilot:
            await wait_until(pilot, lambda: frame_at(app, position), 20)
            await pilot.pause()
            await pilot.pause()
            tl = app.query_one(TimelinePanel)
            out["shown"] = tl.display and tl.region.height > 0
            if out["shown"]:
                out["sparks"] = [
                    (r.spark.start, len(r.spark.values), r.spark.region.x, r.spark.size.width) for r in tl.rows
                ]
                out["axis"] = (tl.axis.region.x, str(tl.axis.render()))
                out["title"] = tl.border_title
            out["frame"] = app.frame
            out["text"] = screen_text(app)

    run(go())
    return out


@pytest.mark.parametrize("size", [(200, 50), (240, 67)], ids=lambda s: f"{s[0]}x{s[1]}")
def test_one_time_axis_from_200x50(rec, size):
    pos = int(0.5 * (len(rec.samples) - 1))
    got = _timeline(rec, pos, size)
    assert got["shown"], got["text"]
    sparks = got["sparks"]  # link TX, link RX, DRAM, tokens/s: the same ticks in the same cells
    assert len(sparks) == 4 and len(set(sparks)) == 1, sparks
    start, n, x, width = sparks[0]
    f = got["frame"]
    assert (
        (start, n) == (f.gpus[0].hist_start, len(f.gpus[0].hist_tx)) == (f.engine_hist_start, len(f.engine_hist_tokens))
    )
    # the axis under them: "now" at the charts' right edge, seconds ago to its left
    ax_x, ax = got["axis"]
    assert ax.rstrip().endswith("now") and ax_x + len(ax.rstrip()) == x + width, (ax_x, ax, x, width)
    assert re.search(r"-\d+ s", ax)
    assert _longest_blank_run(got["text"]) <= 2


@pytest.mark.parametrize("size", [(160, 45), (199, 60), (240, 49)], ids=lambda s: f"{s[0]}x{s[1]}")
def test_no_time_axis_panel_below_200x50(rec, size):
    assert not _timeline(rec, len(rec.samples) // 2, size)["shown"]


def test_eight_gpus_timeline_follows_the_busiest_link(rec8):
    got = _timeline(rec8, int(0.5 * (len(rec8.samples) - 1)), (200, 50))
    assert got["shown"] and len(set(got["sparks"])) == 1
    f = got["frame"]
    shares = {g.index: max(v for v in (*g.hist_tx, *g.hist_rx) if v is not None) / g.ceiling_Bps for g in f.gpus}
    busiest = min(i for i, v in shares.items() if v == max(shares.values()))
    assert got["title"].startswith(f"GPU {busiest} (busiest link of 8)")
    assert _longest_blank_run(got["text"]) <= 2


def test_a_paused_replay_resized_shows_the_engine_panel_of_its_new_size(rec8):
    """Resized from 80x24 (the engine panel's two short lines) to 120x40 while paused, no frame follows: the
    panel is redrawn for 120x40 (latencies, quantiles' method, charts), not left as it was at 80x24 (the
    app's size still read 80x24 during the resize)."""
    pos = len(rec8.samples) // 2
    app = paused_app(rec8, pos)
    out: dict = {}

    async def go() -> None:
        async with app.run_test(size=(80, 24)) as pilot:
            await wait_until(pilot, lambda: frame_at(app, pos), 20)
            out["small"] = screen_text(app)
            await pilot.resize_terminal(120, 40)
            await pilot.pause()
            await pilot.pause()
            out["big"] = screen_text(app)
            out["bands"] = empty_bands(app)

    run(go())
    assert "quantiles:" not in out["small"] and "quantiles:" in out["big"], out["big"]
    assert not out["bands"], out["bands"]
