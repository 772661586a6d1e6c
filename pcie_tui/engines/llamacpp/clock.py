"""Each llama-server request's timeline as its client lives it: wait, slot housekeeping, prefill, decode.

llama-server's own timings (``prompt eval time``) start when a slot's first prompt tokens enter a batch:
they leave out the wait for a free slot (``llamacpp:requests_deferred``), the prompt-cache work done
when a slot is handed over (saving the last prompt's KV to host RAM, loading a cached one: seconds on
a slow link) and the wait for room in a batch that other slots' prompts fill. A client waits for all
of them. The server log (b11434: timestamps on by default) says when each step happened:

* ``slot get_availabl: id  0 | task -1 | selected slot by LRU, ...``: the task has a slot (t_select);
* ``slot launch_slot_: id  0 | task 14 | processing task, ...``: its prompt-cache work is done (t_launch);
* ``slot print_timing: id  0 | task 14 | prompt eval time = ... / eval time = ... / total time = ...``
  and ``slot      release: ...``: it ended (t_end); its first token came ``eval time`` before the end.

The arrival of a request that had to wait for a slot is not in the log: it is counted from
``llamacpp:requests_deferred`` (read at the scrape interval) plus the requests launched so far, first in
first out, and placed at the middle of the scrape interval that first counted it. A request that found
a slot free (no request waiting before and after) waited nothing. A request waiting in the server's
queue while its main loop was busy with a batch, and not yet counted as deferred, is not seen: the
figures are then a little low, and say so in their source.

Pure: fed lines with the wall time they were read and deferred-gauge readings with the wall time they
were answered. No prompt or completion text is kept.
"""

from __future__ import annotations

import bisect
import re
from collections import deque
from dataclasses import dataclass
from typing import Any

_ANSI = re.compile(r"\x1b\[[0-9;]*[A-Za-z]")
# b11434 prefix "M.SS.mmm.uuu L " (minutes, seconds, ms, us since the log began; L: I/W/E/D).
_STAMP = re.compile(r"^\s*(\d+)\.(\d{2})\.(\d{3})\.(\d{3})\s+[A-Z]\s")
_SLOT = re.compile(r"slot\s+(?P<fn>\w+):\s*id\s+(?P<slot>-?\d+)\s*\|\s*task\s+(?P<task>-?\d+)\s*\|\s*(?P<msg>.*)$")

_FORGET_S = 3600.0  # a request still open this long after a newer one started was lost from the log
_TURN_S = 0.05
_BLOCKED_S = 0.05  # a gauge answered this long after it was asked waited for a batch  # a server loop turn after a batch: a request taken this soon after a prefill ended waited for it
SOURCE_STAMPED = "llama-server log timestamps; slot wait from llamacpp:requests_deferred at the scrape interval"
SOURCE_CONN = "llama-server log timestamps; arrival from the client's TCP connection, seen at the scrape interval"
_CONN_KEEP_S = 600.0  # a connection seen this long ago that no request claimed is forgotten
SOURCE_READ_TIME = "llama-server log lines timed when read (no timestamps in the log); slot wait from requests_deferred"


@dataclass
class _Task:
    slot: int
    t_select: float | None  # server time, seconds
    t_launch: float
    index: int  # launch order
    t_end: float | None = None
    t_first: float | None = None
    prefill_s: float | None = None


def log_stamp_s(line: str) -> float | None:
    """Seconds since the log began from a b11434 line prefix (``0.01.380.162 I slot ...``), else None."""
    m = _STAMP.match(line)
    if m is None:
        return None
    mins, secs, ms, us = (int(g) for g in m.groups())
    return mins * 60 + secs + ms / 1e3 + us / 1e6


