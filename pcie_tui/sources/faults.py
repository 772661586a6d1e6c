"""Faults of a live session that end nothing (issue 25): a GPU that stops answering, NVML going away, the
engine crashing or being replaced, the wall clock jumping. Each becomes an event line in the recording
(when it happened, in plain words) and one line for the user, the session goes on watching what it still
can, and the command ends with the documented exit code of the first fault (README, "Exit codes").

The session's clock: ticks are stamped with the wall clock, so that they line up with the engine's own
log timestamps; a step of the wall clock against the monotonic clock larger than :data:`CLOCK_JUMP_S`
between two ticks (an NTP step, a suspend, someone setting the date) is a jump: from then on ticks are
stamped ``wall - shift`` so the recording's time neither goes back nor leaps, and the event says by how
much the wall clock moved (the engine's own timestamps after it are off by that much).
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from datetime import datetime, timezone
from typing import Any

CLOCK_JUMP_S = 2.0
# One documented exit code per cause (README "Exit codes"); 4 is the recording's own output failure.
EXIT_CODES = {"gpu_lost": 5, "nvml_lost": 5, "engine_lost": 6, "clock_jump": 7}
FAULT_EVENTS = ("gpu_lost", "gpu_back", "nvml_lost", "engine_lost", "engine_replaced", "clock_jump")


@dataclass(frozen=True)
class Fault:
    kind: str
    t: float
    message: str  # one line, plain words

    @property
    def exit_code(self) -> int | None:
        return EXIT_CODES.get(self.kind)


def _clock(t: float) -> str:
    return datetime.fromtimestamp(t, timezone.utc).strftime("%H:%M:%S UTC")


class SessionClock:
    """Wall-clock tick times that never step (see the module's docstring)."""

    def __init__(self, wall: Any = time.time, mono: Any = time.monotonic) -> None:
        self._wall, self._mono = wall, mono
        self._off = wall() - mono()  # the wall clock's lead over the monotonic one, as last seen
        self.shift = 0.0  # the jumps so far, taken off the wall clock

    def now(self) -> tuple[float, dict[str, Any] | None]:
        """(the tick's time, a clock_jump event or None)."""
        wall, mono = self._wall(), self._mono()
        off = wall - mono
        step, self._off = off - self._off, off  # slow drift (NTP slewing) is followed, a step is a jump
        event = None
        if abs(step) > CLOCK_JUMP_S:
            self.shift += step
            event = {"event": "clock_jump", "jump_s": step, "wall": wall}
        return wall - self.shift, event


class FaultWatch:
    """Turns what a tick saw into fault events and messages, each once."""

    def __init__(self) -> None:
        self.faults: list[Fault] = []
        self._new: list[Fault] = []
        self._lost: dict[int, str] = {}

    def gpus(self, t: float, not_answering: dict[int, str], n_gpus: int) -> list[dict[str, Any]]:
        """Events for GPUs that stopped (or started again) answering this tick."""
        events: list[dict[str, Any]] = []
        if not_answering and len(not_answering) == n_gpus and len(set(not_answering.values())) == 1 and n_gpus > 1:
            why = next(iter(not_answering.values()))
            if not self._lost:
                self._add("nvml_lost", t, f"every GPU stopped answering at {_clock(t)}: {why}")
                events.append({"event": "nvml_lost", "t": t, "reason": why, "gpus": sorted(not_answering)})
            self._lost.update(not_answering)
            return events
        for idx, why in sorted(not_answering.items()):
            if idx not in self._lost:
                self._lost[idx] = why
                self._add("gpu_lost", t, f"GPU {idx} stopped answering at {_clock(t)}: {why}")
                events.append({"event": "gpu_lost", "t": t, "gpu": idx, "reason": why})
        for idx in sorted(set(self._lost) - set(not_answering)):
            del self._lost[idx]
            self._add("gpu_back", t, f"GPU {idx} answers again since {_clock(t)}")
            events.append({"event": "gpu_back", "t": t, "gpu": idx})
        return events

    def engine(self, events: list[dict[str, Any]]) -> None:
        """The engine poller's own events (engine_down, engine_reattach) as faults."""
        for e in events:
            kind, t = e.get("event"), float(e.get("t") or time.time())
            if kind == "engine_down" and e.get("pid_alive") is False:
                pid = e.get("pid")
                self._add("engine_lost", t, f"the engine (pid {pid}) exited at {_clock(t)}; still watching the GPUs")
            elif kind == "engine_down":
                why = e.get("reason") or "no answer"
                self._add("engine_lost", t, f"the engine stopped answering at {_clock(t)} ({why}); still watching")
            elif kind == "engine_reattach":
                self._add(
                    "engine_replaced",
                    t,
                    f"a new engine process (pid {e.get('new_pid')}) took the old one's place at {_clock(t)}; watching it",
                )

    def clock(self, t: float, event: dict[str, Any]) -> dict[str, Any]:
        jump = float(event["jump_s"])
        way = "forward" if jump > 0 else "back"
        self._add(
            "clock_jump",
            t,
            f"the system clock jumped {way} by {abs(jump):.1f} s at {_clock(t)}; the recording's time runs on "
            f"without the jump (the engine's own timestamps after it are {jump:+.1f} s off)",
        )
        return {**event, "t": t}

    def _add(self, kind: str, t: float, message: str) -> None:
        f = Fault(kind, t, message)
        self.faults.append(f)
        self._new.append(f)

    def drain(self) -> list[Fault]:
        """Faults since the last drain (for the one-line messages)."""
        out, self._new = self._new, []
        return out

    def exit_code(self) -> int:
        """The first fault's documented code; 0 when none happened (a GPU back or a new engine is not one)."""
        return next((c for f in self.faults if (c := f.exit_code) is not None), 0)

    def summary(self) -> list[dict[str, Any]]:
        return [{"kind": f.kind, "t": f.t, "message": f.message} for f in self.faults]


def fault_words(e: dict[str, Any]) -> str | None:
    """A recorded fault event in the words the live session said it (None: not a fault event)."""
    kind, t = e.get("event"), e.get("t")
    at = _clock(float(t)) if isinstance(t, int | float) else "?"
    if kind == "gpu_lost":
        return f"GPU {e.get('gpu')} stopped answering at {at}: {e.get('reason')}"
    if kind == "gpu_back":
        return f"GPU {e.get('gpu')} answered again at {at}"
    if kind == "nvml_lost":
        return f"every GPU stopped answering at {at}: {e.get('reason')}"
    if kind == "engine_down":
        gone = " (its process exited)" if e.get("pid_alive") is False else ""
        return f"the engine stopped answering at {at}{gone}: {e.get('reason')}"
    if kind == "engine_reattach":
        return f"a new engine process (pid {e.get('new_pid')}) took the old one's ({e.get('old_pid')}) place at {at}"
    if kind == "clock_jump" and isinstance(e.get("jump_s"), int | float):
        return f"the system clock jumped {e['jump_s']:+.1f} s at {at} (the recording's time runs on without it)"
    if kind == "recording_stopped":
        return f"the recording stopped at {at}: {e.get('reason')}"
    return None
