"""Replay a recording as a Source, paced in recorded time, with speed and seek."""

from __future__ import annotations

import threading
import time

from pcie_tui.core.model import Sample
from pcie_tui.recording.reader import Recording


class ReplaySource:
    """Plays a loaded recording at ``speed`` x real time.

    ``read`` blocks until the next tick is due. ``seek`` and ``set_speed`` may
    be called from another thread; ``position`` is the index of the next tick.
    """

    live = False

    def __init__(self, recording: Recording, speed: float = 1.0, loop: bool = False) -> None:
        if not recording.samples:
            from pcie_tui.core.errors import UserError

            raise UserError(f"{recording.path} holds no ticks to replay")
        self.recording = recording
        self.header = recording.header
        self.samples = recording.samples
        self.speed = speed
        self.loop = loop
        self.position = 0
        self.paused = False
        self._lock = threading.Lock()
        self._wake = threading.Event()
        self._closed = False
        # Wall clock at which recorded time ``_anchor_t`` is (re)anchored.
        self._anchor_wall = time.monotonic()
        self._anchor_t = self.samples[0].t
        self.generation = 0  # bumps on every seek so consumers can rebuild state
        # Holes in the recording (a later segment, a stop of the recorder) play as one step, not in real time.
        self._gaps = getattr(recording, "gaps", ()) or ()
        self._hole_ends = {float(g["end"]) for g in self._gaps}
        # A recording still being read (open_progressively): the replay waits at the end of what is read.
        self.loading = getattr(recording, "loading", None)

    def loading_text(self) -> str | None:
        """'loading 37 % of 200 MB' while the recording is still being read, else None."""
        return self.loading.text() if self.loading is not None else None

    def _still_loading(self) -> bool:
        ld = self.loading
        if len(self._gaps) != len(self._hole_ends):  # gaps found since (a list the reader extends)
            self._hole_ends = {float(g["end"]) for g in list(self._gaps)}
        return ld is not None and not ld.done

    @property
    def start_t(self) -> float:
        return self.samples[0].t

    @property
    def end_t(self) -> float:
        return self.samples[-1].t

    @property
    def current_t(self) -> float:
        i = min(self.position, len(self.samples) - 1)
        return self.samples[max(i - 1, 0)].t if self.position else self.start_t

    def _reanchor(self) -> None:
        i = min(self.position, len(self.samples) - 1)
        self._anchor_t = self.samples[i].t
        self._anchor_wall = time.monotonic()

    def _reanchor_at_end(self) -> None:
        """Waiting for the reader: the next tick plays when it arrives, not at once in a burst."""
        self._anchor_t = self.samples[-1].t
        self._anchor_wall = time.monotonic()

    def set_speed(self, speed: float) -> None:
        with self._lock:
            self.speed = max(0.05, min(speed, 1000.0))
            self._reanchor()
        self._wake.set()

    def set_paused(self, paused: bool) -> None:
        with self._lock:
            self.paused = paused
            self._reanchor()
        self._wake.set()

    def seek_to_index(self, index: int) -> None:
        with self._lock:
            self.position = max(0, min(index, len(self.samples) - 1))
            self.generation += 1
            self._reanchor()
        self._wake.set()

    def seek(self, delta_s: float) -> None:
        """Move by ``delta_s`` recorded seconds (negative = back)."""
        target = self.current_t + delta_s
        lo, hi = 0, len(self.samples)
        while lo < hi:
            mid = (lo + hi) // 2
            if self.samples[mid].t < target:
                lo = mid + 1
            else:
                hi = mid
        self.seek_to_index(lo)

    def read(self) -> Sample | None:
        if self.loading is not None and self.position > 0:
            self.loading.go.set()  # the first tick is out (and drawn): read the rest of the file now
        while not self._closed:
            with self._lock:
                behind = self.position >= len(self.samples) and self._still_loading()
                if behind:  # played all that is read so far: wait for the reader
                    self._reanchor_at_end()
            if behind:
                self._wake.wait(0.05)
                self._wake.clear()
                continue
            with self._lock:
                if self.position >= len(self.samples):
                    if not self.loop:
                        return None
                    self.position = 0
                    self.generation += 1
                    self._reanchor()
                s = self.samples[self.position]
                if self.paused:
                    wait = 0.2
                else:
                    if s.t in self._hole_ends and self._anchor_t < s.t and self.position:
                        step = min(self.header.interval_s or 0.1, 1.0)
                        self._anchor_t, self._anchor_wall = s.t, time.monotonic() + step / self.speed
                    due = self._anchor_wall + (s.t - self._anchor_t) / self.speed
                    wait = due - time.monotonic()
                    if wait <= 0:
                        self.position += 1
                        return s
            self._wake.wait(min(wait, 0.2))
            self._wake.clear()
        return None

    def close(self) -> None:
        self._closed = True
        self._wake.set()
