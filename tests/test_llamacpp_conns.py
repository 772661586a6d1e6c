"""Arrivals from the server's TCP connections (pcie_tui.engines.llamacpp.conns) and how the request clock
uses them: a request that waited in llama-server's queue while its loop was inside a batch (a slot free,
so not counted as deferred) is seen arriving when its client connected."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time

import pytest

from pcie_tui.engines import http
from pcie_tui.engines.llamacpp.clock import SOURCE_CONN, RequestClock
from pcie_tui.engines.llamacpp.conns import Connections, parse_tcp_table

TABLE = """\
  sl  local_address rem_address   st tx_queue rx_queue tr tm->when retrnsmt   uid  timeout inode
   0: 0100007F:1F90 00000000:0000 0A 00000000:00000000 00:00000000 00000000     0        0 100 1 0 100 0 0 10 0
   1: 0100007F:1F90 0100007F:C350 01 00000000:00000000 00:00000000 00000000     0        0 101 1 0 100 0 0 10 0
   2: 0100007F:1F90 0100007F:C351 01 00000000:00000000 00:00000000 00000000     0        0 102 1 0 100 0 0 10 0
   3: 0100007F:C351 0100007F:1F90 01 00000000:00000000 00:00000000 00000000     0        0 555 1 0 100 0 0 10 0
   4: 0100007F:1F90 0100007F:C352 06 00000000:00000000 00:00000000 00000000     0        0 0 1 0 100 0 0 10 0
   5: 0100007F:1F91 0100007F:C353 01 00000000:00000000 00:00000000 00000000     0        0 104 1 0 100 0 0 10 0
