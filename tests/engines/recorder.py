"""Record engine ticks the way ``pcie-tui record`` does (no GPU here: the GPU list is empty)."""

from __future__ import annotations

import socket
import threading
import time
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from pcie_tui import __version__
from pcie_tui.core.model import Sample, SessionHeader
from pcie_tui.engines.poller import EnginePoller
from pcie_tui.recording.writer import RecordingWriter


class Recorder:
    """A thread writing one tick every ``interval_s`` plus the poller's events, to ``path``."""

    def __init__(self, poller: EnginePoller, path: Path, interval_s: float = 0.25, extra: dict[str, Any] | None = None):
        self.poller = poller
        self.path = path
        self.interval_s = interval_s
        header = SessionHeader(
            created=datetime.now(timezone.utc).isoformat(timespec="seconds"),
            host=socket.gethostname(),
            tool_version=__version__,
            gpus=(),
            engine=poller.describe(),
            interval_s=interval_s,
            extra=dict(extra or {}),
        )
        self.writer = RecordingWriter(path, header)
        self.ticks: list[Sample] = []
        self.tick_s: list[float] = []  # how long each tick took to build (must never wait on HTTP)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        nxt = time.monotonic()
        while not self._stop.is_set():
            t = time.time()
            t0 = time.perf_counter()
            eng = self.poller.sample_for_tick(t, (), ())
            self.tick_s.append(time.perf_counter() - t0)
            s = Sample(t=t, gpus=(), engine=eng)
            self.writer.write(s)
            self.ticks.append(s)
            for ev in self.poller.drain_events():
                self.writer.write_event(ev.pop("event"), ev.pop("t", t), **ev)
            nxt += self.interval_s
            self._stop.wait(max(0.0, nxt - time.monotonic()))

    def start(self) -> Recorder:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=5)
        self.writer.close()
