"""Engine HTTP: bounded GETs (a kept-alive connection per thread and server, or a fresh one), URL checks."""

from __future__ import annotations

import http.client
import threading
import time
from urllib.parse import urlsplit

from pcie_tui.core.errors import UserError

# Deadline of one scrape of a Python API server (vLLM, SGLang) or Ollama. The poller runs in its own
# thread, so a slow answer only arrives late; a deadline shorter than the server's answer under load
# would miss every scrape. A loaded vLLM API server on 2 cores answered /metrics in up to 0.7 s, and a
# CI run with a 0.3 s deadline recorded 5 s of "down" while it served 240 requests.
SCRAPE_TIMEOUT_S = 2.0

# Largest engine answer read (vLLM's /metrics is ~100 kB); a bigger one is one failed scrape.
MAX_BODY_BYTES = 2 << 20


class AnswerTooLarge(OSError):
    """The answer passed MAX_BODY_BYTES; it was not read."""


# One kept-alive connection per thread and server: a scrape every tick then costs a request,
# not a TCP handshake plus a fresh server-side connection (llama-server, uvicorn keep them open).
_conns = threading.local()
_STALE = (http.client.RemoteDisconnected, ConnectionResetError, BrokenPipeError, ConnectionAbortedError)


# Local ports of pcie-tui's own open connections to engines (every thread): an engine's list of its
# clients (pcie_tui.engines.llamacpp.conns) leaves them out.
_OWN_PORTS: set[int] = set()


def own_client_ports() -> frozenset[int]:
    """The local ports of this process's open engine connections."""
    return frozenset(_OWN_PORTS)


def _port(conn: http.client.HTTPConnection) -> int | None:
    try:
        return int(conn.sock.getsockname()[1]) if conn.sock is not None else None
    except (OSError, IndexError, TypeError):
        return None


def _drop(key: tuple[str, str, int | None]) -> None:
    pool: dict[tuple[str, str, int | None], http.client.HTTPConnection] = getattr(_conns, "pool", {})
    conn = pool.pop(key, None)
    if conn is not None:
        _OWN_PORTS.discard(_port(conn) or -1)
        conn.close()


def http_request(
    scheme: str, host: str, port: int | None, path: str, timeout_s: float, *, reuse: bool = True
) -> tuple[int, bytes, dict[str, str]]:
    """GET ``path`` within about ``timeout_s`` in all (connect + headers + body): (status, body, headers).

    Reuses this thread's open connection to the server when it has one; a connection the server
    closed meanwhile is replaced once. Raises OSError (TimeoutError, ConnectionRefusedError,
    AnswerTooLarge, ...) or http.client.HTTPException; the connection is dropped on any failure.
    """
    pool: dict[tuple[str, str, int | None], http.client.HTTPConnection] = _conns.__dict__.setdefault("pool", {})
    key = (scheme, host, port)
    deadline = time.monotonic() + timeout_s
    for attempt in (0, 1):
        conn = pool.get(key)
        reused = conn is not None
        if conn is None:
            cls = http.client.HTTPSConnection if scheme == "https" else http.client.HTTPConnection
            conn = pool[key] = cls(host, port, timeout=timeout_s)
        try:
            if conn.sock is not None:
                conn.sock.settimeout(max(1e-3, deadline - time.monotonic()))
            conn.request("GET", path, headers={"Accept": "*/*", "User-Agent": "pcie-tui"})
            if not reused and (port := _port(conn)) is not None:
                _OWN_PORTS.add(port)
            resp = conn.getresponse()
            chunks: list[bytes] = []
            size = 0
            while True:
                left = deadline - time.monotonic()
                if left <= 0:
                    raise TimeoutError("timed out")
                if conn.sock is not None:
                    conn.sock.settimeout(left)
                chunk = resp.read1(65536)
                if not chunk:
                    break
                chunks.append(chunk)
                size += len(chunk)
                if size > MAX_BODY_BYTES:
                    raise AnswerTooLarge(f"answer larger than {MAX_BODY_BYTES >> 20} MB; not read")
            # read1 leaves a fully read Content-Length answer open; closed, the connection serves the next.
            resp.close()
            if resp.will_close or not reuse:
                _drop(key)
            return resp.status, b"".join(chunks), {k.lower(): v for k, v in resp.getheaders()}
        except _STALE:
            _drop(key)
            if not (reused and attempt == 0):
                raise
        except BaseException:
            _drop(key)
            raise
    raise AssertionError("unreachable")  # pragma: no cover


def normalize_url(url: str) -> str:
    """``host:port`` or ``http://host:port/`` -> ``http://host:port``; UserError when unusable."""
    u = url.strip()
    if "://" not in u:
        u = "http://" + u
    parts = urlsplit(u)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise UserError(f"not an engine URL: {url!r} (expected e.g. http://127.0.0.1:8000)")
    try:
        parts.port  # noqa: B018 - raises ValueError on a bad port
    except ValueError:
        raise UserError(f"bad port in URL {url!r}") from None
    return f"{parts.scheme}://{parts.netloc}{parts.path.rstrip('/')}"


def http_get(url: str, timeout_s: float) -> tuple[int, bytes]:
    """GET with a total deadline of about ``timeout_s`` (connect + headers + body); no proxies.

    Raises OSError (TimeoutError, ConnectionRefusedError, ...) on failure.
    """
    parts = urlsplit(url)
    path = parts.path or "/"
    if parts.query:
        path += "?" + parts.query
    try:
        # vLLM's API server: a fresh connection per scrape, as before kept-alive scrapes were added
        # for llama-server (a vLLM run with reused connections saw one scrape marked down under load).
        status, body, _ = http_request(
            parts.scheme, parts.hostname or "127.0.0.1", parts.port, path, timeout_s, reuse=False
        )
    except http.client.HTTPException as e:
        raise OSError(f"bad HTTP response: {type(e).__name__}") from None
    return status, body


def failure_reason(e: BaseException) -> str:
    """Short human reason for a failed request: "timed out", "connection refused", else the error text."""
    inner = getattr(e, "reason", None)  # urllib's URLError wraps the socket error
    text = str(inner if inner is not None else e)
    if isinstance(e, TimeoutError) or isinstance(inner, TimeoutError) or "timed out" in text:
        return "timed out"
    if (
        isinstance(e, ConnectionRefusedError)
        or isinstance(inner, ConnectionRefusedError)
        or "Connection refused" in text
    ):
        return "connection refused"
    return text[:120] or type(e).__name__
