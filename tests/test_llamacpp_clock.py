"""RequestClock on real llama-server captures (b11434, CPU): the log lines as read at 10 Hz, the deferred gauge
as scraped at 10 Hz, and what each streaming client measured (tests/fixtures/llamacpp-b11434-queue, numbers
only). The clients' TTFT quantiles are the truth; the server's prompt eval time alone is several times low."""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import pytest

from pcie_tui.engines.llamacpp.clock import RequestClock, log_stamp_s
from pcie_tui.engines.llamacpp.log import TimingParser

FIX = Path(__file__).parent / "fixtures" / "llamacpp-b11434-queue"


def _q(vals, p):
    v = sorted(vals)
    return v[min(len(v) - 1, round(p * (len(v) - 1)))]


def _load(name: str) -> dict:
    with gzip.open(FIX / f"{name}.json.gz", "rt") as f:
        return json.load(f)


def _replay(name: str):
    d = _load(name)
    clock, parser = RequestClock(), TimingParser()
    gauge = [(t, 1, (sent, x)) for sent, t, x in d["gauge"]]
    events = sorted([(t, 0, x) for t, x in d["lines"]] + gauge, key=lambda e: e[:2])
    done, last_read = [], None
    for t, kind, x in events:
        if kind == 1:
            clock.feed_deferred(t, x[1], t_sent=x[0])
            continue
        if t != last_read:
            clock.lines_read(t)
            last_read = t
        clock.feed_line(x, t)
        rec = parser.feed(x)
        if rec is not None:
            assert clock.finish(rec, t, x)
            done.append(rec["task"])
    out = [clock.timeline(task) for task in done]
    clients = [c["t_first"] - c["t_send"] for c in d["clients"]]
    return d, out, clients


@pytest.mark.parametrize(("name", "p95"), [("np1c4", True), ("np4c16", True), ("np4c4", False)])
def test_client_ttft_from_the_log_and_the_gauge(name, p95):
    d, out, clients = _replay(name)
    assert len(out) == len(clients) and all(t is not None for t in out)
    ttft = [t["client_ttft_s"] for t in out]
    assert _q(ttft, 0.5) == pytest.approx(_q(clients, 0.5), rel=0.15)
    if p95:
        assert _q(ttft, 0.95) == pytest.approx(_q(clients, 0.95), rel=0.15)
    for t in out:
        assert t["queue_s"] >= 0 and t["slot_setup_s"] >= 0 and t["batch_wait_s"] >= 0
        assert t["client_ttft_s"] >= t["queue_s"] + t["slot_setup_s"]
    if d["conc"] > d["np"]:
        assert sum(t["queue_s"] for t in out) / len(out) > 0.5 * (sum(clients) / len(clients))


def test_without_the_gauge_a_waiting_request_reads_low_not_wrong_sign():
    """No /metrics (no --metrics): slot waits are not seen; every figure stays >= the prefill."""
    d = _load("np1c4")
    clock, parser = RequestClock(), TimingParser()
    out = []
    for t, line in d["lines"]:
        clock.lines_read(t)
        clock.feed_line(line, t)
        rec = parser.feed(line)
        if rec is not None and clock.finish(rec, t, line):
            out.append((rec, clock.timeline(rec["task"])))
    assert out
    for rec, tl in out:
        assert tl["client_ttft_s"] >= rec["prompt_ms"] / 1e3 - 1e-6
        assert tl["queue_s"] == pytest.approx(0.0)


def test_log_stamps_and_a_request_whose_start_was_not_seen():
    assert log_stamp_s("0.01.380.162 I slot print_timing: id  0 | task 14 | ...") == pytest.approx(1.380162)
    assert log_stamp_s("125.03.000.001 W srv x") == pytest.approx(125 * 60 + 3.000001)
    assert log_stamp_s("slot print_timing: id  0 | task 14 |") is None
    clock = RequestClock()
    rec = {"task": 99, "prompt_ms": 10.0, "predicted_ms": 5.0, "predicted_n": 3}
    assert clock.finish(rec, 1.0, "0.00.900.000 I slot print_timing: id  0 | task 99 | total time = 15 ms") is False
    assert clock.timeline(99) is None and clock.ready(99, 1.0)


