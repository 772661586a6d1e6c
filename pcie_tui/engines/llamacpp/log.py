"""Per-request timings from a llama-server log, read incrementally.

llama-server prints three lines when a request finishes: prompt eval time,
eval time and total time.  Their shape changed across releases; every form
below is parsed (the sources they come from are named beside each):

* ``slot print_timing: id  1 | task 0 | prompt eval time = 5.24 ms / 60 tokens (...)``
  one line each (2025+ ``SLT_INF`` per line);
* ``slot print_timing: id  0 | task 0 | `` followed by bare ``prompt eval time = ...``,
  ``eval time = ...``, ``total time = ...`` lines (late 2024, one multi-line ``SLT_INF``);
* ``INFO [           print_timings] prompt eval time     = ... | tid=... id_slot=0 id_task=1 ...``
  and ``generation eval time = ... / N runs`` (2024 ``server_log`` text format);
* the same as JSON, ``{"function":"print_timings","msg":"prompt eval time ...","id_slot":0,
  "t_prompt_processing":...,"n_prompt_tokens_processed":...}`` (2024 ``--log-format json``;
  2023 used ``slot_id``/``task_id``/``num_prompt_tokens_processed``);
* ``print_timings: prompt eval time = ...`` / ``print_timings:        eval time = ... runs``
  (2023 ``LOG_TEE``);
* ``llama_print_timings:`` / ``llama_perf_context_print:`` (libllama's own report).

While a request runs, b11434 also prints progress lines (tools/server/server-context.cpp;
``SLT_INF`` prints the function name cut to 12 characters, so both read ``print_timing``):

* ``slot print_timing: id  0 | task 16 | prompt processing, n_tokens =   5120, progress = 0.85,
  t =   3.00 s / 1704.71 tokens per second`` (``print_timings_pp``: after every batch once the
  prompt has taken 3 s; n_tokens = prompt tokens processed, progress = cached + processed over the
  prompt's tokens, t and the rate over the processed ones);
* ``slot print_timing: id  0 | task 16 | n_gen =    100, tg =  30.00 t/s, tg_3s =  31.00 t/s``
  (``print_timings_tg``: every 3 s once 100 tokens are generated);
* ``slot      release: id  0 | task 16 | stop processing: n_tokens = ..., truncated = 0``.

:func:`parse_progress` reads the first two; :meth:`LogTailer.progress` keeps the latest per slot
until the request's timings or its release line arrive.

No prompt or completion text is ever read into a result: only numbers.

Public names the report and the TUI use:

* :func:`request_stats` ``(requests) -> dict``: per-request prompt and generation
  tokens/s and prompt latency, with p50/p95/p99.
* :class:`LogTailer` ``(path).poll() -> list[dict]``: new completed requests.
* :class:`TimingParser` ``.feed(line) -> dict | None``.
* :func:`parse_progress` ``(line) -> dict | None``: a live progress record.

A request dict holds ``prompt_n``, ``prompt_ms``, ``predicted_n``, ``predicted_ms``
(as the server printed them; also as ``prompt_tokens``, ``prompt_s``, ``generation_tokens``,
``generation_s`` for :func:`pcie_tui.analyze.engine.per_request_summary`), and where known ``total_ms``, ``slot``, ``task``,
``format`` (which of the shapes above), ``t`` (unix time it was read) and ``seq``
(running number per tailer; ``t`` + ``seq`` identify a request when ticks repeat a scrape).
"""

from __future__ import annotations

import json
import os
import re
import time
from typing import Any

from pcie_tui.engines.llamacpp.clock import RequestClock
from pcie_tui.engines.stats import quantile

