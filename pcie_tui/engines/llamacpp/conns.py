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
