"""The pcie-tui Textual app: build it with :func:`make_app` from any Source.

One thread worker reads the source, feeds the analysis (:class:`ViewModel`)
and posts at most two :class:`FrameReady` messages a second; the UI thread
only renders frames. Replay seeks are reconciled in the worker too.

This module composes the screen and renders frames; the reader thread is
:class:`pcie_tui.tui.worker.SourceWorker` and the key actions are
:class:`pcie_tui.tui.actions.KeyActions`, both mixed into :class:`PcieTuiApp`.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

from rich.text import Text
from textual.app import App, ComposeResult
from textual.binding import Binding
from textual.containers import Container, Horizontal, Vertical, VerticalScroll
from textual.widgets import Footer, Static

from pcie_tui.analyze.verdict import Thresholds
from pcie_tui.tui.actions import KeyActions
from pcie_tui.tui.engine_panel import EnginePanel
from pcie_tui.tui.events import EventsPane
from pcie_tui.tui.frame import Frame
from pcie_tui.tui.gpu_panel import GpuPanel
from pcie_tui.tui.gpu_rows import GpuRows
from pcie_tui.tui.state import HISTORY_TICKS, ViewModel
from pcie_tui.tui.timeline import TimelinePanel
from pcie_tui.tui.widgets import HeadlineBar, PositionBar, header_text, set_spark_rows, set_text, spark_share
from pcie_tui.tui.worker import FrameReady, RecordingFailed, SourceFailed, SourceFault, SourceWorker

WIDE_AT_COLUMNS = 120
SIDE_BY_SIDE_AT_COLUMNS = 160  # GPU panels and the engine panel in two columns (with an engine)
TALL_AT_ROWS = 40
SHORT_BELOW_ROWS = 30  # a stacked engine panel shrinks to two lines, so the saturation events keep rows
# The GPU sparklines take the rows the other boxes leave; several GPUs' (and one GPU's above the shared timeline,
# which takes the rest) up to this many rows each; on a tall terminal two at least.
SPARK_ROWS_MAX = 12
PANEL_ROWS_MIN = 8  # a GPU panel with one-row charts; GPUs whose panels do not fit #gpus get one line each
TIMELINE_AT = (200, 50)  # columns, rows: link, DRAM and token timing on one time axis beside the events
TIMELINE_ROWS_MIN = 11  # its borders, four charts of two rows and the axis


class PcieTuiApp(KeyActions, SourceWorker, App[None]):
    """Live or replayed PCIe / NVLink / DRAM monitor with a saturation verdict per GPU."""

    CSS_PATH = "app.tcss"
    ENABLE_COMMAND_PALETTE = False
    BINDINGS = [
        Binding("q", "quit", "quit"),
        # Textual 1.0+ binds ctrl+c to "press ctrl+q to quit"; here it quits like q, on every
        # screen (priority), closing a recording in progress on the way out (on_unmount).
        Binding("ctrl+c", "quit", "quit", show=False, priority=True),
        Binding("space", "toggle_pause", "pause"),
        Binding("r", "toggle_record", "record"),
        Binding("left", "seek(-5)", "-5 s"),
        Binding("right", "seek(5)", "+5 s"),
        Binding("minus", "speed(-1)", "slower"),
        Binding("plus,equals_sign", "speed(1)", "faster", key_display="+"),
        Binding("home", "seek_home", "start", show=False),
        Binding("end", "seek_end", "end (stops there)", show=False),
        Binding("question_mark,i", "sources", "sources", key_display="?"),
        Binding("a", "answer", "answer"),
        Binding("up", "scroll_gpus(-1)", show=False),
        Binding("down", "scroll_gpus(1)", show=False),
        Binding("pageup", "scroll_gpus(-10)", show=False),
        Binding("pagedown", "scroll_gpus(10)", show=False),
    ]

    def __init__(
        self,
        source: Any,
        *,
        recorder_factory: Callable[[], Any] | None = None,
        thresholds: Thresholds | None = None,
        title: str | None = None,
        status: str | None = None,
    ) -> None:
        super().__init__()
        self.status = status
        self.source = source
        self.live = bool(source.live)
        self.recorder_factory = recorder_factory
        recording = getattr(source, "recording", None)
        self.model = ViewModel(source.header, thresholds, events=getattr(recording, "events", ()) or ())
        self.title = title or "pcie-tui"
        self.frame: Frame | None = None
        self.display_paused = False
        self.failure: str | None = None
        self.recorder: Any = None
        self.recorded_ticks = 0
        self.saved: list[tuple[Any, int]] = []  # (path, ticks) of recordings closed, for the CLI to list
        self._model_lock = threading.Lock()
        self._rec_lock = threading.Lock()
        self._stop = threading.Event()
        self._wake = threading.Event()
        self._drained = threading.Event()  # the reader thread has returned
        self._panels: dict[int, GpuPanel] = {}
        self._gpu_rows = GpuRows(HISTORY_TICKS)
        self._size_now = (80, 24)  # (columns, rows) as last applied
        self._fitted: tuple[Any, ...] = ()  # what the last fit of the charts read (_fit_inputs)
        self._fitted_ahead = (-1, -1)  # the rows set that it read (_rows_ahead)
        self._gpus_most = "60vh"  # #gpus' max height as set (the stylesheet's to begin with)
        self._compact = False  # every GPU on one line (GpuRows) instead of a panel each
        self._loop_held = False  # End on a looping replay: stop at the end until the next seek
        self._has_engine = source.header.engine is not None  # else set by the first engine reading

    # ---- layout -------------------------------------------------------------

    def compose(self) -> ComposeResult:
        # Kept as attributes: frames keep arriving while another screen (sources) is on top.
        self._rec_w = Static("", id="rec")
        self._headline_w = HeadlineBar()
        self._gpus_w = VerticalScroll(id="gpus")
        self._gpus_w.can_focus = False
        self._engine_w = EnginePanel(HISTORY_TICKS)
        self._events_w = EventsPane()
        self._timeline_w = TimelinePanel(HISTORY_TICKS)
        self._position_w = PositionBar(self.live)
        with Horizontal(id="header"):
            yield Static(header_text(self.source.header, self._source_label(), self.title), id="title")
            yield self._rec_w
        yield self._headline_w
        with Container(id="panels"):  # stacked; side by side on wide screens (-side)
            with self._gpus_w:
                yield self._gpu_rows
                for info in self.source.header.gpus:
                    panel = GpuPanel(info.index, HISTORY_TICKS)
                    self._panels[info.index] = panel
                    yield panel
                if not self.source.header.gpus:
                    why = self.source.header.extra.get("gpu_unavailable")
                    text = f"GPU side unavailable: {why}" if why else "no GPU readings in this source (engine only)"
                    yield Static(Text(text, style="dim"), id="no-gpus")
            yield self._engine_w
        with Container(id="lower"):  # the room left: the events box (beside the shared timeline) fills it
            yield self._timeline_w
            yield self._events_w
        with Vertical(id="bottom"):
            yield self._position_w
            yield Footer()

    def _source_label(self) -> str:
        if self.status:
            return self.status
        if self.live:
            return "live"
        rec = getattr(self.source, "recording", None)
        path = getattr(rec, "path", None)
        return f"replay {Path(path).name}" if path is not None else "replay"

    @property
    def _main(self) -> Any:
        """The monitor screen, even while the sources screen is on top of it."""
        return self.screen_stack[0]

    def on_mount(self) -> None:
        self._events_w.display = bool(self.source.header.gpus)  # no GPU readings: no saturation to list
        self._apply_size(self.size.width, self.size.height)
        self._show_recording_state()
        self._pump()

    def on_resize(self, event: Any) -> None:
        self._apply_size(event.size.width, event.size.height)

    @property
    def _height(self) -> int:
        """The terminal's rows as last applied (``self.size`` still reads the old size in on_resize)."""
        return self._size_now[1]

    def _apply_size(self, width: int, height: int) -> None:
        self._size_now = (width, height)
        wide, tall = width >= WIDE_AT_COLUMNS, height >= TALL_AT_ROWS
        # Side by side only beside GPU panels: the engine alone takes the full width.
        side = width >= SIDE_BY_SIDE_AT_COLUMNS and self._has_engine and bool(self.source.header.gpus)
        timeline = width >= TIMELINE_AT[0] and height >= TIMELINE_AT[1] and bool(self.source.header.gpus)
        classes = {"-wide": wide, "-tall": tall, "-side": side, "-timeline": timeline}
        main = self._main
        if any(main.has_class(c) != on for c, on in classes.items()):  # the whole screen restyled once
            for c, on in classes.items():
                main.set_class(on, c, update=False)
            main.update_node_styles()
        for p in self._panels.values():
            p.wide = wide
        self._events_w.set_fixed(timeline)  # under the timeline: its rows; else the room the charts leave
        self._set_compact(self._too_many_panels(height))
        if self.frame is not None:
            self._render(self.frame)  # schedules the sparklines' fit
        else:
            self.call_after_refresh(self._fit_sparks)

    def _gpus_room(self, height: int) -> int:
        """Rows #gpus may take (its 60 % of the screen)."""
        return int(0.6 * height)

    def _too_many_panels(self, height: int) -> bool:
        """More than one GPU, and their panels (one-row charts) would not fit the rows #gpus may take."""
        return len(self._panels) > 1 and len(self._panels) * PANEL_ROWS_MIN > self._gpus_room(height)

    def _set_compact(self, compact: bool) -> None:
        """One line per GPU, or a panel each; the history lives in the model, so nothing is lost."""
        self._compact = compact
        self._gpu_rows.display = compact
        for p in self._panels.values():
            p.display = not compact

    def _fit_sparks(self) -> None:
        """Every row of the screen to a panel (issue 22): the events box keeps the rows its events need
        (:attr:`EventsPane.rows_needed`: its titled border alone with none), the shared timeline its
        TIMELINE_ROWS_MIN, and the GPU panels' charts take all the rest, shared row by row (beside the GPUs,
        the engine's charts grow to the GPU column's height); GPUs one line each (:meth:`_fit_lines`) get
        their link histories under the lines instead. GPUs whose panels do not fit even with the fewest rows
        scroll in #gpus (60 %); the charts up to SPARK_ROWS_MAX rows where the timeline below takes the rows
        over. Computed from the heights of everything else, which do not depend on it, and set only when it
        changes (a relayout)."""
        if self._stop.is_set():
            return
        side = self._main.has_class("-side")
        tall = self._height >= TALL_AT_ROWS
        self._fitted = self._fit_inputs()
        self._fitted_ahead = self._rows_ahead()
        self.call_after_refresh(self._refit)  # a text laid out anew after this fit read its old height
        if self._compact:
            self._fit_lines(side, tall)
            return
        panels = [p for p in self._panels.values() if p.is_mounted and p.display]
        if not panels:
            self._engine_w.fit(None, tall)
            return
        sparks = [row for p in panels for row in p.charts]
        fixed = sum(p.fixed_rows for p in panels)
        least = 2 if tall else 1
        room = self._room(side, tall)
        scroll = len(panels) > 1 and fixed + least * len(sparks) > room  # several GPUs scroll, not shrink
        if scroll:
            room = min(room, self._gpus_room(self._height))
        most = SPARK_ROWS_MAX if self._capped() else None
        share = spark_share(room - fixed, len(sparks), most, least)
        for row, n in zip(sparks, share, strict=True):
            set_spark_rows(row.spark, n)
        self._set_gpus_most("60vh" if scroll else "100%")
        gpu_h = fixed + sum(share)
        self._engine_w.fit(min(gpu_h, room) if side else None, tall)

    def _fit_inputs(self) -> tuple[Any, ...]:
        """What a fit reads besides the terminal's size: the heights of the headline, the engine's text,
        the events box's rows and the lines or panels of the GPUs."""
        return (
            self._size_now,
            self._headline_w.outer_size.height,
            self._engine_w.natural_rows(self._height >= TALL_AT_ROWS),
            self._events_w.rows_needed if self._events_w.display else 0,
            self._gpu_rows.lines if self._compact else tuple(p.fixed_rows for p in self._panels.values()),
        )

    def _rows_ahead(self) -> tuple[int, int]:
        """The rows of the headline and of the events box as set, before the layout lays them out."""
        return self._headline_w.rows, self._events_w.rows_needed if self._events_w.display else 0

    def _refit(self) -> None:
        """Fit again where what the last fit read has changed since (a paused replay renders no more frames)."""
        if not self._stop.is_set() and self._fit_inputs() != self._fitted:
            self._fit_sparks()

    def _fit_lines(self, side: bool, tall: bool) -> None:
        """GPUs one line each: their link histories under the lines take the rows the others leave; beside
        the engine, as many as make the two columns one height. Above the shared timeline (which takes the
        rows left) only those the engine beside needs."""
        lines = self._gpu_rows
        box = lines.lines + lines.gutter.height
        engine = self._engine_w.natural_rows(tall) if side else 0
        want = engine if self._capped() else max(self._room(side, tall), engine)
        lines.set_history(want - box if lines.complete else 0)
        self._set_gpus_most("100%")
        self._engine_w.fit(box + lines.history if side else None, tall)

    def _set_gpus_most(self, most: str) -> None:
        """#gpus' max height, set only when it changes (a relayout)."""
        if most != self._gpus_most:
            self._gpus_most = most
            self._gpus_w.styles.max_height = most

    def _capped(self) -> bool:
        """The GPU charts stop at SPARK_ROWS_MAX rows only where the timeline below takes the rows over."""
        return self._main.has_class("-timeline")

    def _room(self, side: bool, tall: bool) -> int:
        """The rows the GPU panels (or lines) may take on this screen: what the header, headline, position
        bar, events box, timeline and (stacked) engine panel leave."""
        height = self._height
        other = 1 + self._headline_w.rows + self.query_one("#bottom").outer_size.height
        other += self._events_w.rows_needed if self._events_w.display else 0
        if self._main.has_class("-timeline"):
            other += TIMELINE_ROWS_MIN
        if not side and self._engine_w.display:
            other += min(self._engine_w.natural_rows(tall), height // 2)  # the stylesheet's 50vh at most
        return height - other

    # ---- messages from the worker ---------------------------------------------

    def on_frame_ready(self, message: FrameReady) -> None:
        f = message.frame
        if self.frame is not None and f.seq <= self.frame.seq:
            return  # two workers may post; never go back to an older frame
        self.frame = f
        if not self.display_paused:
            self._render(f)

    def on_source_failed(self, message: SourceFailed) -> None:
        self.failure = message.error
        self.notify(f"source failed: {message.error}", severity="error")
        self._render_position()

    def on_source_fault(self, message: SourceFault) -> None:
        self.notify(message.message, severity="warning", timeout=12)
        self._position_w.fault = message.message  # kept on the position line: the watching goes on
        self._render_position()

    def on_recording_failed(self, message: RecordingFailed) -> None:
        self.notify(f"recording stopped: {message.error}", severity="error")
        self._show_recording_state()

    # ---- rendering ------------------------------------------------------------

    def _render(self, f: Frame) -> None:
        if self._stop.is_set():
            return  # shutting down: the widgets may be gone
        wide = self._main.has_class("-wide")
        if f.engine is not None and not self._has_engine:
            self._has_engine = True  # once: an engine appeared, the wide layout may now split
            self._apply_size(*self._size_now)
            return  # _apply_size rendered this frame
        with self.batch_update():
            self._headline_w.show(f.headline)
            if self._compact:
                self._gpu_rows.show(f.gpus, self._gpus_room(self._height) - 2)  # its border
            for g in () if self._compact else f.gpus:
                panel = self._panels.get(g.index)
                if panel is None:
                    panel = self._panels[g.index] = GpuPanel(g.index, HISTORY_TICKS)
                    panel.wide = wide
                    self._gpus_w.mount(panel)
                    self._set_compact(self._too_many_panels(self._height))  # one more may not fit
                    continue  # filled on the next frame, once composed
                panel.show(g, f)
            side = self._main.has_class("-side")
            self._engine_w.show(f, wide, stacked=side, compact=not side and self._height < SHORT_BELOW_ROWS)
            settled = f.ended or (f.replay is not None and (f.replay.paused or f.replay.position >= f.replay.total))
            self._events_w.show(f.events, f.events_total, exact=settled)
            if self._main.has_class("-timeline"):
                self._timeline_w.show(f)
            self._render_position()
            self._show_recording_state()
        if self._rows_ahead() != self._fitted_ahead:
            # A new event's taller box (or a headline's new height), known before the layout: the charts it
            # shrinks are fitted now, so both are one relayout, not two.
            self._fit_sparks()
        self.call_after_refresh(self._fit_sparks)  # the headline, engine or events may have changed rows

    def _render_position(self) -> None:
        self._position_w.show(self.frame, self.display_paused, self.failure)

    def _show_recording_state(self) -> None:
        rec = self._rec_w
        if not self.live:
            set_text(rec, Text("replay · not recording", style="dim"), layout=True)
        elif self.recorder is not None:
            set_text(
                rec, Text(f"● REC {self.recorder.path} · {self.recorded_ticks} ticks", style="bold red"), layout=True
            )
        elif getattr(self.source, "failed", None):
            set_text(rec, Text(str(self.source.failed), style="bold red"), layout=True)
        elif getattr(getattr(self.source, "writer", None), "path", None) is not None:
            # `pcie-tui record` tees the whole session into a file inside the source
            set_text(rec, Text(f"● REC {self.source.writer.path} (whole session)", style="bold red"), layout=True)
        elif self.recorder_factory is None:
            set_text(rec, Text("not recording (no recorder)", style="dim"), layout=True)
        else:
            set_text(rec, Text("not recording · r to record", style="dim"), layout=True)

    # ---- shutdown ------------------------------------------------------------------

    def on_unmount(self) -> None:
        self._stop.set()
        self._wake.set()
        if not self.live:
            # Unblocks a paused replay's read(); a live source is closed by its worker
            # after its current read, so a collector is never closed mid-read.
            self.source.close()
        with self._rec_lock:
            if self.recorder is not None:
                self.recorder.close()
                self.saved.append((self.recorder.path, self.recorded_ticks))
                self.recorder = None


def make_app(
    source: Any,
    *,
    recorder_factory: Callable[[], Any] | None = None,
    thresholds: Thresholds | None = None,
    title: str | None = None,
    status: str | None = None,
) -> PcieTuiApp:
    """The app for ``source`` (a live collector or a ReplaySource); the CLI and tests both use this.

    ``status`` is a line saying what is attached (shown in the header). The
    caller keeps ownership of ``source`` and closes it after ``run()``; the
    app only closes a replay early, to wake a paused ``read()`` at exit.
    """
    return PcieTuiApp(source, recorder_factory=recorder_factory, thresholds=thresholds, title=title, status=status)
