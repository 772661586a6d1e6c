"""llama-server client: /metrics, /slots, /props and the server's own log.

``LlamaCppClient(url, pid=None, log_path=None)`` implements the EngineClient
protocol (``describe()``, ``read()``).  Every HTTP call has a short timeout and
``read()`` never raises: a failure gives ``up=False`` with the reason.

Where the numbers come from (all as the server reports them):

* ``prompt_tokens_total`` / ``generation_tokens_total``: the ``llamacpp:prompt_tokens_total``
  and ``llamacpp:tokens_predicted_total`` counters (``--metrics`` only; the server adds a
  request's tokens when its prompt is done / when it finishes).
* ``requests_running``: the /slots entries with ``is_processing``, the count the server's
  ``llamacpp:requests_processing`` gauge is made of; /slots is read just after /metrics, so
  this agrees with ``slots_prefill``/``slots_decode`` (the gauge stands in when /slots is off).
  ``requests_waiting``: ``llamacpp:requests_deferred`` (None without ``--metrics``).
* ``extra``: ``n_decode_total`` and the other counters, ``slots`` (per slot: processing,
  prompt tokens processed, tokens decoded, ``task`` id - numbers only, the text /slots
  returns is dropped), ``slots_prefill`` / ``slots_decode`` (busy slots that have / have
  not produced a token yet), ``server_state`` and ``requests`` (requests completed since the last read,
  parsed from the log by :mod:`pcie_tui.engines.llamacpp.log`).

llama-server answers /metrics and /slots from its main loop, between two batches; a
long prefill batch therefore delays them.  A timed-out scrape while /health answers is
reported as ``up=True`` with ``server_state="busy"`` and no counters for that tick.
"""

from __future__ import annotations

import contextlib
import http.client
import json
import os
import threading
import time
from typing import Any
from urllib.parse import urlsplit

from pcie_tui.core.gguf import gguf_meta
from pcie_tui.core.model import EngineSample
from pcie_tui.engines.http import MAX_BODY_BYTES, AnswerTooLarge, http_request
from pcie_tui.engines.llamacpp.conns import Connections, IdleArrivals
from pcie_tui.engines.llamacpp.log import LogTailer
from pcie_tui.engines.llamacpp.proc import (
    LAYOUT_ENV,
    load_facts,
    log_paths_for_pid,
    parse_layout,
    proc_argv,
    proc_environ,
)
from pcie_tui.engines.llamacpp.scrape import busy_phase, parse_metrics, slot_numbers

__all__ = ["METRICS_OFF_NOTE", "LlamaCppClient", "wait_ready"]

METRICS_OFF_NOTE = "llama-server runs without --metrics: no token counters; using /slots and the log"


class _HttpError(Exception):
    def __init__(self, kind: str, msg: str) -> None:
        super().__init__(msg)
        self.kind = kind  # "refused" | "timeout" | "io"