_ANSI = re.compile(r"\x1b\[[0-9;]*[A-Za-z]")
_TIMING = re.compile(
    r"(?P<what>prompt eval time|generation eval time|eval time|total time)\s*=\s*"
    r"(?P<ms>[0-9]+(?:\.[0-9]*)?)\s*ms(?:\s*/\s*(?P<n>[0-9]+)\s*(?P<unit>tokens|runs))?"
)
_SLOT = re.compile(r"slot\s+print_timing:\s*id\s+(?P<slot>-?\d+)\s*\|\s*task\s+(?P<task>-?\d+)\s*\|(?P<rest>.*)$")
_NUM = r"[0-9]+(?:\.[0-9]*)?(?:e[+-]?[0-9]+)?|inf|nan|-nan"
_SLOT_HEAD = r"slot\s+print_timing:\s*id\s+(?P<slot>-?\d+)\s*\|\s*task\s+(?P<task>-?\d+)\s*\|\s*"
_PREFILL = re.compile(
    _SLOT_HEAD + r"prompt processing, n_tokens\s*=\s*(?P<n>\d+), progress\s*=\s*(?P<progress>" + _NUM + r"), "
    r"t\s*=\s*(?P<t>" + _NUM + r")\s*s\s*/\s*(?P<tps>" + _NUM + r") tokens per second"
)
_DECODE = re.compile(
    _SLOT_HEAD + r"n_gen\s*=\s*(?P<n>\d+), tg\s*=\s*(?P<tps>" + _NUM + r") t/s, tg_3s\s*=\s*(?P<tps3>" + _NUM + r") t/s"
)
_RELEASE = re.compile(r"slot\s+release:\s*id\s+(?P<slot>-?\d+)\s*\|\s*task\s+(?P<task>-?\d+)\s*\|\s*stop processing")
_KV_SLOT = re.compile(r"\b(?:id_slot|slot_id)=(-?\d+)")
_KV_TASK = re.compile(r"\b(?:id_task|task_id)=(-?\d+)")
_PREFIXES = (
    ("llama_perf_context_print:", "llama_perf_context_print"),
    ("llama_print_timings:", "llama_print_timings"),
    ("print_timings]", "server-text"),
    ("print_timings:", "print_timings"),
)

Key = tuple[int, int] | None


