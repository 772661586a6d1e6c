"""The live Source: GPU collector plus an optional engine poller, paced to an interval."""

from __future__ import annotations

import dataclasses
import socket
import time
from datetime import datetime, timezone
from typing import Any, Protocol

from pcie_tui import __version__
from pcie_tui.core.model import GpuInfo, GpuSample, Sample, SessionHeader
from pcie_tui.sources.faults import FaultWatch, SessionClock


class GpuCollector(Protocol):
    def gpu_infos(self) -> tuple[GpuInfo, ...]: ...
    def read(self) -> tuple[GpuSample, ...]: ...
    def running_pids(self) -> dict[int, list[int]]: ...
    def close(self) -> None: ...


class EngineFeed(Protocol):
    def describe(self) -> dict[str, Any]: ...
    def sample_for_tick(self, t: float, gpu_samples: Any, gpu_infos: Any) -> Any: ...
    def drain_events(self) -> list[dict[str, Any]]: ...
    def stop(self) -> None: ...


def apply_calibration(infos: tuple[GpuInfo, ...]) -> tuple[GpuInfo, ...]:
    """Put a stored calibrated ceiling into each GPU's LinkInfo when it still applies."""
    from pcie_tui.core.calibration import lookup, lookup_pageable

    out = []
    for g in infos:
        mg, mw = g.link.max_gen, g.link.max_width
        measured = lookup(g.uuid, g.link.gen, g.link.width, max_gen=mg, max_width=mw)
        if measured is not None:
            pageable = lookup_pageable(g.uuid, g.link.gen, g.link.width, max_gen=mg, max_width=mw)
            g = dataclasses.replace(
                g, link=dataclasses.replace(g.link, measured_Bps=measured, measured_pageable_Bps=pageable)
            )
        out.append(g)
    return tuple(out)


class LiveSource:
    """Reads every ``interval_s``; the engine is scraped in its own thread, never waited on."""

    live = True

    def __init__(
        self,
        gpus: GpuCollector | None,
        engine: EngineFeed | None = None,
        interval_s: float = 0.1,
        calibrate: bool = True,
        extra_header: dict[str, Any] | None = None,
    ) -> None:
        self.gpus = gpus
        self.engine = engine
        self.interval_s = interval_s
        infos = gpus.gpu_infos() if gpus is not None else ()
        self.infos = apply_calibration(infos) if calibrate else infos
        self.header = SessionHeader(
            created=datetime.now(timezone.utc).isoformat(timespec="seconds"),
            host=socket.gethostname(),
            tool_version=__version__,
            gpus=self.infos,
            engine=engine.describe() if engine is not None else None,
            interval_s=interval_s,
            extra=dict(extra_header or {}),
        )
        self._next = time.monotonic()
        self._gpus_checked = float("-inf")
        self._closed = False
        self.pending_events: list[dict[str, Any]] = []
        self.clock = SessionClock()
        self.faults = FaultWatch()  # GPUs, NVML, the engine and the clock going away mid-session

    def read(self) -> Sample | None:
        if self._closed:
            return None
        now = time.monotonic()
        if self._next > now:
            time.sleep(self._next - now)
        # Keep the cadence; if a tick overran, start the next one from now.
        self._next = max(self._next + self.interval_s, time.monotonic())
        t, jump = self.clock.now()
        if jump is not None:
            self.pending_events.append(self.faults.clock(t, jump))
        gpu_samples = self.gpus.read() if self.gpus is not None else ()
        lost = getattr(self.gpus, "not_answering", None)
        if lost is not None:
            self.pending_events.extend(self.faults.gpus(t, lost(), len(self.infos)))
        eng = None
        if self.engine is not None:
            if self.gpus is not None and hasattr(self.engine, "update_gpus") and now - self._gpus_checked >= 5.0:
                # Which GPUs the engine's processes hold (NVML), so "loading" looks at its GPUs only.
                self._gpus_checked = now
                self.engine.update_gpus(self.gpus.running_pids())
            # The engine's poller and log timestamps run on the wall clock: asked at the wall time.
            eng = self.engine.sample_for_tick(t + self.clock.shift, gpu_samples, self.infos)
            events = self.engine.drain_events()
            self.faults.engine(events)
            self.pending_events.extend(events)
        return Sample(t=t, gpus=tuple(gpu_samples), engine=eng)

    def drain_events(self) -> list[dict[str, Any]]:
        ev, self.pending_events = self.pending_events, []
        return ev

    def close(self) -> None:
        self._closed = True
        if self.engine is not None:
            self.engine.stop()
        if self.gpus is not None:
            self.gpus.close()