class LlamaCppClient:
    """EngineClient for llama-server. ``timeout_s`` applies to each HTTP call (keep it well under the tick)."""

    kind = "llamacpp"
    # The poller's interval for this engine: the slot wait of each request is counted from the deferred
    # gauge between two scrapes (see .clock), so the scrapes come at 10 Hz (two small tasks on the
    # server's loop, answered between batches).
    poll_interval_s = 0.1

    def __init__(
        self,
        url: str,
        pid: int | None = None,
        log_path: str | None = None,
        timeout_s: float = 0.3,
        log_from_start: bool = False,
        info: dict[str, Any] | None = None,
    ) -> None:
        u = urlsplit(url if "://" in url else f"http://{url}")
        if u.scheme not in ("http", "https") or not u.hostname:
            raise ValueError(f"not an http URL: {url!r}")
        self.url = f"{u.scheme}://{u.hostname}:{u.port or (443 if u.scheme == 'https' else 80)}"
        self._scheme, self._host, self._port = u.scheme, u.hostname, u.port or (443 if u.scheme == "https" else 80)
        self.timeout_s = min(float(timeout_s), 0.3)
        self.pid = pid
        # Process facts from discovery (pcie_tui.engines.discover), else read here from /proc.
        self.info: dict[str, Any] = dict(info or {})
        argv = self.info.get("cmdline")
        self.argv = list(argv) if isinstance(argv, list) else (proc_argv(pid) if pid is not None else None)
        self.environ = proc_environ(pid) if pid is not None else {}
        self.layout = parse_layout(self.argv or [], self.environ) if self.argv is not None else {}
        if isinstance(self.info.get("layout"), dict):
            self.layout = {**self.layout, **{k: v for k, v in self.info["layout"].items() if v is not None}}
        self.user_log_path = log_path  # named by the user (--log): kept across a reattach
        paths = [log_path] if log_path else (log_paths_for_pid(pid, self.argv) if pid is not None else [])
        self.tailers = [LogTailer(p, from_start=log_from_start) for p in paths]
        # The log is read by the scrape thread and, between scrapes, by the tick thread (busy_now): one lock
        # around the tailers and their request clocks; requests the tick thread read wait for the next read.
        self._log_lock = threading.RLock()
        self._log_out: list[dict[str, Any]] = []
        # The server's client connections (arrivals a busy loop hides), where its process is known.
        self._conns = Connections(pid, self._port) if pid is not None and self.tailers else None
        # While the log shows nothing outstanding: a connection that arrived and waits for a slot.
        self._idle_conns = IdleArrivals(pid, self._port) if pid is not None and self.tailers else None
        self._conns_polled: float | None = None
        self._idle_read: float | None = None  # the last read with nothing outstanding (the table not read)
        self.metrics_enabled: bool | None = None
        self.slots_enabled: bool | None = None
        self._noted_metrics_off = False
        self._start_time: str | None = None
        self._last_prompt_total: float | None = None
        self._metrics_sent = 0.0  # when the last /metrics was asked for
        self._last_slot_phase: str | None = None  # what the last /slots answer showed running
        self._last_slots_t: float | None = None  # when it came
        self._metrics_body: bytes | None = None  # the last /metrics text and what it parsed to
        self._metrics_vals: dict[str, float] | None = None
        self.props: dict[str, Any] | None = None
        self.load_log: dict[str, Any] | None = None
        self.model_meta: dict[str, Any] | None = None  # {} once tried and not readable

    # ---- HTTP -----------------------------------------------------------

    def _get(self, path: str) -> tuple[int, bytes, dict[str, str]]:
        # A kept-alive connection per thread (pcie_tui.engines.http.http_request); the deadline is
        # for the whole answer, not per recv.
        try:
            return http_request(self._scheme, self._host, self._port, path, self.timeout_s)
        except AnswerTooLarge:
            raise _HttpError("io", f"{path}: answer larger than {MAX_BODY_BYTES >> 20} MB; not read") from None
        except ConnectionRefusedError:
            raise _HttpError("refused", f"connection refused at {self.url}") from None
        except TimeoutError:
            raise _HttpError("timeout", f"{path} timed out after {self.timeout_s:.2f} s") from None
        except (OSError, http.client.HTTPException) as e:
            raise _HttpError("io", f"{path}: {type(e).__name__}: {e}") from None

    def _get_json(self, path: str) -> tuple[int, Any]:
        status, body, _ = self._get(path)
        try:
            return status, json.loads(body.decode("utf-8", "replace")) if body else None
        except ValueError:
            return status, None

    # ---- static facts ---------------------------------------------------

    def _fetch_props(self) -> dict[str, Any] | None:
        try:
            status, obj = self._get_json("/props")
        except _HttpError:
            return None
        if status != 200 or not isinstance(obj, dict):
            return None
        dgs = obj.get("default_generation_settings")
        n_ctx = dgs.get("n_ctx") if isinstance(dgs, dict) else None
        return {
            "version": obj.get("build_info"),
            "model": obj.get("model_path"),
            "total_slots": obj.get("total_slots"),
            "n_ctx": n_ctx,
        }

    def describe(self) -> dict[str, Any]:
        """Header facts: kind, url, pid, cmdline, layout, version, model, log paths, metrics on/off."""
        if self.props is None:
            self.props = self._fetch_props()
        if self.metrics_enabled is None:
            try:
                status, _, _ = self._get("/metrics")
                if status == 200:
                    self.metrics_enabled = True
                elif status == 501:
                    self.metrics_enabled = False
            except _HttpError:
                pass
        props = self.props or {}
        if self.model_meta is None:
            self.model_meta = self._model_meta(props.get("model") or self.layout.get("model"))
        if self.tailers and not (self.load_log or {}).get("complete"):
            # Read once the server is up (the head then holds every load-time line), again if not.
            self.load_log = load_facts(self.tailers[0].path)
        return {
            "kind": self.kind,
            "url": self.url,
            "pid": self.pid,
            "cmdline": self.argv,
            "layout": self.layout,
            "version": props.get("version") or self.info.get("version"),
            "model": props.get("model") or self.layout.get("model"),
            "total_slots": props.get("total_slots"),
            "n_ctx": props.get("n_ctx"),
            "metrics_enabled": self.metrics_enabled,
            "slots_enabled": self.slots_enabled,
            "log_paths": [t.path for t in self.tailers],
            "load_log": self.load_log,
            "model_meta": self.model_meta or None,
            # Only the variables that set offload and loading (never keys or paths of other things).
            "environ": {k: v for k, v in self.environ.items() if k in LAYOUT_ENV} or None,
            "gpus": self.info.get("gpus"),
            "tree_pids": self.info.get("tree_pids"),
        }

    def _model_meta(self, model: Any) -> dict[str, Any]:
        """Layer and expert counts from the GGUF header, when the file is readable from here."""
        if not isinstance(model, str) or not model:
            return {}
        path = model
        if not os.path.isabs(path) and self.pid is not None:
            with contextlib.suppress(OSError):
                path = os.path.join(os.readlink(f"/proc/{self.pid}/cwd"), path)
        return gguf_meta(path) or {}

    # ---- per tick ---------------------------------------------------------

    def read(self) -> EngineSample:
        try:
            return self._read()
        except Exception as e:  # never raise into the poller
            return EngineSample(kind=self.kind, up=False, error=f"internal error: {type(e).__name__}: {e}")

    def _read(self) -> EngineSample:
        extra: dict[str, Any] = {}
        requests = self._poll_logs(extra)
        if requests:
            extra["requests"] = requests
        counters: tuple[float | None, float | None, float | None, float | None] | None = None
        errors: list[str] = []
        if self.pid is not None and not os.path.exists(f"/proc/{self.pid}"):
            errors.append(f"process {self.pid} has exited")
        state = "ready"

        if self.metrics_enabled is not False:
            try:
                self._metrics_sent = time.time()
                status, body, headers = self._get("/metrics")
            except _HttpError as e:
                if e.kind == "timeout":  # the server's loop is inside a batch: its request timeline notes it
                    with self._log_lock:
                        for tailer in self.tailers:
                            tailer.clock.feed_deferred(time.time(), None, self._metrics_sent)
                return self._unreachable(e, extra, errors)
            state, counters = self._take_metrics(status, body, headers, extra, errors)
        got_metrics = counters is not None
        prompt_total, gen_total, running, waiting = counters or (None, None, None, None)

        if self.metrics_enabled is False and not self._noted_metrics_off:
            self._noted_metrics_off = True
            extra["note"] = METRICS_OFF_NOTE

        if state != "loading" and self.slots_enabled is not False:
            try:
                status, obj = self._get_json("/slots")
            except _HttpError as e:
                if not got_metrics:
                    return self._unreachable(e, extra, errors)
                errors.append(str(e))
                status, obj = 0, None
            state, busy = self._take_slots(status, obj, state, extra, errors)
            if busy is not None:
                # The gauge counts the same slots, but /metrics was read before /slots: a request that
                # started in between would read "0 running" beside a decoding slot (seen in CI).
                running = busy

        down = self._not_up(state, got_metrics, extra, errors)
        if down is not None:
            return down
        extra["server_state"] = state
        return EngineSample(
            kind=self.kind,
            up=True,
            prompt_tokens_total=prompt_total,
            generation_tokens_total=gen_total,
            requests_running=running,
            requests_waiting=waiting,
            error="; ".join(errors) or None,
            extra=extra,
        )

    def _take_metrics(
        self, status: int, body: bytes, headers: dict[str, str], extra: dict[str, Any], errors: list[str]
    ) -> tuple[str, tuple[float | None, float | None, float | None, float | None] | None]:
        """What a /metrics answer says: the server state ("loading" on HTTP 503, else "ready") and, where
        it parsed, (prompt tokens, generated tokens, requests running, requests waiting); the other
        counters go into ``extra``, what could not be read into ``errors``."""
        if status == 501:
            self.metrics_enabled = False
            return "ready", None
        if status == 503:
            return "loading", None
        if status != 200:
            errors.append(f"/metrics answered HTTP {status}")
            return "ready", None
        if body != self._metrics_body:
            # Unchanged text (an idle server) reuses the last parse.
            self._metrics_body, self._metrics_vals = body, parse_metrics(body)
        vals = self._metrics_vals
        if vals is None:
            errors.append("/metrics returned something that is not Prometheus text")
            return "ready", None
        self.metrics_enabled = True
        t_answer = time.time()
        with self._log_lock:
            for tailer in self.tailers:  # the slot wait of each request is counted from this gauge
                tailer.clock.feed_deferred(t_answer, vals.get("llamacpp:requests_deferred"), self._metrics_sent)
        prompt_total = vals.get("llamacpp:prompt_tokens_total")
        for name, key in (
            ("llamacpp:n_decode_total", "n_decode_total"),
            ("llamacpp:prompt_seconds_total", "prompt_seconds_total"),
            ("llamacpp:tokens_predicted_seconds_total", "predicted_seconds_total"),
            ("llamacpp:prompt_tokens_cached_total", "prompt_tokens_cached_total"),
            ("llamacpp:n_busy_slots_per_decode", "busy_slots_per_decode"),
            ("llamacpp:n_tokens_max", "n_tokens_max"),
        ):
            if name in vals:
                extra[key] = vals[name]
        self._note_restart(headers.get("process-start-time-unix"), prompt_total, extra)
        return "ready", (
            prompt_total,
            vals.get("llamacpp:tokens_predicted_total"),
            vals.get("llamacpp:requests_processing"),
            vals.get("llamacpp:requests_deferred"),
        )

    def _take_slots(
        self, status: int, obj: Any, state: str, extra: dict[str, Any], errors: list[str]
    ) -> tuple[str, float | None]:
        """What a /slots answer says: the server state (``state``, or "loading" on HTTP 503) and, for a
        slot list, how many slots are processing; the slots and how many of them are in prefill and
        in decode go into ``extra``, what could not be read into ``errors``."""
        if status == 200 and isinstance(obj, list):
            self.slots_enabled = True
            slots = slot_numbers(obj)
            extra["slots"] = slots
            busy = [s for s in slots if s.get("processing")]
            extra["slots_prefill"] = sum(1 for s in busy if not s.get("n_decoded"))
            extra["slots_decode"] = sum(1 for s in busy if s.get("n_decoded"))
            sp, sd = extra["slots_prefill"], extra["slots_decode"]
            self._last_slot_phase = busy_phase(sp, sd)
            self._last_slots_t = time.time()
            return state, float(len(busy))
        if status == 501:
            self.slots_enabled = False
        elif status == 503:
            return "loading", None
        elif status == 200:
            errors.append("/slots returned something that is not a slot list")
        elif status:
            errors.append(f"/slots answered HTTP {status}")
        return state, None

    def _not_up(self, state: str, got_metrics: bool, extra: dict[str, Any], errors: list[str]) -> EngineSample | None:
        """The sample of a server that is loading, answers nothing readable, or (where neither
        endpoint serves) fails /health; None where it is up."""
        if state == "loading":
            extra["server_state"] = "loading"
            return EngineSample(kind=self.kind, up=False, error="llama-server is loading the model", extra=extra)
        if not got_metrics and "slots" not in extra and errors:
            # Something answers, but nothing it said could be read: unavailable, with the reasons.
            extra["server_state"] = "error"
            return EngineSample(kind=self.kind, up=False, error="; ".join(errors), extra=extra)
        if not got_metrics and self.slots_enabled is not True:
            # Neither endpoint serves: ask /health whether the server is there at all.
            try:
                status, _, _ = self._get("/health")
            except _HttpError as e:
                return self._unreachable(e, extra, errors)
            if status != 200:
                extra["server_state"] = "loading" if status == 503 else "error"
                return EngineSample(kind=self.kind, up=False, error=f"/health answered HTTP {status}", extra=extra)
        return None

    def _unreachable(self, e: _HttpError, extra: dict[str, Any], errors: list[str]) -> EngineSample:
        if e.kind == "timeout":
            # /metrics and /slots wait for the current batch; /health does not.
            try:
                status, _, _ = self._get("/health")
            except _HttpError:
                status = 0
            if status == 200:
                extra["server_state"] = "busy"
                busy_with = self._busy_with()
                running = None
                if busy_with is not None:
                    extra["busy_with"] = busy_with
                    # What the log shows open stands in for /slots, which the busy loop cannot answer.
                    with self._log_lock:
                        running = float(sum(t.clock.open_requests() for t in self.tailers)) or None
                    extra["running_from"] = "log"
                return EngineSample(
                    kind=self.kind,
                    up=True,
                    requests_running=running,
                    error=f"{e} (server busy in a batch)",
                    extra=extra,
                )
        extra["server_state"] = "down"
        return EngineSample(kind=self.kind, up=False, error="; ".join([*errors, str(e)]), extra=extra)

    def _busy_with(self) -> str | None:
        """What a loop that does not answer is busy with: housekeeping between requests (the log shows a
        slot given a request that has not started), else what the last /slots answer showed running
        (prefill, decode, mixed), else a started request's prefill (the log shows it, /slots never did)."""
        now = time.time()
        with self._log_lock:
            said = [b for t in self.tailers if (b := t.clock.busy_with(now)) is not None]
        if not said:
            return None  # no log, or it shows nothing running: not known
        if "housekeeping" in said:
            return "housekeeping"
        return self._last_slot_phase if self._last_slot_phase not in (None, "idle") else "prefill"

    def _note_restart(self, start: str | None, prompt_total: float | None, extra: dict[str, Any]) -> None:
        restarted = False
        if start is not None:
            if self._start_time is not None and start != self._start_time:
                restarted = True
            self._start_time = start
        if prompt_total is not None:
            if self._last_prompt_total is not None and prompt_total < self._last_prompt_total:
                restarted = True
            self._last_prompt_total = prompt_total
        if restarted:
            extra["restarted"] = True

    def _poll_conns(self) -> None:
        """New client connections since the last poll, for each request clock (before the log is read:
        a request the log shows given a slot has its connection listed by then); while nothing is
        outstanding, the connections that arrive and wait (:class:`.conns.IdleArrivals`)."""
        if self._conns is None:
            return
        with self._log_lock:
            busy = any(t.clock.open_requests() for t in self.tailers)
        if self._idle_conns is not None:  # outside the lock: the tick thread's busy_now never waits on a read
            if busy:
                self._idle_conns.reset()
            else:
                self._idle_conns.poll(time.monotonic())
        if not busy:
            # Nothing outstanding: the request clocks' table is not read. When a request is taken up, the
            # connections then open count as arrived since the last log read that showed none outstanding
            # (_idle_read).
            if self._conns_polled is not None:
                with self._log_lock:
                    self._conns.reset()
                    for tailer in self.tailers:
                        tailer.clock.forget_connections()
                self._conns_polled = None
            return
        t = time.time()
        got = self._conns.poll()
        if got is None:
            return
        if self._conns_polled is None and self._idle_read is not None:
            got = (got[1], got[1])  # resumed after idle: all open now arrived since the idle read
            self._conns_polled = self._idle_read
        with self._log_lock:
            for tailer in self.tailers:
                tailer.clock.feed_connections(self._conns_polled, t, *got)
        self._conns_polled = t

    def _poll_logs(self, extra: dict[str, Any]) -> list[dict[str, Any]]:
        self._poll_conns()
        with self._log_lock:
            t0 = time.time()
            out, self._log_out = self._log_out, []
            for t in self.tailers:
                out.extend(t.poll())
                if t.error:
                    extra["log_error"] = t.error
            live = [r for t in self.tailers for r in t.progress()]
            if live:  # requests still running, as the log's progress lines say (numbers only)
                extra["progress"] = live
            if not any(t.clock.open_requests() for t in self.tailers):
                # The log read from t0 shows nothing outstanding: with the loop idle a request is taken up
                # within ms, so any request taken up later arrived after t0 (see _poll_conns).
                self._idle_read = t0
        return out

    def busy_now(self, stale: bool) -> str | None:
        """What the server's loop is doing by its log as of now, for a tick whose last answer said idle
        (called by the poller's tick thread; reads the log without HTTP). A request given a slot since that
        answer is in its setup ("housekeeping"); with ``stale`` (the scrape in flight past its interval: the
        loop does not answer), whatever the log shows running. None: the log shows nothing outstanding."""
        if not self.tailers:
            return None
        with self._log_lock:
            for t in self.tailers:
                self._log_out.extend(t.poll())
            b = self._busy_with()
            # A request the log shows started after that answer: running now, whatever the answer said (a
            # request whose end the log never showed is not: the fresh answer's idle wins over it).
            since = self._last_slots_t
            new = since is not None and any(t.clock.launched_since(since) for t in self.tailers)
        if b is None and self._idle_conns is not None and self._idle_conns.pending:
            # A client connected since the log last showed nothing outstanding and waits, no slot given:
            # the server is receiving or tokenising its request (the engine's own work before it starts).
            return "housekeeping"
        return b if b == "housekeeping" or (b is not None and (stale or new)) else None

    def progress(self) -> list[dict[str, Any]]:
        """Requests still running, per slot, as the log's progress lines said at the last read
        (:meth:`.log.LogTailer.progress`): prefill tokens processed, progress, rate."""
        with self._log_lock:
            return [r for t in self.tailers for r in t.progress()]

    def close(self) -> None:
        """Nothing held open between reads; here for symmetry with other sources."""


def wait_ready(url: str, timeout_s: float = 60.0) -> bool:
    """Poll /health until it answers 200 (used by tests and scripts)."""
    c = LlamaCppClient(url)
    end = time.monotonic() + timeout_s
    while time.monotonic() < end:
        try:
            status, _, _ = c._get("/health")
            if status == 200:
                return True
        except _HttpError:
            pass
        time.sleep(0.1)
    return False