class TimingParser:
    """Line-by-line state machine; returns a request dict when its ``total time`` line arrives."""

    def __init__(self) -> None:
        self._pending: dict[Key, dict[str, Any]] = {}
        # Key of a bare ``slot print_timing: ... |`` header whose lines follow on their own.
        self._header_key: Key = None
        self._header_left = 0

    def reset(self) -> None:
        self._pending.clear()
        self._header_key, self._header_left = None, 0

    def feed(self, line: str) -> dict[str, Any] | None:
        line = _ANSI.sub("", line).rstrip("\r\n")
        if "time" not in line and "print_timing" not in line:
            return None
        if line.lstrip().startswith("{"):
            return self._feed_json(line)
        m = _SLOT.search(line)
        if m is not None:
            key: Key = (int(m.group("slot")), int(m.group("task")))
            body = m.group("rest")
            if not _TIMING.search(body):
                if not body.strip():
                    # Multi-line form: the three timing lines follow without a prefix.
                    self._header_key, self._header_left = key, 3
                return None  # a progress line, or another slot line
            return self._timing(body, key, "slot")
        tm = _TIMING.search(line)
        if tm is None:
            return None
        fmt = "bare"
        for prefix, name in _PREFIXES:
            if prefix in line:
                fmt = name
                break
        key = None
        if fmt == "server-text":
            ks, kt = _KV_SLOT.search(line), _KV_TASK.search(line)
            if ks is not None:
                key = (int(ks.group(1)), int(kt.group(1)) if kt else -1)
        elif fmt == "bare" and self._header_left > 0:
            key, fmt = self._header_key, "slot-multiline"
            self._header_left -= 1
        return self._timing(line, key, fmt)

    def _feed_json(self, line: str) -> dict[str, Any] | None:
        try:
            obj = json.loads(line)
        except ValueError:
            return None
        if not isinstance(obj, dict):
            return None
        msg = obj.get("msg")
        if not isinstance(msg, str) or _TIMING.search(msg) is None:
            return None
        slot = obj.get("id_slot", obj.get("slot_id"))
        task = obj.get("id_task", obj.get("task_id"))
        key: Key = (int(slot), int(task) if isinstance(task, int) else -1) if isinstance(slot, int) else None
        # The JSON fields carry the unrounded figures; prefer them to the message text.
        exact: dict[str, Any] = {}
        n_prompt = obj.get("n_prompt_tokens_processed", obj.get("num_prompt_tokens_processed"))
        if "t_prompt_processing" in obj and n_prompt is not None and "prompt eval" in msg:
            exact = {"ms": obj["t_prompt_processing"], "n": n_prompt}
        elif "t_token_generation" in obj and "n_decoded" in obj and "eval time" in msg:
            exact = {"ms": obj["t_token_generation"], "n": obj["n_decoded"]}
        elif "t_total" in obj and "total time" in msg:
            exact = {"ms": obj["t_total"]}
        return self._timing(msg, key, "server-json", exact)

    def _timing(self, text: str, key: Key, fmt: str, exact: dict[str, Any] | None = None) -> dict[str, Any] | None:
        m = _TIMING.search(text)
        if m is None:
            return None
        what = m.group("what")
        ms = float(exact["ms"]) if exact and "ms" in exact else float(m.group("ms"))
        n_raw = exact.get("n") if exact else None
        n = int(n_raw) if n_raw is not None else (int(m.group("n")) if m.group("n") is not None else None)
        if what == "prompt eval time":
            self._pending[key] = {"prompt_n": n, "prompt_ms": ms}
            return None
        rec = self._pending.get(key)
        if rec is None:
            return None  # a tail that began mid-request: nothing trustworthy to report
        if what in ("eval time", "generation eval time"):
            rec["predicted_n"], rec["predicted_ms"] = n, ms
            return None
        # total time: the request is complete.
        del self._pending[key]
        if "predicted_ms" not in rec or rec.get("prompt_n") is None or rec.get("predicted_n") is None:
            return None
        rec["total_ms"] = ms
        rec["format"] = fmt
        # The same figures under the names analyze.engine.per_request_summary reads.
        rec["prompt_tokens"], rec["prompt_s"] = rec["prompt_n"], rec["prompt_ms"] / 1e3
        rec["generation_tokens"], rec["generation_s"] = rec["predicted_n"], rec["predicted_ms"] / 1e3
        if key is not None:
            rec["slot"], rec["task"] = key[0], (key[1] if key[1] >= 0 else None)
        if fmt == "slot-multiline":
            self._header_key, self._header_left = None, 0
        return rec


def parse_lines(lines: Any) -> list[dict[str, Any]]:
    """All completed requests in an iterable of log lines (no ``t`` field)."""
    p = TimingParser()
    out = []
    for line in lines:
        r = p.feed(line)
        if r is not None:
            out.append(r)
    return out


def parse_progress(line: str) -> dict[str, Any] | None:
    """A live progress record from one log line, or None.

    Prefill: ``{"slot", "task", "phase": "prefill", "n_tokens", "progress", "t_s", "tokens_per_s"}``;
    decode: ``{"slot", "task", "phase": "decode", "n_tokens", "tokens_per_s", "tokens_per_s_3s"}``.
    """
    if "print_timing" not in line:
        return None
    line = _ANSI.sub("", line)
    m = _PREFILL.search(line)
    if m is not None:
        return {
            "slot": int(m.group("slot")),
            "task": int(m.group("task")),
            "phase": "prefill",
            "n_tokens": int(m.group("n")),
            "progress": float(m.group("progress")),
            "t_s": float(m.group("t")),
            "tokens_per_s": float(m.group("tps")),
        }
    m = _DECODE.search(line)
    if m is None:
        return None
    return {
        "slot": int(m.group("slot")),
        "task": int(m.group("task")),
        "phase": "decode",
        "n_tokens": int(m.group("n")),
        "tokens_per_s": float(m.group("tps")),
        "tokens_per_s_3s": float(m.group("tps3")),
    }


