"""A stand-in HTTP server on 127.0.0.1 at a free port, answering GETs from a routes table (tests of the engines'
clients against payloads captured from, or written after, servers that do not run here)."""

from __future__ import annotations

import http.server
import threading
from collections.abc import Iterator
from contextlib import contextmanager


@contextmanager
def serve(
    routes: dict[str, tuple[int, bytes]], missing: bytes = b"404 page not found", hits: list[str] | None = None
) -> Iterator[str]:
    """Yields the server's URL. ``routes[path] = (status, body)``, read at each request (a test may change it);
    another path gets 404 with ``missing``; each path asked is appended to ``hits`` when given."""

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:  # noqa: N802 - http.server's name
            if hits is not None:
                hits.append(self.path)
            status, body = routes.get(self.path, (404, missing))
            self.send_response(status)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *a: object) -> None:
            pass

    srv = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    try:
        yield f"http://127.0.0.1:{srv.server_address[1]}"
    finally:
        srv.shutdown()
        srv.server_close()
