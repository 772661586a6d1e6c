"""The app's reader thread: ticks from the source into the analysis, frames out to the UI.

:class:`SourceWorker` is mixed into :class:`pcie_tui.tui.app.PcieTuiApp`. One
thread worker reads the source, feeds the :class:`ViewModel` under the model
lock, tees ticks into a recording the user started, and posts a
:class:`FrameReady` at most every ``FRAME_MIN_INTERVAL_S``; replay seeks are
reconciled here too. The UI thread only renders what these messages carry.
"""

from __future__ import annotations

import contextlib
import threading
import time
from typing import TYPE_CHECKING, Any

from textual import work
from textual.message import Message
from textual.worker import get_current_worker

from pcie_tui.tui.frame import Frame
from pcie_tui.tui.state import ViewModel

if TYPE_CHECKING:  # what the mixin is mixed into: the app, whose message queue the frames go to
    from textual.app import App

    AppBase = App[None]
else:
    AppBase = object

# Frames to the UI at most this often (2 Hz, the rate of nvitop and btop; every tick still reaches the
# history and the verdicts, peaks between frames are kept, and a key press gets its frame at once).
# Drawing is most of the screen's CPU: 3 Hz cost a third more (bench/results.md, issue 22).
FRAME_MIN_INTERVAL_S = 0.5


class FrameReady(Message):
    """A new frame from the worker thread."""

    def __init__(self, frame: Frame) -> None:
        super().__init__()
        self.frame = frame


class SourceFailed(Message):
    def __init__(self, error: str) -> None:
        super().__init__()
        self.error = error


class SourceFault(Message):
    """Something the live session watches went away (a GPU, NVML, the engine, the clock): it goes on."""

    def __init__(self, message: str) -> None:
        super().__init__()
        self.message = message


class RecordingFailed(Message):
    def __init__(self, error: str) -> None:
        super().__init__()
        self.error = error


class SourceWorker(AppBase):
    """The reader-thread half of the app (a mixin: the attributes below are the app's, set in its __init__)."""

    source: Any
    live: bool
    model: ViewModel
    recorder: Any
    recorded_ticks: int
    _model_lock: threading.Lock
    _rec_lock: threading.Lock
    _stop: threading.Event
    _wake: threading.Event
    _drained: threading.Event

    @work(thread=True, exclusive=True, group="source", name="source reader")
    def _pump(self) -> None:
        """Read ticks, analyse them, hand frames to the UI at most every FRAME_MIN_INTERVAL_S."""
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
                        # From the end of the build: a slow build (a loaded machine) never brings
                        # the next frame closer than the interval, and the gap stays idle time.
                        last_post = time.monotonic()
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
        if events:
            with self._model_lock:
                self.model.note_events(events)
        src = self.source
        faults = getattr(src, "faults", None) or getattr(getattr(src, "source", None), "faults", None)
        for f in faults.drain() if faults is not None else ():
            self.post_message(SourceFault(f.message))
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