class LogTailer:
    """Follows one log file from a byte offset; survives rotation and truncation.

    ``from_start`` False (attach to a running server) skips what is already in the
    file, so old requests are not reported as new.
    """

    def __init__(self, path: str, from_start: bool = False, max_read_bytes: int = 4 << 20) -> None:
        self.path = path
        self.max_read_bytes = max_read_bytes
        self.parser = TimingParser()
        self._buf = b""
        self._ino: tuple[int, int] | None = None
        self.offset = 0
        self._sig = b""  # the last bytes consumed, to notice a file rewritten in place
        self.seq = 0  # requests found so far: with ``t``, identifies a request across duplicated ticks
        self._live: dict[int, dict[str, Any]] = {}  # slot -> its latest progress record (parse_progress)
        self.error: str | None = None
        self._stamp: tuple[tuple[int, int], int, int] | None = None  # (file, size, mtime) at the last look
        # Each request's timeline as its client lived it (queue, slot setup, batch wait): see .clock.
        self.clock = RequestClock()
        self._read_at = 0.0  # wall time of the last read: every line written before it has been fed
        self._held: list[dict[str, Any]] = []  # ended requests waiting for the ones taken up before them
        try:
            st = os.stat(path)
            self._ino = (st.st_dev, st.st_ino)
            self.offset = 0 if from_start else st.st_size
            if self.offset:
                with open(path, "rb") as f:
                    f.seek(max(0, self.offset - 32))
                    self._sig = f.read(self.offset - max(0, self.offset - 32))
        except OSError as e:
            self.error = f"cannot read log {path}: {e.strerror}"

    def poll(self) -> list[dict[str, Any]]:
        """New completed requests since the last call. Never raises."""
        self.clock.lines_read(self._read_at)
        now = time.time()  # every line written before this is fed below (or was already)
        try:
            st = os.stat(self.path)
        except OSError as e:
            self.error = f"cannot read log {self.path}: {e.strerror}"
            return []
        ino = (st.st_dev, st.st_ino)
        stamp = (ino, st.st_size, st.st_mtime_ns)
        if stamp == self._stamp and self.error is None:
            # Not touched since the last look (the usual case between requests): no open, seek
            # or read. A rewrite to the very same length still changes the mtime.
            self._read_at = now
            return self._release(now)
        self._stamp = stamp
        try:
            with open(self.path, "rb") as f:
                if ino == self._ino and st.st_size >= self.offset and self._sig:
                    # Same file, not shorter: still the one we read, unless it was rewritten
                    # (restarted with '>' and already longer than before) - the bytes just
                    # before our offset tell.
                    f.seek(self.offset - len(self._sig))
                    if f.read(len(self._sig)) != self._sig:
                        st = os.fstat(f.fileno())
                        self._ino = None
                if ino != self._ino or st.st_size < self.offset:
                    # Rotated (a new file under the name) or truncated: read it from the top.
                    self._ino, self.offset, self._buf, self._sig = ino, 0, b"", b""
                    self.parser.reset()
                    self._live.clear()
                if st.st_size == self.offset:
                    self._read_at = now
                    return self._release(now)
                f.seek(self.offset)
                data = f.read(self.max_read_bytes)
        except OSError as e:
            self.error = f"cannot read log {self.path}: {e.strerror}"
            return []
        self.error = None
        self.offset += len(data)
        self._sig = (self._sig + data)[-32:]
        data = self._buf + data
        lines = data.split(b"\n")
        self._buf = lines.pop()  # the unfinished last line waits for the rest
        if len(self._buf) > 65536:
            self._buf = b""  # a line that long is not a timing line
        self._read_at = now
        return self._feed(lines, now)

    def _feed(self, lines: list[bytes], now: float) -> list[dict[str, Any]]:
        for raw in lines:
            line = raw.decode("utf-8", "replace")
            self.clock.feed_line(line, now)
            rec = self.parser.feed(line)
            if rec is not None:
                self.seq += 1
                rec["t"], rec["seq"] = now, self.seq
                self.clock.finish(rec, now, line)
                self._held.append(rec)
                if rec.get("slot") is not None:
                    self._live.pop(rec["slot"], None)  # the request ended: no longer in progress
                continue
            prog = parse_progress(line)
            if prog is not None:
                prog["t"] = now
                self._live[prog["slot"]] = prog
            elif "release" in line and (rel := _RELEASE.search(line)) is not None:
                self._live.pop(int(rel.group("slot")), None)
        return self._release(now)

    def _release(self, now: float) -> list[dict[str, Any]]:
        """The ended requests whose timeline can be told now (see RequestClock.ready), in order."""
        out, held = [], []
        for rec in self._held:
            task = rec.get("task")
            if isinstance(task, int) and not self.clock.ready(task, now):
                held.append(rec)
                continue
            timeline = self.clock.timeline(task) if isinstance(task, int) else None
            if timeline is not None:
                rec.update(timeline)
            out.append(rec)
        self._held = held
        return out

    def progress(self) -> list[dict[str, Any]]:
        """The latest progress record of each slot with a request still running, as of the last
        :meth:`poll` (``t``: when it was read), by slot. Lets a consumer show prefill progress
        before the request ends."""
        return [dict(self._live[k]) for k in sorted(self._live)]


