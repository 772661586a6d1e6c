"""Replay controls, the events table, the badge while easing, phases and the sources screen."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from pcie_tui.analyze.session import sample_phase
from pcie_tui.recording.reader import Recording, read_recording
from pcie_tui.recording.replay import ReplaySource
from pcie_tui.tui.actions import SPEEDS, next_speed
from pcie_tui.tui.app import make_app
from pcie_tui.tui.events import EventsPane
from pcie_tui.tui.gpu_panel import badge
from pcie_tui.tui.headless import frame_at, run, saturated_moment, screen_text, wait_until
from pcie_tui.tui.screens import SourcesScreen
from pcie_tui.tui.sources import engine_sources, figure_sources
from pcie_tui.tui.state import ViewModel

PROBE = Path(__file__).parent / "fixtures" / "h200-probe.jsonl"
LLAMA = Path(__file__).parents[1] / "pcie_tui" / "data" / "h200-llama-partial.jsonl.gz"


@pytest.fixture(scope="module")
def rec() -> Recording:
    return read_recording(PROBE)


@pytest.fixture(scope="module")
def llama() -> Recording:
    return read_recording(LLAMA)


def paused_at(rec: Recording, position: int, loop: bool = False) -> ReplaySource:
    src = ReplaySource(rec, loop=loop)
    src.seek_to_index(position)
    src.set_paused(True)
    return src


def test_speed_steps_return_to_1x():
    assert next_speed(1.0, -1) == 0.5 and next_speed(0.5, 1) == 1.0
    s = 1.0
    for _ in range(20):
        s = next_speed(s, 1)
    assert s == SPEEDS[-1]
    for _ in range(len(SPEEDS) - 1):
        s = next_speed(s, -1)
    assert s == SPEEDS[0]
    for _ in range(2):
        s = next_speed(s, 1)
    assert s == 1.0
    assert next_speed(3.0, 1) == 4.0 and next_speed(3.0, -1) == 2.0  # off the list: snaps


def test_speed_keys_back_to_1x_and_right_left_symmetric(rec):
    src = paused_at(rec, 40)
    app = make_app(src)

    async def go():
        async with app.run_test(size=(80, 24)) as pilot:
            await wait_until(pilot, lambda: frame_at(app, 40))
            for _ in range(12):
                await pilot.press("minus")
            await wait_until(pilot, lambda: app.frame.replay.speed == 0.25)
            await pilot.press("plus", "plus")
            await wait_until(pilot, lambda: app.frame.replay.speed == 1.0)
            for _ in range(3):
                await pilot.press("right")
                await wait_until(pilot, lambda: app.frame.ticks != 40)
                moved = app.frame.ticks
                assert rec.samples[moved - 1].t - rec.samples[39].t == pytest.approx(5.0, abs=0.1)
                await pilot.press("left")
                await wait_until(pilot, lambda: app.frame.ticks == 40)
                assert src.position == 40

    run(go())


def test_end_stops_a_looping_replay_at_its_last_tick(rec):
    short = Recording(rec.path, rec.header, rec.samples[:30])
    src = ReplaySource(short, speed=8.0, loop=True)
    app = make_app(src)

    async def go():
        async with app.run_test(size=(80, 24)) as pilot:
            await wait_until(pilot, lambda: app.frame is not None and app.frame.ticks > 2)
            await pilot.press("end")
            await wait_until(pilot, lambda: app.frame.ticks == 30, 5)
            await pilot.pause(0.6)  # longer than the rest of a loop at 8x
            assert app.frame.ticks == 30 and src.position == 30
            assert "■ end" in str(app.query_one("#position").render())
            await pilot.press("home")  # any other seek loops again
            await wait_until(pilot, lambda: src.generation >= 3 and app.frame.ticks < 30, 5)
            assert src.loop

    run(go())


@pytest.mark.parametrize("size", [(80, 24), (120, 40)])
def test_event_end_column_not_cut(rec, size):
    n = len(rec.samples)
    app = make_app(paused_at(rec, n - 1))

    async def go():
        async with app.run_test(size=size) as pilot:
            await wait_until(pilot, lambda: frame_at(app, n - 1))
            table = app.query_one(EventsPane).table
            shown = min(table.row_count, table.size.height - 1)  # the rows in view (80x24: the others scroll)
            ends = [str(table.get_row_at(i)[1]) for i in range(shown)]
            assert any(e.endswith(" s") for e in ends)
            text = screen_text(app)
            for e in ends:
                assert e in text, e
            peaks = [str(table.get_row_at(i)[5]) for i in range(shown)]
            for p in peaks:
                assert p in text, p

    run(go())


def test_events_scroll_under_their_header_and_a_changed_event_repaints_its_line_alone(rec):
    """The events box draws line by line (issue 22: a DataTable re-rendered every cell after each changed one):
    rows scroll under the header that stays; a new event brings the newest back into view; a changed figure
    repaints that event's line and no other."""
    n = len(rec.samples)
    app = make_app(paused_at(rec, n - 1))

    async def go():
        async with app.run_test(size=(80, 24)) as pilot:
            await wait_until(pilot, lambda: frame_at(app, n - 1))
            pane = app.query_one(EventsPane)
            table = pane.table
            events = app.frame.events
            assert table.row_count == len(events) > table.size.height - 1  # more than fit: they scroll
            down = table.max_scroll_y
            assert down >= 1
            table.scroll_to(y=down, animate=False, immediate=True)
            await pilot.pause()
            lines = screen_text(app).splitlines()
            top = table.region.y
            header = ["start", "end", "GPU", "resource", "dir", "peak", "mean", "phase"]
            assert lines[top].split("│")[1].split()[:8] == header  # then the scrollbar
            assert lines[top + 1].split("│")[1].split()[:2] == table.get_row_at(down)[0].split()

            regions = []
            refresh = table.refresh
            table.refresh = lambda *r, **k: (regions.extend(r), refresh(*r, **k))[1]  # type: ignore[method-assign]
            i = len(events) - 1 - down  # the event on the first line under the header: "open" from now on
            changed = (*events[:i], dataclasses.replace(events[i], end_s=None), *events[i + 1 :])
            pane.show(changed, app.frame.events_total, exact=True)
            assert table.get_row_at(down)[1] == "open" and table.scroll_offset.y == down
            assert [(r.y, r.height) for r in regions] == [(1, 1)], regions  # its line (under the header) alone
            await pilot.pause()
            assert screen_text(app).splitlines()[top + 1].split("│")[1].split()[2] == "open"

            new = dataclasses.replace(events[-1], key="new", start_s=events[-1].start_s + 1.0)
            pane.show((*changed, new), app.frame.events_total + 1, exact=True)
            assert table.scroll_offset.y == 0 and table.get_row_at(0) == table.rows[0]

    run(go())


