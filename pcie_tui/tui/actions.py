"""The app's key actions: pause, seek, speed, record, the sources screen, scrolling.

:class:`KeyActions` is mixed into :class:`pcie_tui.tui.app.PcieTuiApp`, whose
``BINDINGS`` map keys to these ``action_*`` methods. Replay-only actions are
refused on a live source (:meth:`KeyActions.check_action`).
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from pcie_tui.tui.frame import Frame
from pcie_tui.tui.screens import AnswerScreen, SourcesScreen, sources_renderable

if TYPE_CHECKING:  # what the mixin is mixed into: the app's screens, notify and message queue
    from textual.app import App
    from textual.worker import Worker

    AppBase = App[None]
else:
    AppBase = object

SEEK_STEP_S = 5.0
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


class KeyActions(AppBase):
    """The key actions (a mixin: the attributes below are the app's, set in its __init__ and compose)."""

    source: Any
    live: bool
    recorder_factory: Callable[[], Any] | None
    recorder: Any
    recorded_ticks: int
    saved: list[tuple[Any, int]]
    frame: Frame | None
    display_paused: bool
    _rec_lock: threading.Lock
    _wake: threading.Event
    _loop_held: bool
    _gpus_w: Any
    _gpu_rows: Any
    _events_w: Any
    _compact: bool
    # The app's methods (PcieTuiApp's and SourceWorker's) these actions call.
    _render: Callable[[Frame], None]
    _render_position: Callable[[], None]
    _show_recording_state: Callable[[], None]
    _resync: Callable[[], Worker[None]]

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
                if self.frame is not None:  # the frozen screen's events with their figures of that frame
                    self._events_w.show(self.frame.events, self.frame.events_total, exact=True)
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
            header = self.source.header
            if f is None:  # no tick read yet: no figure has a reading
                text = sources_renderable(header, figures={})
            else:
                text = sources_renderable(
                    header, f.engine, f.engine_stats, f.figures, f.figures_whole, f.engine_figures
                )
            self.push_screen(SourcesScreen(text))

    def action_answer(self) -> None:
        """The findings of the one analysis (what `report` prints under "What held each phase back")."""
        if isinstance(self.screen, AnswerScreen):
            self.pop_screen()
        else:
            self.push_screen(AnswerScreen(self.frame))

    def action_scroll_gpus(self, lines: int) -> None:
        if self._compact:  # one line per GPU: the lines that did not fit come up
            self._gpu_rows.scroll_by(int(lines))
            return
        self._gpus_w.scroll_relative(y=int(lines), animate=False)
