"""Engine poller: scrapes the attached engine in its own thread, never on the sampling path.

The GPU sampler asks :meth:`EnginePoller.sample_for_tick` for the latest
scrape, which returns at once. When the engine goes down the poller keeps
trying; when its process died it looks for an engine of the same kind on the
same port (a restart) and attaches to it, and it reports a gap as events for
the recording.
"""

from __future__ import annotations

import dataclasses
import threading
import time
from collections.abc import Sequence
from typing import Any
from urllib.parse import urlsplit

from pcie_tui.core.errors import UserError
from pcie_tui.core.model import EngineSample, GpuInfo, GpuSample
from pcie_tui.engines import registry
from pcie_tui.engines.base import EngineClient
from pcie_tui.engines.phases import LOADING_RX_Bps, PhaseTracker, engine_rx_Bps, tick_phase
from pcie_tui.recording.validate import Tally, clean_engine_sample


def pid_alive(pid: int | None) -> bool | None:
    """True/False for a pid, None when there is no pid to check."""
    if pid is None:
        return None
    try:
        import psutil

        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except Exception:
        return False


def _candidate_port(c: Any) -> int | None:
    """The port an engine serves on, or will once loaded (its --port, else the default)."""
    if c.url:
        return urlsplit(c.url).port
    port = (c.layout or {}).get("port")
    if isinstance(port, int):
        return port
    eng = registry.get(c.kind)
    return eng.default_port if eng is not None else None