def test_badge_while_easing_is_honest(rec):
    pos = saturated_moment(rec, "link", "h2d")
    app = make_app(paused_at(rec, pos))

    async def go():
        async with app.run_test(size=(140, 45)) as pilot:
            await wait_until(pilot, lambda: frame_at(app, pos))
            g = app.frame.gpus[0]
            assert g.verdict == "link" and g.open_events
            util = dataclasses.replace(g.util, link=0.02)
            easing = dataclasses.replace(g, util=util)
            ev = g.open_events[0]
            both = dataclasses.replace(easing, open_events=(dataclasses.replace(ev, direction="both"),))
            for wide in (True, False):
                text, cls = badge(easing, "prefill", wide)
                assert cls == "-link"
                assert "now 2 % (easing)" in text and f"peak {round(ev.peak_util * 100)} %" in text
                # one set of brackets besides "(easing)"; at 80 columns they make room for the figures
                assert text.count("(") == (2 if wide else 1) and "PCIe RX" in text
                assert ("RX (into GPU)" in text) == wide
                assert len(text) <= 76 or wide
                text, _ = badge(both, "prefill", wide)
                assert "TX+RX" in text and "now 2 % (easing)" in text and text.count("(") <= 2
                assert len(text) <= 76 or wide
            text, _ = badge(g, "h2d_pinned", True)
            assert "easing" not in text and "RX (into GPU)" in text

    run(go())


def test_phases_do_not_mix_label_and_engine_words(llama):
    vm = ViewModel(llama.header)
    for s in llama.samples:
        vm.feed(s)
        if s.engine is not None and s.engine.phase:
            assert vm.phase == sample_phase(s) == s.engine.phase
    labels = {s.extra.get("label") for s in llama.samples} - {None}
    engine = {s.engine.phase for s in llama.samples if s.engine is not None and s.engine.phase}
    assert "load" in labels and "loading" in engine  # the recording really has both
    vm = ViewModel(llama.header)
    vm.advance(llama.samples, 60)
    shown = set(vm.frame().gpus[0].hist_phase) - {None}
    assert shown <= engine and "load" not in shown