"""


def test_table_lists_established_clients_of_the_port_less_our_own():
    # Port 8080 (1F90): two established clients (50000, 50001), 50001 one of pcie-tui's own; 50002 is in
    # TIME_WAIT (06); 8081 is another port; the row with local port 50001 is the client end.
    assert parse_tcp_table(TABLE, 8080) == {("0100007F", 50000), ("0100007F", 50001)}
    assert parse_tcp_table(TABLE, 8080, frozenset({50001})) == {("0100007F", 50000)}
    assert parse_tcp_table(TABLE, 9999) == set()


def test_a_real_client_connection_is_new_once_and_ours_never():
    srv = socket.socket()
    srv.bind(("127.0.0.1", 0))
    srv.listen(8)
    port = srv.getsockname()[1]
    conns = Connections(os.getpid(), port)  # this process plays the server
    assert conns.poll() == (set(), set())
    code = f"import socket, time; s = socket.create_connection(('127.0.0.1', {port})); time.sleep(1.5)"
    child = subprocess.Popen([sys.executable, "-c", code])
    try:
        accepted, _ = srv.accept()
        new, now = conns.poll()
        assert len(new) == 1 and now == new
        # pcie-tui's own scrape (engines.http keeps its port): left out; a client of this process: counted.
        with pytest.MonkeyPatch.context() as mp:
            mine = socket.create_connection(("127.0.0.1", port))
            theirs, _ = srv.accept()
            mp.setattr(http, "_OWN_PORTS", {mine.getsockname()[1]})
            assert conns.poll() == (set(), now)
            mine.close()
            theirs.close()
        child.wait(timeout=10)
        accepted.close()
        deadline = time.monotonic() + 5
        while conns.poll()[1] and time.monotonic() < deadline:
            time.sleep(0.05)
        assert conns.poll() == (set(), set())
    finally:
        child.kill()
        srv.close()


def _line(t: float, text: str) -> str:
    m, s = divmod(t, 60)
    return (
        f"{int(m)}.{int(s):02d}.{int(round((s % 1) * 1e6)) // 1000:03d}.{int(round((s % 1) * 1e6)) % 1000:03d} I {text}"
    )


def _finish(clock: RequestClock, task: int, slot: int, t_end: float, prompt_ms: float) -> dict:
    rec = {"task": task, "prompt_ms": prompt_ms, "predicted_ms": 100.0, "predicted_n": 5}
    line = _line(t_end, f"slot print_timing: id  {slot} | task {task} | total time = 1 ms")
    assert clock.finish(rec, 1000.0 + t_end, line)
    return clock.timeline(task)


def test_the_clock_takes_the_arrival_from_the_connection():
    """The loop was inside a 3 s batch (a gauge reading went unanswered): the request connected at ~0.05 s
    and was given a slot at 3.2 s (wall = 1000 + log time). A connection open before pcie-tui attached, and
    one that closed before the slot was given, claim nothing."""
    clock = RequestClock()
    clock.feed_line(_line(0.0, "srv  llama_server: listening"), 1000.0)
    clock.feed_deferred(1000.01, 0.0, 1000.0)  # answered at once: the loop was free
    clock.feed_deferred(1000.6, None, 1000.3)  # asked and not answered: the loop went into a batch
    clock.feed_connections(None, 1000.0, set(), {"old"})  # open before the first poll
    clock.feed_connections(1000.0, 1000.1, {"a", "probe"}, {"old", "a", "probe"})
    clock.feed_connections(1000.1, 1000.2, set(), {"old", "a"})  # the probe closed
    for t in (0.3, 1.0, 2.0, 3.0):
        clock.feed_connections(1000.0 + t - 0.1, 1000.0 + t, set(), {"old", "a"})
    clock.lines_read(1003.0)  # the log read up to then: the gauge readings before it are placed
    clock.feed_line(_line(3.2, "slot get_availabl: id  0 | task -1 | selected slot by LRU, t_last = -1"), 1003.25)
    clock.feed_line(_line(3.2, "slot launch_slot_: id  0 | task 7 | processing task, is_child = 0"), 1003.25)
    clock.feed_connections(1003.0, 1003.3, set(), {"old", "a"})
    tl = _finish(clock, 7, 0, 4.0, 300.0)
    assert tl["t_arrive"] == pytest.approx(1000.05, abs=1e-3)  # the middle of the poll that first saw it
    assert tl["queue_s"] == pytest.approx(3.15, abs=1e-3) and tl["timeline_source"] == SOURCE_CONN
    assert tl["client_ttft_s"] == pytest.approx(4.0 - 0.1 - 0.05, abs=1e-3)  # first token at end - eval time


def test_without_a_fitting_connection_the_other_evidence_stays():
    clock = RequestClock()
    clock.feed_line(_line(0.0, "srv  llama_server: listening"), 1000.0)
    clock.feed_connections(None, 1000.0, set(), set())
    clock.feed_line(_line(0.5, "slot get_availabl: id  0 | task -1 | selected slot by LRU, t_last = -1"), 1000.55)
    clock.feed_line(_line(0.5, "slot launch_slot_: id  0 | task 3 | processing task, is_child = 0"), 1000.55)
    clock.feed_connections(1000.0, 1000.6, set(), set())  # a keep-alive client: no new connection
    tl = _finish(clock, 3, 0, 1.0, 300.0)
    assert tl["queue_s"] == 0.0 and tl["timeline_source"] != SOURCE_CONN


def test_idle_stops_the_table_and_starts_over():
    """Nothing outstanding: the table is not read; what it said is forgotten, so a connection seen before the
    pause (a client kept alive) claims no later request."""
    clock = RequestClock()
    clock.feed_line(_line(0.0, "slot get_availabl: id  0 | task -1 | selected slot by LRU, t_last = -1"), 1000.0)
    clock.feed_connections(None, 1000.0, set(), set())
    clock.feed_connections(1000.0, 1000.1, {"kept"}, {"kept"})
    clock.forget_connections()
    clock.feed_connections(None, 1005.0, set(), {"kept"})  # starts over: "kept" is from before
    clock.feed_line(_line(5.2, "slot launch_slot_: id  0 | task 9 | processing task, is_child = 0"), 1005.2)
    clock.feed_connections(1005.0, 1005.3, set(), {"kept"})
    tl = _finish(clock, 9, 0, 6.0, 300.0)
    assert tl["timeline_source"] != SOURCE_CONN


def test_a_burst_on_an_idle_server_arrived_after_the_last_idle_read():
    """4 slots, 4 clients at once on an idle server (the GPU case np4c4): the first is taken at once, the other
    three after the first prompt batch (3 s). The table was not read while idle; the first read after it
    counts every open connection as arrived since the last idle read."""
    clock = RequestClock()
    clock.feed_line(_line(0.0, "srv  llama_server: listening"), 1000.0)
    clock.feed_deferred(1000.01, 0.0, 1000.0)
    clock.feed_deferred(1000.6, None, 1000.3)  # the loop went into the first prompt batch
    clock.forget_connections()  # idle: not read; the last idle read at 1000.0
    lines = [(0.06, 0, 50), (3.19, 1, 52), (3.19, 2, 53), (3.19, 3, 54)]
    clock.feed_line(_line(0.06, "slot get_availabl: id  0 | task -1 | selected slot by LRU, t_last = -1"), 1000.1)
    clock.feed_line(_line(0.06, "slot launch_slot_: id  0 | task 50 | processing task, is_child = 0"), 1000.1)
    clock.feed_connections(1000.0, 1000.1, {"a", "b", "c", "d"}, {"a", "b", "c", "d"})
    clock.lines_read(1003.0)
    for t, slot, task in lines[1:]:
        clock.feed_line(
            _line(t, f"slot get_availabl: id  {slot} | task -1 | selected slot by LRU, t_last = -1"), 1003.2
        )
        clock.feed_line(
            _line(t, f"slot launch_slot_: id  {slot} | task {task} | processing task, is_child = 0"), 1003.2
        )
    clock.feed_connections(1003.1, 1003.3, set(), {"a", "b", "c", "d"})
    first = _finish(clock, 50, 0, 8.0, 500.0)
    assert first["queue_s"] == pytest.approx(0.0, abs=0.06)
    for task, slot in ((52, 1), (53, 2), (54, 3)):
        tl = _finish(clock, task, slot, 9.0 + slot, 500.0)
        assert tl["queue_s"] == pytest.approx(3.19 - 0.05, abs=0.06), tl  # not half the batch (1.6 s)


def test_requests_taken_up_while_the_table_was_not_read_claim_their_connections():
    """Two clients kept busy on 4 slots: the table resumes after idle while both first requests run; their
    connections are theirs, so the next request (connected much later) is not given one of theirs (its TTFT
    read twice the clients' in a full CI run before this)."""
    clock = RequestClock()
    clock.feed_line(_line(0.0, "srv  llama_server: listening"), 1000.0)
    clock.forget_connections()  # idle; the last idle read at 1000.0
    for slot, task in ((0, 10), (1, 11)):
        clock.feed_line(
            _line(0.05, f"slot get_availabl: id  {slot} | task -1 | selected slot by LRU, t_last = -1"), 1000.1
        )
        clock.feed_line(
            _line(0.05, f"slot launch_slot_: id  {slot} | task {task} | processing task, is_child = 0"), 1000.1
        )
    clock.feed_connections(1000.0, 1000.2, {"a", "b"}, {"a", "b"})  # resumed: a and b belong to tasks 10, 11
    clock.feed_connections(1000.2, 1001.8, set(), {"a", "b"})
    clock.feed_connections(1001.8, 1002.0, {"c"}, {"a", "b", "c"})  # a third client connects at ~1001.9
    clock.feed_deferred(1000.31, 0.0, 1000.3)
    clock.feed_deferred(1001.9, None, 1001.6)  # the loop busy in a prompt batch: a free-slot request waited
    clock.lines_read(1002.0)
    clock.feed_line(_line(2.0, "slot get_availabl: id  2 | task -1 | selected slot by LRU, t_last = -1"), 1002.05)
    clock.feed_line(_line(2.0, "slot launch_slot_: id  2 | task 12 | processing task, is_child = 0"), 1002.05)
    clock.feed_connections(1002.0, 1002.1, set(), {"a", "b", "c"})
    tl = _finish(clock, 12, 2, 3.0, 300.0)
    assert tl["queue_s"] < 0.2, tl  # its own connection (c), not a's from 1000.0
