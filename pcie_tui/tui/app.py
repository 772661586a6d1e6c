"""The pcie-tui Textual app: build it with :func:`make_app` from any Source.

One thread worker reads the source, feeds the analysis (:class:`ViewModel`)
and posts at most ten :class:`FrameReady` messages a second; the UI thread
only renders frames. Replay seeks are reconciled in the worker too.
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from rich.text import Text
from textual import work
from textual.app import App, ComposeResult
from textual.binding import Binding
from textual.containers import Container, Horizontal, Vertical, VerticalScroll
from textual.message import Message
from textual.widgets import Footer, Static
from textual.worker import get_current_worker

from pcie_tui.analyze.verdict import Thresholds
from pcie_tui.tui.engine_panel import EnginePanel
from pcie_tui.tui.events import EventsPane
from pcie_tui.tui.screens import SourcesScreen
from pcie_tui.tui.state import HISTORY_TICKS, Frame, ViewModel
from pcie_tui.tui.widgets import GpuPanel, HeadlineBar, PositionBar, header_text, set_text

# Frames to the UI at most this often (~3 Hz, a human rate; every tick still reaches the history
# and the verdicts, and peaks between frames are kept). Slack so 100 ms ticks are not skipped by jitter.
FRAME_MIN_INTERVAL_S = 0.33
SEEK_STEP_S = 5.0
WIDE_AT_COLUMNS = 120
SIDE_BY_SIDE_AT_COLUMNS = 160  # GPU panels and the engine panel in two columns (with an engine)
TALL_AT_ROWS = 40
REPLAY_ACTIONS = {"seek", "seek_home", "seek_end", "speed"}
# Replay speeds `-` and `+` step through (so 1x is always one key away).
SPEEDS = (0.25, 0.5, 1.0, 2.0, 4.0, 8.0, 16.0, 32.0, 64.0)


def next_speed(current: float, step: int) -> float:
    """The speed ``step`` places along SPEEDS from ``current`` (an off-list speed snaps to its neighbour)."""
    if step > 0:
        return next((v for v in SPEEDS if v > current + 1e-9), SPEEDS[-1])
    return next((v for v in reversed(SPEEDS) if v < current - 1e-9), SPEEDS[0])


def tick_near(samples: Any, t: float) -> int:
    """Index of the tick whose time is nearest ``t`` (the earlier one on a tie)."""
    lo, hi = 0, len(samples)
    while lo < hi:
        mid = (lo + hi) // 2
        if samples[mid].t < t:
            lo = mid + 1
        else:
            hi = mid
    if lo >= len(samples):
        return len(samples) - 1
    if lo > 0 and t - samples[lo - 1].t <= samples[lo].t - t:
        return lo - 1
    return lo


class FrameReady(Message):
    """A new frame from the worker thread."""

    def __init__(self, frame: Frame) -> None:
        super().__init__()
        self.frame = frame


class SourceFailed(Message):
    def __init__(self, error: str) -> None:
        super().__init__()
        self.error = error


class RecordingFailed(Message):
    def __init__(self, error: str) -> None:
        super().__init__()
        self.error = error


class PcieTuiApp(App[None]):
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
        self.model = ViewModel(source.header, thresholds)
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
        self._position_w = PositionBar(self.live)
        with Horizontal(id="header"):
            yield Static(header_text(self.source.header, self._source_label(), self.title), id="title")
            yield self._rec_w
        yield self._headline_w
        with Container(id="panels"):  # stacked; side by side on wide screens (-side)
            with self._gpus_w:
                for info in self.source.header.gpus:
                    panel = GpuPanel(info.index, HISTORY_TICKS)
                    self._panels[info.index] = panel
                    yield panel
                if not self.source.header.gpus:
                    why = self.source.header.extra.get("gpu_unavailable")
                    text = f"GPU side unavailable: {why}" if why else "no GPU readings in this source (engine only)"
                    yield Static(Text(text, style="dim"), id="no-gpus")
            yield self._engine_w
        with Vertical(id="lower"):  # the room left: the events box takes what its rows need
            yield self._events_w
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
        self._apply_size(self.size.width, self.size.height)
        self._show_recording_state()
        self._pump()

    def on_resize(self, event: Any) -> None:
        self._apply_size(event.size.width, event.size.height)

    def _apply_size(self, width: int, height: int) -> None:
        wide, tall = width >= WIDE_AT_COLUMNS, height >= TALL_AT_ROWS
        self._main.set_class(wide, "-wide")
        self._main.set_class(tall, "-tall")
        self._main.set_class(width >= SIDE_BY_SIDE_AT_COLUMNS and self._has_engine, "-side")
        for p in self._panels.values():
            p.wide = wide
        if self.frame is not None:
            self._render(self.frame)

    # ---- the worker ---------------------------------------------------------

    @work(thread=True, exclusive=True, group="source", name="source reader")
    def _pump(self) -> None:
        """Read ticks, analyse them, hand frames to the UI at <= 10 Hz."""
        worker = get_current_worker()
        src = self.source
        last_post = 0.0
        try:
            if not self.live:
                # Start the replay clock now, not when the source was built: a slow start
                # would otherwise be "caught up" in one burst of ticks that no frame shows.
                src.set_paused(src.paused)
                with self._model_lock:
                    self.model.sync_replay(src, None)
                    self._post_frame()
                last_post = time.monotonic()
            while not worker.is_cancelled and not self._stop.is_set():
                try:
                    s = src.read()
                except Exception as e:  # a collector failing must not take the screen down
                    self.post_message(SourceFailed(str(e) or type(e).__name__))
                    return
                if self._stop.is_set():
                    return
                if s is None:
                    if self.live:
                        with self._model_lock:
                            self._post_frame(ended=True)
                        return
                    with self._model_lock:
                        self.model.sync_replay(src, None)
                        self._post_frame()
                    self._wait_for_seek()
                    continue
                self._record(s)
                with self._model_lock:
                    if self.live:
                        self.model.feed(s)
                        jumped = False
                    else:
                        jumped = self.model.sync_replay(src, s)
                    now = time.monotonic()
                    if jumped or now - last_post >= FRAME_MIN_INTERVAL_S:
                        self._post_frame()
                        last_post = now
        finally:
            self._drained.set()

    def _wait_for_seek(self) -> None:
        """At the end of a replay: idle until the user seeks back (or quits)."""
        gen = self.source.generation
        while not self._stop.is_set() and self.source.generation == gen:
            self._wake.wait(0.2)
            self._wake.clear()

    def _post_frame(self, ended: bool = False) -> None:
        """Build a frame (caller holds the model lock) and hand it to the UI."""
        replay = None if self.live else self.model.replay_view(self.source)
        self.post_message(FrameReady(self.model.frame(replay, ended=ended)))

    @work(thread=True, exclusive=True, group="resync", name="replay resync")
    def _resync(self) -> None:
        """After a control key: catch the analysis up with the replay and post a frame."""
        with self._model_lock:
            self.model.sync_replay(self.source, None)
            self._post_frame()

    def _record(self, s: Any) -> None:
        # A live source queues non-tick events (engine gap markers) for recordings; drain them
        # every tick so they neither pile up nor land in a recording started later.
        drain = getattr(self.source, "drain_events", None)
        events = drain() if drain is not None else []
        with self._rec_lock:
            rec = self.recorder
            if rec is None:
                return
            try:
                rec.write(s)
                self.recorded_ticks += 1
                write_event = getattr(rec, "write_event", None)
                if write_event is not None:
                    for ev in events:
                        ev = dict(ev)
                        write_event(ev.pop("event", "event"), ev.pop("t", s.t), **ev)
            except Exception as e:
                self.recorder = None
                self.post_message(RecordingFailed(str(e) or type(e).__name__))
                with contextlib.suppress(Exception):
                    rec.close()

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
            self._apply_size(self.size.width, self.size.height)
            return  # _apply_size rendered this frame
        with self.batch_update():
            self._headline_w.show(f.headline)
            for g in f.gpus:
                panel = self._panels.get(g.index)
                if panel is None:
                    panel = self._panels[g.index] = GpuPanel(g.index, HISTORY_TICKS)
                    panel.wide = wide
                    self._gpus_w.mount(panel)
                    continue  # filled on the next frame, once composed
                panel.show(g, f)
            self._engine_w.show(f, wide, stacked=self._main.has_class("-side"))
            self._events_w.show(f.events, f.events_total)
            self._render_position()
            self._show_recording_state()

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
        elif getattr(getattr(self.source, "writer", None), "path", None) is not None:
            # `pcie-tui record` tees the whole session into a file inside the source
            set_text(rec, Text(f"● REC {self.source.writer.path} (whole session)", style="bold red"), layout=True)
        elif self.recorder_factory is None:
            set_text(rec, Text("not recording (no recorder)", style="dim"), layout=True)
        else:
            set_text(rec, Text("not recording · r to record", style="dim"), layout=True)

    # ---- actions -----------------------------------------------------------------

    def check_action(self, action: str, parameters: tuple[object, ...]) -> bool | None:
        if action in REPLAY_ACTIONS and self.live:
            return False
        return not (action == "toggle_record" and (not self.live or self.recorder_factory is None))

    def action_toggle_pause(self) -> None:
        if self.live:
            self.display_paused = not self.display_paused
            if not self.display_paused and self.frame is not None:
                self._render(self.frame)
            else:
                self._render_position()
            return
        self.source.set_paused(not self.source.paused)
        self._resync()

    def action_seek(self, delta_s: float) -> None:
        """Move the shown tick to the one nearest its time + ``delta_s`` (so +5 then -5 comes back)."""
        src = self.source
        samples = src.samples
        shown = src.position - 1  # the tick on screen; -1 before the first
        t = (samples[shown].t if shown >= 0 else samples[0].t) + float(delta_s)
        if shown < 0 and delta_s <= 0:
            self._seek_to(0)
            return
        self._seek_to(tick_near(samples, t) + 1)

    def action_seek_home(self) -> None:
        self._seek_to(0)

    def action_seek_end(self) -> None:
        """Play the last tick and stop there, even in a looping demo (any other seek resumes looping)."""
        if self.source.loop:
            self._loop_held = True
            self.source.loop = False
        self.source.seek_to_index(len(self.source.samples) - 1)
        self._after_seek()

    def _seek_to(self, position: int) -> None:
        if self._loop_held:
            self.source.loop = True
            self._loop_held = False
        self.source.seek_to_index(position)
        self._after_seek()

    def _after_seek(self) -> None:
        self._wake.set()
        self._resync()

    def action_speed(self, step: int) -> None:
        self.source.set_speed(next_speed(float(self.source.speed), int(step)))
        self._resync()

    def action_toggle_record(self) -> None:
        if not self.live or self.recorder_factory is None:
            self.notify("recording needs a live source and a recorder", severity="warning")
            return
        with self._rec_lock:
            rec = self.recorder
            if rec is None:
                try:
                    self.recorder = self.recorder_factory()
                    self.recorded_ticks = 0
                except Exception as e:
                    self.notify(f"cannot record: {e}", severity="error")
            else:
                self.recorder = None
                rec.close()
                self.saved.append((rec.path, self.recorded_ticks))
                self.notify(f"recording saved: {rec.path} ({self.recorded_ticks} ticks)")
        self._show_recording_state()

    def action_sources(self) -> None:
        if isinstance(self.screen, SourcesScreen):
            self.pop_screen()
        else:
            f = self.frame
            self.push_screen(SourcesScreen(self.source.header, f.engine if f else None, f.engine_stats if f else None))

    def action_scroll_gpus(self, lines: int) -> None:
        self._gpus_w.scroll_relative(y=int(lines), animate=False)

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