def test_sources_screen_lists_engine_figures_cleanly(llama):
    # at the end: requests have ended, so the log's timings (TTFT, prefill) have a reading and their source is
    # listed (before the first ends the page names them as without a reading: test_tui_sources_page.py)
    pos = len(llama.samples) - 1
    app = make_app(paused_at(llama, pos))

    async def go():
        async with app.run_test(size=(80, 24)) as pilot:
            await wait_until(pilot, lambda: frame_at(app, pos))
            await pilot.press("question_mark")
            await wait_until(pilot, lambda: isinstance(app.screen, SourcesScreen))
            await pilot.pause()
            body = app.screen.query_one("#sources-body")
            seen = screen_text(app)
            while body.scroll_y < body.max_scroll_y:
                body.scroll_relative(y=10, animate=False)
                await pilot.pause()
                seen += screen_text(app)
            for needle in (
                "Engine panel",
                "llama-server log",
                "prompt eval time",
                "/slots",
                "KV cache",
                "nvmlDeviceGetMaxPcieLinkGeneration",
                "nvmlDeviceGetMaxPcieLinkWidth",
            ):
                assert needle in seen, needle
            assert "..." not in seen and "…" not in seen
            # opaque: around the box (its margin) nothing of the monitor below shows
            lines = screen_text(app).splitlines()
            assert not lines[0].strip() and not lines[-1].strip()
            assert all(not (ln[:2] + ln[-2:]).strip() for ln in lines)
            # wrapped lines keep their indent: after the first heading, a line's first 18 columns
            # hold a figure's name, a heading, or nothing (a wrapped line of the detail column)
            f = app.frame  # the figures the page lists: those the recording has, and one row for the others
            names = [r.figure for r in figure_sources(llama.header, llama.header.gpus[0], f.figures[0], True)]
            stats = {"quantile_method": "x", "rate_source": "y"}
            names += [r.figure for r in engine_sources("llamacpp", stats, 10, f.engine_figures)]
            started = False
            for line in seen.splitlines():
                inner = line.strip().strip("│╭╮╰╯─").strip("\n")[1:] if "│" in line else ""
                if inner.lstrip().startswith("GPU 0"):
                    started = True
                head = inner[:18].strip()
                if started and head and not inner.lstrip().startswith(("GPU ", "Engine panel", "escape")):
                    assert any(head in n or head.startswith(n[:10]) for n in names), line
            assert started

    run(go())


def test_set_text_relayouts_only_when_the_text_changes_size():
    """A figure ticking in a text of the same rows repaints; a text that needs another row (or, in a
    width-auto widget, more cells) relayouts, so it is never cut."""
    from textual.app import App
    from textual.widgets import Static

    from pcie_tui.tui.widgets import set_text

    class Two(App[None]):
        CSS = "#rows { height: auto; width: 30; } #cells { width: auto; height: 1; text-wrap: nowrap; }"

        def compose(self):
            yield Static("", id="rows")
            yield Static("", id="cells")

    app = Two()
    layouts: list[str] = []

    async def go():
        async with app.run_test(size=(60, 10)) as pilot:
            rows, cells = app.query_one("#rows", Static), app.query_one("#cells", Static)
            for w in (rows, cells):
                orig = w.refresh

                def spy(*a, w=w, orig=orig, **kw):
                    if kw.get("layout"):
                        layouts.append(w.id)
                    return orig(*a, **kw)

                w.refresh = spy
            set_text(rows, "rate 307 tok/s", layout=True)
            set_text(cells, "now 87 %", layout=True)
            await pilot.pause()
            first = list(layouts)  # laid out at least once each
            layouts.clear()
            set_text(rows, "rate 1453 tok/s", layout=True)  # same one row
            set_text(cells, "now 88 %", layout=True)  # same width
            await pilot.pause()
            assert layouts == [] and "1453" in screen_text(app) and "88 %" in screen_text(app)
            set_text(rows, "rate 1453 tok/s and a second line of text", layout=True)  # wraps to 2 rows
            set_text(cells, "now 100 %", layout=True)  # one cell wider
            await pilot.pause()
            assert set(layouts) == {"cells", "rows"}, layouts
            assert rows.size.height == 2 and cells.size.width == len("now 100 %")
            text = screen_text(app)
            assert "now 100 %" in text and "line of text" in text, text
            assert set(first) == {"rows", "cells"}

    run(go())


@pytest.mark.parametrize("size", [(80, 34), (170, 45)], ids=str)  # below 30 rows the engine panel is two lines
def test_history_legend_names_every_phase_in_view(size):
    """The vLLM CPU session mid-decode has five phases in its history: at 80 columns the legend takes
    its short words ("last 92.0 s:") rather than cutting the last phase off; wide, the full words."""
    from pcie_tui.tui.widgets import HistoryLegend

    rec = read_recording(Path(__file__).parent / "fixtures" / "vllm-cpu-session.jsonl", warn=False)
    idx = [i for i, s in enumerate(rec.samples) if s.engine is not None and s.engine.phase == "decode"]
    pos = idx[len(idx) // 2]
    app = make_app(paused_at(rec, pos))

    async def go():
        async with app.run_test(size=size) as pilot:
            await wait_until(pilot, lambda: frame_at(app, pos))
            await pilot.pause()
            legend = app.query_one("#engine").query_one(HistoryLegend)
            shown = str(legend.render())
            for phase in ("loading", "idle", "prefill", "mixed", "decode"):
                assert phase in shown and phase in screen_text(app), (phase, shown)
            assert shown.startswith("last " if size[0] < 100 else "history ")
            assert len(shown) <= legend.size.width

    run(go())
