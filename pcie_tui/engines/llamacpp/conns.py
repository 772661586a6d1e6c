"""Client connections to llama-server's port, as the kernel lists them: when each request arrived.

A request that finds every slot busy is counted by llama-server's ``requests_deferred`` gauge, but one
that arrives while the server's one loop is inside a batch (seconds, with host weights streaming over the
link) waits unseen: the gauge and ``/slots`` wait for the same loop, and the log says nothing until the
request is given a slot. The kernel knows sooner: the HTTP thread accepts the client's TCP connection at
once. Each poll reads the server's TCP table (``/proc/<pid>/net/tcp`` and ``tcp6``, the server's own
network namespace) and lists the established connections on the server's listening port; a connection
not there at the previous poll arrived between the two polls.

Connections of pcie-tui's own scrapes are left out (pcie_tui.engines.http keeps their client ports). A client that
keeps one connection open for several requests (HTTP keep-alive) shows only its first request here; the
clock falls back to its other evidence for the rest. Reads numbers only (addresses, ports, states).
"""

from __future__ import annotations

import time

from pcie_tui.engines.http import own_client_ports

_ESTABLISHED = "01"


def parse_tcp_table(text: str, port: int, own_ports: frozenset[int] = frozenset()) -> set[tuple[str, int]]:
    """Remote (address, port) of each established connection whose local port is ``port``, from the text of
    ``/proc/net/tcp`` or ``tcp6`` (``sl local_address rem_address st ...``, addresses as HEX:PORT), less the
    ones from pcie-tui's own client ports ``own_ports``."""
    want = f":{port:04X}"
    out: set[tuple[str, int]] = set()
    for line in text.splitlines()[1:]:
        parts = line.split(None, 4)
        if len(parts) < 4 or parts[3] != _ESTABLISHED or not parts[1].endswith(want):
            continue
        addr, _, rport = parts[2].rpartition(":")
        try:
            p = int(rport, 16)
        except ValueError:
            continue
        if p not in own_ports:
            out.add((addr, p))
    return out


def _listening(text: str, port: int) -> bool:
    want = f":{port:04X}"
    return any(len(p) > 3 and p[3] == "0A" and p[1].endswith(want) for p in map(str.split, text.splitlines()[1:]))


class Connections:
    """The server's client connections, polled: which are new since the last poll."""

    def __init__(self, pid: int, port: int) -> None:
        self.pid = pid
        self.port = port
        self.error: str | None = None
        self._seen: set[tuple[str, int]] | None = None  # None until the first poll
        self._tables: tuple[str, ...] = ("tcp", "tcp6")  # narrowed to where the listener is, once found

    def reset(self) -> None:
        """Start over: the next poll's connections are all from before."""
        self._seen = None

    def poll(self) -> tuple[set[tuple[str, int]], set[tuple[str, int]]] | None:
        """(connections new since the last poll, connections now open), pcie-tui's own left out; None when
        the table cannot be read (``error`` says why). The first poll's connections are all open, none new."""
        now: set[tuple[str, int]] = set()
        read = False
        mine = own_client_ports()
        listens = []
        for name in self._tables:
            try:
                with open(f"/proc/{self.pid}/net/{name}") as f:
                    text = f.read()
            except OSError as e:
                self.error = f"cannot read /proc/{self.pid}/net/{name}: {e.strerror}"
                continue
            read = True
            now |= parse_tcp_table(text, self.port, mine)
            if self._seen is None and _listening(text, self.port):
                listens.append(name)
        if not read:
            return None
        if self._seen is None and listens:
            self._tables = tuple(listens)  # each later poll reads only the table the server listens in
        self.error = None
        new = set() if self._seen is None else now - self._seen
        self._seen = now
        return new, now


class IdleArrivals:
    """Connections that arrive while the server shows nothing outstanding and stay open with no request
    taken up: the server is receiving or tokenising a request it has not given a slot yet (its loop, its
    gauges and its log say nothing until then; a long prompt takes a noticeable time). Read only while the
    log shows nothing outstanding, and at most ``cpu_share`` of a core: every poll where the table is cheap
    to read, less often where it is not (a few ms a read under some sandboxes). A connection open before
    the first read (an idle keep-alive client) is not an arrival; one that closes without a request
    taken up (a health probe) stops counting when it closes."""

    def __init__(self, pid: int, port: int, cpu_share: float = 0.01, min_every_s: float = 0.1) -> None:
        self.conns = Connections(pid, port)
        self.cpu_share, self.min_every_s = cpu_share, min_every_s
        self.every_s = min_every_s
        self.pending: frozenset[tuple[str, int]] = frozenset()
        self._next = float("-inf")

    def reset(self) -> None:
        """Something is outstanding now: the next idle stretch starts from a fresh reading."""
        self.conns.reset()
        self.pending = frozenset()
        self._next = float("-inf")

    def poll(self, now: float) -> None:
        """One reading, unless the last was less than ``every_s`` ago (``now``: a monotonic clock)."""
        if now < self._next:
            return
        c0 = time.perf_counter()
        got = self.conns.poll()
        cost = time.perf_counter() - c0
        self.every_s = max(self.min_every_s, cost / self.cpu_share)
        self._next = now + self.every_s
        if got is None:
            self.pending = frozenset()
            return
        new, open_now = got
        self.pending = frozenset((self.pending | new) & open_now)