class RequestClock:
    """Timelines of llama-server requests from its log and its deferred gauge (see the module doc)."""

    def __init__(self) -> None:
        self._offset: float | None = (
            None  # wall time - log stamp (smallest seen: lines are read after they are written)
        )
        self._stamped: bool | None = None
        self._selected: dict[int, float] = {}  # slot -> server time its next task was given it
        self._tasks: dict[int, _Task] = {}
        self._launch_times: list[float] = []  # server time of each launch, in launch order
        self._arrivals: dict[int, float] = {}  # launch index (FIFO: arrival order) -> when it arrived, if it waited
        self._gauge: deque[tuple[float, float, float | None]] = deque()  # (sent, answered, deferred) not placed
        self._last_gauge: tuple[float, float, float] | None = None  # (sent, answered, deferred), server time
        self._since = float("-inf")  # the earliest a request first counted by the next reading can have arrived
        self._counted = 0  # requests counted as arrived so far
        # Placed gauge readings: when each was answered, whether it waited for a batch (and since when
        # the loop could have been blocked), and when unanswered ones were asked. Bounded: a few minutes.
        self._gauge_times: deque[float] = deque(maxlen=4096)
        self._gauge_blocked: deque[tuple[bool, float]] = deque(maxlen=4096)
        self._unanswered_sent: deque[float] = deque(maxlen=4096)
        self._prefills: deque[tuple[float, float]] = deque(maxlen=256)  # (start, end) of finished requests' prefills
        self._steps: deque[tuple[float, float, float]] = deque(maxlen=256)  # (first token, end, seconds per step)
        self.read_until = 0.0  # wall time up to which the log has been read
        # Client connections to the server's port (conns.Connections), wall times: key -> [seen after,
        # seen by, gone by (None: open), claimed]; tasks given a slot that wait to be matched to one; the
        # arrival each matched task got (wall time). Off until the first poll.
        self._conns: dict[Any, list[Any]] = {}
        self._conn_polled: float | None = None
        self._pending: deque[int] = deque()
        self._conn_arrival: dict[int, float] = {}

    # ---- input ------------------------------------------------------------

    def feed_line(self, line: str, t_read: float) -> None:
        """One log line read at wall time ``t_read`` (all lines written before ``t_read`` come first)."""
        line = _ANSI.sub("", line)
        if "slot" not in line:
            if self._offset is None and log_stamp_s(line) is not None:
                self._server_time(line, t_read)  # the first stamped line sets the clock (gauge readings need it)
            return
        m = _SLOT.search(line)
        if m is None:
            return
        t = self._server_time(line, t_read)
        fn, msg, slot, task = m.group("fn"), m.group("msg"), int(m.group("slot")), int(m.group("task"))
        if msg.startswith("selected slot"):
            self._selected[slot] = t
        elif fn.startswith("launch_slot") and msg.startswith("processing task") and task >= 0:
            idx = len(self._launch_times)
            self._tasks[task] = _Task(slot, self._selected.pop(slot, None), t, idx)
            self._launch_times.append(t)
            self._forget_before(t - _FORGET_S)
            if self._conn_polled is not None:
                self._pending.append(task)
                self._match()
        elif fn == "release" and task in self._tasks:
            # Ended: with its timings (printed just before) or without (cancelled): it holds nobody up.
            info = self._tasks[task]
            if info.t_end is None:
                self._tasks.pop(task)

    def _forget_before(self, t: float) -> None:
        """Drop requests taken up before ``t`` that never ended in the log (a log cut short)."""
        for task in [k for k, v in self._tasks.items() if v.t_launch < t]:
            del self._tasks[task]

    def lines_read(self, t_read: float) -> None:
        """Every line written before ``t_read`` has been fed: gauge readings before it can be placed."""
        self.read_until = max(self.read_until, t_read)
        if self._offset is None:
            return  # no line read yet: the readings wait until the server's clock is known
        while self._gauge and self._gauge[0][1] < self.read_until - 0.02:
            t_sent, t_wall, deferred = self._gauge.popleft()
            self._place(self._to_server(t_sent), self._to_server(t_wall), deferred)

    def feed_deferred(self, t_answer: float, deferred: float | None, t_sent: float | None = None) -> None:
        """``llamacpp:requests_deferred`` as answered at wall time ``t_answer`` (asked at ``t_sent``);
        ``deferred`` None: asked at ``t_sent`` and not answered by ``t_answer`` (the loop was busy)."""
        if deferred is None or deferred >= 0:
            self._gauge.append((t_answer if t_sent is None else t_sent, t_answer, deferred))

    def feed_connections(self, t_prev: float | None, t_wall: float, new: set[Any], now: set[Any]) -> None:
        """A poll of the server's client connections at wall time ``t_wall`` (the previous one at ``t_prev``):
        ``new`` appeared since then, ``now`` are open. The first poll's (no ``t_prev``) are open from before:
        never matched; after :meth:`forget_connections` the client passes the last idle read as ``t_prev``."""
        first = self._conn_polled is None and t_prev is None
        if self._conn_polled is None and t_prev is not None:
            # Resumed after idle: the requests taken up meanwhile own some of the connections open now;
            # matched first (in launch order), they claim them, so a later request cannot take one.
            opened = sorted((v.index, k) for k, v in self._tasks.items() if v.t_end is None)
            self._pending.extend(k for _, k in opened if k not in self._pending)
        for key in now:
            if key not in self._conns:
                lo = None if first or key not in new or t_prev is None else t_prev
                self._conns[key] = [lo, t_wall, None, False]
        for key, c in list(self._conns.items()):
            if key not in now and c[2] is None:
                c[2] = t_wall
            if c[1] < t_wall - _CONN_KEEP_S and (c[3] or c[2] is not None):
                del self._conns[key]
        self._conn_polled = t_wall
        self._match()

    def forget_connections(self) -> None:
        """The connection table stops being read (nothing outstanding): drop what it said; arrivals already
        given to requests stay."""
        self._conns.clear()
        self._pending.clear()
        self._conn_polled = None

    def _match(self) -> None:
        """Give each task taken up (in that order) the earliest unclaimed connection that appeared before it
        was given its slot and was still open then; a task none fits keeps the other evidence."""
        off = self._offset or 0.0
        while self._pending:
            info = self._tasks.get(self._pending[0])
            if info is None:
                self._pending.popleft()
                continue
            s_wall = (info.t_select if info.t_select is not None else info.t_launch) + off
            fits = [c for c in self._conns.values() if not c[3] and c[0] is not None and c[0] < s_wall
                    and (c[2] is None or c[2] >= s_wall)]  # fmt: skip
            if not fits and (self._conn_polled is None or self._conn_polled < s_wall):
                return  # its connection may show at the next poll
            task = self._pending.popleft()
            if fits:
                c = min(fits, key=lambda c: c[0])
                c[3] = True
                self._conn_arrival[task] = (c[0] + min(c[1], s_wall)) / 2  # wall time: the offset may improve

    # ---- output -----------------------------------------------------------

    def open_requests(self) -> int:
        """Requests the log shows taken up (given a slot or started) and not ended."""
        return len(self._selected) + sum(1 for v in self._tasks.values() if v.t_end is None)

    def busy_with(self, t_wall: float) -> str | None:
        """What the server's loop is doing now by its log, where the log says: "housekeeping" while a
        slot has been given a request and the request has not started (the prompt cache's save and
        load run in between), "prefill" while a started request has not ended; else None."""
        now = self._to_server(t_wall)
        if any(0.0 <= now - t < _FORGET_S for t in self._selected.values()):
            return "housekeeping"
        if any(v.t_end is None for v in self._tasks.values()):
            return "prefill"
        return None

    def launched_since(self, t_wall: float) -> bool:
        """Whether a request the log shows running was started after ``t_wall`` (a wall-clock time)."""
        since = self._to_server(t_wall)
        return any(v.t_end is None and v.t_launch > since for v in self._tasks.values())

    def finish(self, rec: dict[str, Any], t_read: float, line: str) -> bool:
        """A request ended (``rec``: TimingParser's dict, with ``task``; ``line``: its last timing line,
        read at ``t_read``). False when its start was not seen: it has no timeline."""
        task = rec.get("task")
        info = self._tasks.get(task) if isinstance(task, int) else None
        pms, gms, gn = rec.get("prompt_ms"), rec.get("predicted_ms"), rec.get("predicted_n")
        if info is None or not isinstance(pms, int | float) or not isinstance(gms, int | float):
            if isinstance(task, int):
                self._tasks.pop(task, None)
            return False
        info.t_end = self._server_time(line, t_read)
        info.t_first = max(info.t_end - gms / 1e3, info.t_launch + pms / 1e3)
        info.prefill_s = pms / 1e3
        self._prefills.append((info.t_first - info.prefill_s, info.t_first))
        if isinstance(gn, int) and gn >= 2 and gms > 0:
            self._steps.append((info.t_first, info.t_end, gms / 1e3 / (gn - 1)))
        return True

    def ready(self, task: int, t_wall: float, hold_s: float = 20.0) -> bool:
        """Whether ``task``'s timeline can be told: every request taken up before it has ended (the
        server's loop work it waited behind is known), or it has waited ``hold_s`` for them."""
        info = self._tasks.get(task)
        if info is None or info.t_end is None:
            return info is None
        if self._to_server(t_wall) - info.t_end > hold_s:
            return True
        t_sel = info.t_select if info.t_select is not None else info.t_launch
        return not any(o.t_end is None and o.t_launch <= t_sel and o is not info for o in self._tasks.values())

    def timeline(self, task: int) -> dict[str, Any] | None:
        """The client's timeline of a finished ``task`` (see :meth:`finish`): wall time of arrival and
        seconds of each wait; None if its start was not seen. Forgets the task."""
        self._match()
        info = self._tasks.pop(task, None)
        if info is None or info.t_end is None or info.t_first is None or info.prefill_s is None:
            return None
        t_select = info.t_select if info.t_select is not None else info.t_launch
        arrival = self._arrivals.pop(info.index, None)
        by_conn = self._conn_arrival.pop(task, None)
        if by_conn is not None:
            # Each says the request had arrived by then: the connection's poll, and (where it was counted
            # as deferred) the gauge's; a connection the server's listen queue held back shows late.
            by_conn = self._to_server(by_conn)
            t_arrive = min(by_conn, t_select, arrival if arrival is not None else by_conn)
            if arrival is None and self._direct_arrival(t_select) >= t_select:
                t_arrive = t_select  # a slot free and the loop idle: taken at once (the poll is coarser)
        else:
            t_arrive = min(arrival, t_select) if arrival is not None else self._direct_arrival(t_select)
        return {
            "t_arrive": t_arrive + (self._offset or 0.0),
            "queue_s": t_select - t_arrive,
            "slot_setup_s": info.t_launch - t_select,
            "batch_wait_s": max(0.0, info.t_first - info.prefill_s - info.t_launch),
            "client_ttft_s": info.t_first - t_arrive,
            "timeline_source": (SOURCE_CONN if by_conn is not None else SOURCE_STAMPED)
            if self._stamped
            else SOURCE_READ_TIME,
        }

    # ---- inside -----------------------------------------------------------

    def _server_time(self, line: str, t_read: float) -> float:
        """The line's time on the server's clock (seconds since its log began), or, for a log without
        timestamps, the wall time it was read. Keeps the smallest wall - server offset seen."""
        stamp = log_stamp_s(line)
        if stamp is None:
            self._stamped = False if self._stamped is None else self._stamped
            self._offset = 0.0 if self._offset is None else self._offset
            return t_read
        self._stamped = True
        off = t_read - stamp
        if self._offset is None or off < self._offset:
            self._offset = off
        return stamp

    def _to_server(self, t_wall: float) -> float:
        return t_wall - (self._offset or 0.0)

    def _direct_arrival(self, t_select: float) -> float:
        """When a request that found a slot free arrived. At once if the server's loop was idle; else it
        waited in the server's queue (not counted as deferred) for the loop's turn to end, the middle of
        that span: a stretch in which the gauge went unanswered or was answered late (the loop inside
        a batch: since the last reading answered at once before it), a prompt batch that ended just
        before it was taken (since that batch's start or the last reading), or one decode step of the
        requests generating then."""
        blocked_since = self._blocked_before(t_select)
        if blocked_since is not None:
            return (blocked_since + t_select) / 2
        busy = [s for s, e in self._prefills if e <= t_select <= e + _TURN_S]
        if busy:
            i = bisect.bisect_left(self._gauge_times, t_select)
            since = max(max(busy), self._gauge_times[i - 1] if i > 0 else float("-inf"))
            return (since + t_select) / 2 if since < t_select else t_select
        steps = [step for first, end, step in self._steps if first < t_select < end]
        return t_select - max(steps) / 2 if steps else t_select

    def _blocked_before(self, t_select: float) -> float | None:
        """Where the loop was blocked up to ``t_select`` (a reading sent before it went unanswered, or
        the last reading before it was answered late and ``t_select`` came in that same turn): since when
        it could have been (the last reading answered at once before), else None."""
        i = bisect.bisect_left(self._gauge_times, t_select)
        if i == 0:
            return None
        t_last = self._gauge_times[i - 1]
        j = bisect.bisect_left(self._unanswered_sent, t_last)
        if j < len(self._unanswered_sent) and self._unanswered_sent[j] < t_select:
            return t_last  # asked after the last answer and never answered: blocked since then
        blocked, since = self._gauge_blocked[i - 1]
        if blocked and t_select - t_last <= _TURN_S and since > float("-inf"):
            return since
        return None

    def _place(self, sent: float, t: float, deferred: float | None) -> None:
        """Count the arrivals a gauge reading shows: deferred now plus launched before ``t``.

        The server answers the gauge between two batches, before the requests that came during the
        batch are looked at: those are counted by the next reading. So a request first counted by
        this reading arrived after the last reading, or, when that one waited for a batch (answered
        well after it was asked, or after readings that got no answer), after the one before it.
        """
        if deferred is None:  # not answered: the loop was busy from before it was asked
            self._unanswered_sent.append(sent)
            return
        launched = bisect.bisect_right(self._launch_times, t)
        arrived = int(round(deferred)) + launched
        prev = self._last_gauge
        since = self._since
        self._last_gauge = (sent, t, deferred)
        unanswered = bool(self._unanswered_sent) and (prev is None or self._unanswered_sent[-1] > prev[1])
        blocked = t - sent > _BLOCKED_S or unanswered
        self._since = (prev[1] if prev is not None else float("-inf")) if blocked else t
        self._gauge_times.append(t)
        self._gauge_blocked.append((blocked, self._since))
        new = arrived - self._counted
        if new <= 0:
            return
        if prev is not None and (prev[2] > 0 or deferred > 0):
            # Someone had to wait: the new ones arrived in that span (its middle).
            mid = ((since if since > float("-inf") else prev[0]) + t) / 2
            for i in range(self._counted, arrived):
                self._arrivals[i] = mid
        self._counted = arrived