class EnginePoller:
    """Daemon thread scraping ``client`` every ``interval_s``; hands out the latest reading."""

    def __init__(
        self,
        client: EngineClient,
        interval_s: float = 0.5,
        stacks: bool = False,
        rediscover: bool = True,
        loading_rx_Bps: float = LOADING_RX_Bps,
        reattach_every_s: float = 2.0,
        stale_grace_s: float | None = None,
    ) -> None:
        self.client = client
        self.interval_s = interval_s
        self.rediscover = rediscover
        self.loading_rx_Bps = loading_rx_Bps
        self.reattach_every_s = reattach_every_s
        # How long a live engine's failed scrapes keep its last reading (marked stale) before it reads
        # "down": by default two timed-out scrapes in a row (at least 1.5 s), so one slow answer from a
        # loaded API server is never a gap.
        timeout = self._client_timeout()
        self.stale_grace_s = stale_grace_s if stale_grace_s is not None else max(1.5, 2 * timeout + interval_s)
        # (answer time, reading, phase, read time): the read time is the midpoint of the scrape, when
        # the counters were taken; a tick says how old its reading is (``read_age_s``) so rates are
        # taken over the time the counters cover, not over tick times (a slow scrape is not a dip).
        self._last_good: tuple[float, EngineSample, str | None, float] | None = None
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._desc: dict[str, Any] | None = None
        self._latest: tuple[float, EngineSample, str | None, bool | None, float] | None = None
        self._events: list[dict[str, Any]] = []
        self._phases = PhaseTracker()
        self._up: bool | None = None
        self._down_since: float | None = None
        self._down_reason: str | None = None
        self._served = False  # this engine process answered at least once
        self._ever_up = False  # any engine answered since we attached
        self._restarted = False
        self._last_reattach_try = 0.0
        self._gone_pid: int | None = None  # the attached process whose exit was said (an engine_down, once)
        self._hist_sent: Any = None  # the histograms last handed out (omitted from ticks while unchanged)
        self._pending_requests: list[dict[str, Any]] = []  # finished requests not yet put in a tick
        self.scrapes = 0
        self.failed_scrapes = 0  # answers that did not come, or came too big or too slow
        self.tally = Tally(f"{client.kind} engine")  # numbers the validation rules turned into "unavailable"
        self.stacks = None
        if stacks:
            from pcie_tui.engines.stacks import StackSampler

            self.stacks = StackSampler(lambda: getattr(self.client, "pid", None))

    def _client_timeout(self) -> float:
        t = getattr(self.client, "timeout_s", None)
        return float(t) if isinstance(t, int | float) and t > 0 else 0.3

    # ---- lifecycle ------------------------------------------------------

    def start(self) -> None:
        if self._thread is not None:
            return
        self._thread = threading.Thread(target=self._run, name="pcie-tui-engine", daemon=True)
        self._thread.start()
        if self.stacks is not None:
            self.stacks.start()

    def stop(self) -> None:
        self._stop.set()
        if self.stacks is not None:
            self.stacks.stop()
        if self._thread is not None:
            self._thread.join(timeout=2.0)

    def describe(self) -> dict[str, Any]:
        """Static facts for the recording header (cached; refreshed after a reattach)."""
        with self._lock:
            d = self._desc
        if d is None:
            d = dict(self.client.describe())
            d["poll_interval_s"] = self.interval_s
            with self._lock:
                self._desc = d
        return dict(d)

    def update_gpus(self, running_pids: dict[int, list[int]]) -> list[int]:
        """Recompute which GPUs the engine's process tree holds (NVML running pids per GPU)."""
        from pcie_tui.engines.discover import gpus_for_tree, process_tree

        pid = getattr(self.client, "pid", None)
        gpus = gpus_for_tree(running_pids, process_tree(pid)) if pid is not None else []
        info = getattr(self.client, "info", None)
        if isinstance(info, dict):
            info["gpus"] = gpus
        with self._lock:
            if self._desc is not None:
                self._desc["gpus"] = gpus
        return gpus

    # ---- the thread -----------------------------------------------------

    def _run(self) -> None:
        while not self._stop.is_set():
            t0 = time.monotonic()
            self.poll_once()
            self._stop.wait(max(0.0, self.interval_s - (time.monotonic() - t0)))

    def poll_once(self) -> EngineSample:
        """One scrape and its bookkeeping (the thread calls this; tests may too)."""
        t_start = time.time()
        try:
            s = self.client.read()
        except Exception as e:  # a client must not raise, but a bug must not kill the thread
            s = EngineSample(kind=self.client.kind, up=False, error=f"{type(e).__name__}: {e}"[:160])
        s = clean_engine_sample(s, self.tally)
        if not s.up:
            self.failed_scrapes += 1
        finished = s.extra.get("requests")
        if finished:
            # Requests finished since the last scrape: each goes into exactly one tick,
            # however scrapes and ticks interleave.
            with self._lock:
                self._pending_requests.extend(finished)
        # When the answer (or the failure) came: events and staleness are timed from here.
        t = time.time()
        t_data = t_start + 0.5 * max(0.0, t - t_start)
        pid = getattr(self.client, "pid", None)
        alive = pid_alive(pid)
        self.scrapes += 1
        events: list[dict[str, Any]] = []
        good = self._last_good
        if not s.up and alive is not False and good is not None and t - good[0] <= self.stale_grace_s:
            # A busy API server can miss one short deadline or drop one connection (seen under load on
            # 2 cores); flapping to "down" would mislead. Keep the last reading, say how old it is and
            # why, and go down only after the grace (at once when the process is gone).
            what = "/metrics timed out" if s.error == "timed out" else f"scrape failed ({s.error})"
            s = dataclasses.replace(good[1], error=f"slow: {what}, reading {t - good[0]:.1f} s old")
            with self._lock:
                self._latest = (t, s, good[2], alive, good[3])
            return s
        if s.up and alive is False and pid is not None:
            alive = self._replaced(t, pid, events)
        if s.up:
            cphase = self._came_up(s, t, t_data, pid, events)
        else:
            cphase = None
            alive = self._went_down(s, t, pid, alive, events)
        with self._lock:
            self._latest = (t, s, cphase, alive, t_data)
            self._events.extend(events)
        return s

    def _came_up(
        self, s: EngineSample, t: float, t_data: float, pid: int | None, events: list[dict[str, Any]]
    ) -> str | None:
        """A good scrape at ``t``: the first readiness, the gap or the restart it ends goes into ``events``,
        and it becomes the last good reading. Returns the phase its counters show."""
        reset = self._phases.would_reset(s)
        if self._up is False and not self._ever_up:
            # Attached while it was starting: not a gap. Refresh the facts it could not give then.
            with self._lock:
                self._desc = None
            events.append(
                {
                    "event": "engine_ready",
                    "t": t,
                    "waited_s": t - self._down_since if self._down_since is not None else None,
                    "pid": pid,
                    "engine": self.describe(),
                }
            )
        elif self._up is False:
            if self._restarted:
                with self._lock:
                    self._desc = None
                self.describe()
            events.append(
                {
                    "event": "engine_gap",
                    "t": t,
                    "start": self._down_since,
                    "end": t,
                    "duration_s": t - self._down_since if self._down_since is not None else None,
                    "reason": self._down_reason,
                    "restarted": bool(reset or self._restarted),
                    "pid": pid,
                }
            )
        elif reset:
            events.append({"event": "engine_restart", "t": t, "pid": pid, "reason": "counters went down"})
        self._up, self._down_since, self._down_reason, self._restarted = True, None, None, False
        self._served = self._ever_up = True
        cphase = self._phases.update(s)
        self._last_good = (t, s, cphase, t_data)
        return cphase

    def _replaced(self, t: float, pid: int, events: list[dict[str, Any]]) -> bool | None:
        """The process attached to is gone, yet its URL answers: another took its port (a restart faster than
        the scrapes noticed). It went down (an event, once), and the new one is attached where it is found."""
        if self._up is not False and self._gone_pid != pid:
            self._gone_pid = pid  # said once for this process, however many answers come before the reattach
            if self._up is True:
                why = "its process exited; another answers on its port"
                events.append({"event": "engine_down", "t": t, "reason": why, "pid": pid, "pid_alive": False})
            self._up, self._down_since, self._down_reason = False, t, "its process exited"
        if self.rediscover and self._maybe_reattach(t, events):
            return pid_alive(getattr(self.client, "pid", None))
        return False

    def _went_down(
        self, s: EngineSample, t: float, pid: int | None, alive: bool | None, events: list[dict[str, Any]]
    ) -> bool | None:
        """A failed scrape at ``t``: an engine that was up goes down (an event in ``events``); where its
        process is gone, an engine of the same kind on the same port may take its place. Returns
        whether the (possibly new) process is alive."""
        if self._up is not False:
            self._down_since, self._down_reason = t, s.error
            if self._up is True and not (alive is False and self._gone_pid == pid):
                events.append({"event": "engine_down", "t": t, "reason": s.error, "pid": pid, "pid_alive": alive})
        if alive is False:
            self._gone_pid = pid  # its exit is said once (a new process answering on its port is no second one)
        self._up = False
        if alive is False and self.rediscover and self._maybe_reattach(t, events):
            alive = pid_alive(getattr(self.client, "pid", None))
        return alive

    def _maybe_reattach(self, t: float, events: list[dict[str, Any]]) -> bool:
        """The process died: attach to an engine of the same kind on the same port, if one runs."""
        now = time.monotonic()
        if now - self._last_reattach_try < self.reattach_every_s:
            return False
        self._last_reattach_try = now
        from pcie_tui.engines import discover as process

        try:
            found = [c for c in process.discover() if c.kind == self.client.kind]
        except Exception:
            return False
        old_url = getattr(self.client, "url", None)
        old_port = urlsplit(old_url).port if old_url else None
        pick = next((c for c in found if _candidate_port(c) == old_port), None)
        if pick is None and old_url is None and len(found) == 1:
            pick = found[0]
        if pick is None:
            return False
        old_pid = getattr(self.client, "pid", None)
        try:
            # A log file the user named (--log) is the restarted engine's log too.
            new_client = process.client_for(pick, log_path=getattr(self.client, "user_log_path", None))
        except UserError:
            return False
        self.client = new_client
        self._served = False
        self._restarted = True
        self._last_good = None
        self._phases = PhaseTracker()
        with self._lock:
            self._desc = None
        # Describe here, in the poller thread: it may do HTTP, which the sampling path must never wait on.
        d = self.describe()
        events.append(
            {"event": "engine_reattach", "t": t, "old_pid": old_pid, "new_pid": pick.pid, "url": pick.url, "engine": d}
        )
        return True

    # ---- consumers (any thread) ----------------------------------------

    def latest(self) -> EngineSample | None:
        with self._lock:
            return self._latest[1] if self._latest else None

    def _age_mark(self, s: EngineSample, t: float, t_read: float, alive: bool | None) -> EngineSample:
        """The latest reading as of tick time ``t``: past a scrape's deadline (plus a poll interval) it is
        marked slow; "down" only once the poller itself would have given up (its grace, one more scrape
        and a second). A live engine whose API server a loaded machine answers late is slow, not down
        (seen on 2 cores: 3.4 s without an answer while vLLM served 200 requests)."""
        if not s.up:
            return s
        age = t - t_read
        slow_after = max(3 * self.interval_s, 2.0, self._client_timeout() + self.interval_s + 1.0)
        if age <= slow_after:
            return s
        down_after = max(slow_after, self.stale_grace_s + self._client_timeout() + self.interval_s + 1.0)
        if alive is not False and age <= down_after:
            note = f"slow: no answer for {age:.1f} s"
            return s if (s.error or "").startswith("slow:") else dataclasses.replace(s, error=note)
        return dataclasses.replace(s, up=False, error=f"no reading for {age:.1f} s")

    def sample_for_tick(
        self, t: float, gpu_samples: Sequence[GpuSample], gpu_infos: Sequence[GpuInfo] = ()
    ) -> EngineSample | None:
        """The latest scrape with this tick's phase filled in; returns at once."""
        with self._lock:
            latest = self._latest
            desc = self._desc
        if latest is None:
            return None
        t_read, s, cphase, alive, t_data = latest
        s = self._age_mark(s, t, t_read, alive)
        gpus = desc.get("gpus") if desc else None
        rx = engine_rx_Bps(gpu_samples, gpus)
        phase = tick_phase(s, cphase, alive=alive, served=self._served, rx_Bps=rx, loading_rx_Bps=self.loading_rx_Bps)
        extra = s.extra
        if phase == "idle" and s.up:
            # The last answer said idle; the log may know better since (a request given a slot, whose
            # setup the busy loop does not answer during): never idle while a request is outstanding.
            busy = getattr(self.client, "busy_now", None)
            b = busy(t - t_read > 1.5 * self.interval_s) if busy is not None else None
            if b is not None:
                phase, extra = b, {**extra, "busy_with": b, "phase_from": "log"}
        if "requests" in extra or self._pending_requests:
            with self._lock:
                finished, self._pending_requests = self._pending_requests, []
            extra = {k: v for k, v in extra.items() if k != "requests"}
            if finished:
                extra["requests"] = finished
        hist = extra.get("hist")
        if hist is not None:
            if hist == self._hist_sent:
                # Cumulative and unchanged: readers keep the last one (keeps recordings small).
                extra = {k: v for k, v in extra.items() if k != "hist"}
            else:
                self._hist_sent = hist
        if s.up:
            # How old the counters are at this tick (ms resolution): rates use tick time minus this.
            extra = {**extra, "read_age_s": round(max(0.0, t - t_data), 3)}
        if self.stacks is not None:
            st = self.stacks.summary()
            if st is not None:
                extra = {**extra, "stacks": st}
        return dataclasses.replace(s, phase=phase, extra=extra)

    def drain_events(self) -> list[dict[str, Any]]:
        """Events since the last call: engine_down, engine_gap, engine_restart, engine_reattach, stacks notes."""
        with self._lock:
            ev, self._events = self._events, []
        if self.stacks is not None:
            ev.extend(self.stacks.drain_events())
        return ev
