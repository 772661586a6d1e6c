"""Driving the app without a terminal: for tests, screenshots and docs."""

from __future__ import annotations

import asyncio
import io
import time
from collections.abc import Callable
from dataclasses import replace
from typing import Any

from rich.console import Console
from textual.app import App
from textual.pilot import Pilot

from pcie_tui.analyze.session import SessionAnalyzer
from pcie_tui.recording.reader import Recording


def screen_text(app: App[Any]) -> str:
    """The current screen as plain text (what a user would read)."""
    width, height = app.size
    console = Console(
        width=width,
        height=height,
        file=io.StringIO(),
        force_terminal=True,
        color_system="truecolor",
        record=True,
        legacy_windows=False,
        safe_box=False,
    )
    console.print(app.screen._compositor.render_update(full=True, screen_stack=app._background_screens, simplify=True))
    return console.export_text()


async def wait_until(pilot: Pilot[Any], predicate: Callable[[], bool], timeout_s: float = 5.0) -> None:
    """Let the app run until ``predicate()`` holds; TimeoutError after ``timeout_s``."""
    end = time.monotonic() + timeout_s
    while not predicate():
        if time.monotonic() > end:
            raise TimeoutError("condition not reached in time")
        # Plain sleep: pilot.pause() forces a full repaint each call, which would load the app.
        await asyncio.sleep(0.02)
    await pilot.pause()


def frame_at(app: Any, ticks: int) -> bool:
    """True once the app has rendered the frame for exactly ``ticks`` ticks."""
    f = app.frame
    return f is not None and f.ticks == ticks


def saturated_moment(rec: Recording, resource: str = "link", phase_contains: str = "h2d", peak: bool = False) -> int:
    """Index of the tick in the middle of the first ``resource`` saturation during a matching phase.

    Found by running the analyzer, so screenshots show a real verdict, not a staged one.
    With ``peak``, the tick of that saturation whose reading of ``resource`` is highest
    (a short saturation's middle may already be easing below the enter threshold).
    """
    an = SessionAnalyzer(rec.header, keep_series=False)
    hits: list[int] = []
    util: dict[int, float] = {}
    for i, s in enumerate(rec.samples):
        an.feed(s)
        phase = an.phase or ""  # the session's one phase rule
        sat = [tr for tr in an.trackers.values() if tr.verdict == resource]
        if sat and phase_contains in phase:
            hits.append(i)
            u = sat[0].last_util
            util[i] = float(getattr(u, resource, None) or 0.0) if u is not None else 0.0
        elif hits:
            break
    if not hits:
        raise ValueError(f"no {resource} saturation during a {phase_contains!r} phase in {rec.path}")
    # Prefer a tick whose readings are all there (a void GPM window shows n/a).
    full = [
        i for i in hits if all(g.pcie_rx_Bps is not None and g.pcie_tx_Bps is not None for g in rec.samples[i].gpus)
    ]
    pick = full or hits
    if peak:
        return max(pick, key=lambda i: util[i]) + 1
    return pick[len(pick) // 2] + 1  # replay position: ticks 0..i analysed


def scaled_gpus(rec: Recording, n_gpus: int) -> Recording:
    """``rec`` (one GPU) as an ``n_gpus``-GPU recording, for screens, tests and the bench of many GPUs:
    every tick carries n GPUs, GPU i holding the real reading of tick (k + i * len / n) mod len (the
    same session seen at n moments, so the GPUs differ as on a real machine; every value a real one)."""
    g0 = rec.header.gpus[0]
    header = replace(rec.header, gpus=tuple(replace(g0, index=i, uuid=f"{g0.uuid}-{i}") for i in range(n_gpus)))
    base = list(rec.samples)
    n = len(base)
    samples = [
        replace(s, gpus=tuple(replace(base[(k + i * n // n_gpus) % n].gpus[0], index=i) for i in range(n_gpus)))
        for k, s in enumerate(base)
    ]
    return Recording(path=rec.path, header=header, samples=samples, events=list(rec.events))


def run(coro: Any) -> Any:
    return asyncio.run(coro)