def _dist(values: list[float]) -> dict[str, float | None]:
    v = sorted(values)
    if not v:
        return {"p50": None, "p95": None, "p99": None, "mean": None, "n": 0}
    return {
        "p50": quantile(v, 0.50),
        "p95": quantile(v, 0.95),
        "p99": quantile(v, 0.99),
        "mean": sum(v) / len(v),
        "n": len(v),
    }


_IDENTITY = ("t", "seq", "slot", "task", "prompt_n", "prompt_ms", "predicted_n", "predicted_ms")


def request_stats(requests: list[dict[str, Any]]) -> dict[str, Any]:
    """Per-request rates and latencies from llama-server's own timings.

    ``prompt_tokens_per_s`` / ``generation_tokens_per_s``: distribution over requests of
    each request's own rate (tokens / its prompt-eval or eval time), plus ``overall``
    (sum of tokens / sum of time). ``prompt_latency_s``: prompt-eval time per request
    (server-side prefill; excludes queueing and HTTP). Requests whose prompt was served
    entirely from the cache (0 prompt tokens) count for generation only. None where
    there is no data. The same request seen twice (same ``t``/``seq``/figures) counts once.
    """
    # A poller may hand the same scrape to several ticks: count each request once.
    seen: set[tuple[Any, ...]] = set()
    reqs = []
    for r in requests:
        if not isinstance(r, dict):
            continue
        key = tuple(r.get(k) for k in _IDENTITY)
        if key in seen:
            continue
        seen.add(key)
        reqs.append(r)
    p_rates, g_rates, p_lat = [], [], []
    p_tok = g_tok = 0
    p_ms = g_ms = 0.0
    for r in reqs:
        pn, pms, gn, gms = r.get("prompt_n"), r.get("prompt_ms"), r.get("predicted_n"), r.get("predicted_ms")
        if isinstance(pn, int | float) and isinstance(pms, int | float) and pn > 0 and pms > 0:
            p_rates.append(pn / pms * 1e3)
            p_lat.append(pms / 1e3)
            p_tok += int(pn)
            p_ms += pms
        if isinstance(gn, int | float) and isinstance(gms, int | float) and gn > 0 and gms > 0:
            g_rates.append(gn / gms * 1e3)
            g_tok += int(gn)
            g_ms += gms
    pr, gr = _dist(p_rates), _dist(g_rates)
    pr["overall"] = p_tok / p_ms * 1e3 if p_ms > 0 else None
    gr["overall"] = g_tok / g_ms * 1e3 if g_ms > 0 else None
    return {
        "requests": len(reqs),
        "prompt_tokens": p_tok,
        "generation_tokens": g_tok,
        "prompt_tokens_per_s": pr,
        "generation_tokens_per_s": gr,
        "prompt_latency_s": _dist(p_lat),
        "source": "llama-server log (per-request timings)",
    }