def test_a_cancelled_request_holds_nobody_up():
    """A request released without timings (its client went away) does not hold later ones back."""
    clock = RequestClock()
    lines = [
        "0.00.100.000 I slot get_availabl: id  0 | task -1 | selected slot by LRU, t_last = -1",
        "0.00.100.100 I slot launch_slot_: id  0 | task 5 | processing task, is_child = 0",
        "0.00.100.200 I slot get_availabl: id  1 | task -1 | selected slot by LRU, t_last = -1",
        "0.00.100.300 I slot launch_slot_: id  1 | task 6 | processing task, is_child = 0",
        "0.00.400.000 I slot      release: id  0 | task 5 | stop processing: n_tokens = 3, truncated = 0",
    ]
    for line in lines:
        clock.feed_line(line, 1000.5)
    rec = {"task": 6, "prompt_ms": 200.0, "predicted_ms": 100.0, "predicted_n": 11}
    assert clock.finish(rec, 1000.6, "0.00.400.300 I slot print_timing: id  1 | task 6 | total time = 300 ms")
    assert clock.ready(6, 1000.6)
    tl = clock.timeline(6)
    assert tl["client_ttft_s"] == pytest.approx(0.2001, abs=1e-3) and tl["queue_s"] == 0.0


def test_the_log_says_what_a_busy_loop_is_doing():
    """Between 'selected slot' and 'processing task' the server saves and loads its prompt cache: housekeeping;
    a started request that has not ended: prefill (or what /slots last showed); nothing open: not known."""
    clock = RequestClock()
    t_wall = 1000.0
    clock.feed_line("0.00.100.000 I slot get_availabl: id  0 | task -1 | selected slot by LRU, t_last = -1", t_wall)
    assert clock.busy_with(t_wall + 2.0) == "housekeeping" and clock.open_requests() == 1
    clock.feed_line("0.02.600.000 I slot launch_slot_: id  0 | task 7 | processing task, is_child = 0", t_wall + 2.5)
    assert clock.busy_with(t_wall + 2.6) == "prefill"
    rec = {"task": 7, "prompt_ms": 300.0, "predicted_ms": 100.0, "predicted_n": 5}
    assert clock.finish(rec, t_wall + 3.1, "0.03.000.000 I slot print_timing: id  0 | task 7 | total time = 400 ms")
    assert clock.busy_with(t_wall + 3.2) is None and clock.open_requests() == 0
    tl = clock.timeline(7)
    assert tl["slot_setup_s"] == pytest.approx(2.5) and tl["client_ttft_s"] == pytest.approx(2.5 + 0.3, abs=1e-6)


def test_a_request_that_came_while_the_loop_was_inside_a_batch_waited_for_it():
    """A free slot, but the server's loop was inside a long prompt batch (the gauge went unanswered): the
    request waited in the server's queue, not counted as deferred. Seen on an H200: 4 requests at once,
    the first one's 2.9 s batch ran before the other three were looked at."""
    clock = RequestClock()
    w = 1000.0  # wall time of the server's log time 0
    clock.feed_line("0.00.000.000 I slot print_timing: id  3 | task 1 |    graphs reused = 1", w)
    clock.feed_deferred(w + 0.01, 0.0, t_sent=w + 0.005)  # answered at once: the loop idle
    clock.feed_deferred(w + 0.4, None, t_sent=w + 0.1)  # asked, never answered: the loop is in a batch
    lines = [
        "0.02.900.000 I slot get_availabl: id  0 | task -1 | selected slot by LRU, t_last = -1",
        "0.02.900.100 I slot launch_slot_: id  0 | task 9 | processing task, is_child = 0",
    ]
    for line in lines:
        clock.feed_line(line, w + 3.0)
    clock.feed_deferred(w + 2.95, 0.0, t_sent=w + 2.5)
    clock.lines_read(w + 5.0)
    rec = {"task": 9, "prompt_ms": 1000.0, "predicted_ms": 100.0, "predicted_n": 5}
    assert clock.finish(rec, w + 4.1, "0.04.000.100 I slot print_timing: id  0 | task 9 | total time = 1100 ms")
    tl = clock.timeline(9)
    # It came between the last prompt answer (0.01 s) and being taken (2.9 s): the middle, 1.45 s.
    assert tl["queue_s"] == pytest.approx((2.9 - 0.01) / 2, abs=1e-3)
    assert tl["client_ttft_s"] == pytest.approx(tl["queue_s"] + 1.0001, abs=1e-3)
