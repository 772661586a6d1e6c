"""`pcie-tui export --prometheus`: the command (options, source, the HTTP server); the state and the
families it serves are in :mod:`pcie_tui.export.prometheus`."""

from __future__ import annotations

import argparse
import ipaddress
import signal
import sys
import threading
from collections.abc import Callable
from typing import Any

from pcie_tui.core.errors import UserError
from pcie_tui.export.prometheus import DEFAULT_PORT, ExportState, PrometheusCollector

# ---- command -----------------------------------------------------------------


def _number(kind: type, lo: float, hi: float, what: str) -> Callable[[str], Any]:
    def conv(text: str) -> Any:
        try:
            v = kind(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"not a number: {text!r}") from None
        if not lo <= v <= hi or (kind is float and v == lo):
            raise argparse.ArgumentTypeError(f"{what}, not {text!r}")
        return v

    return conv


_PORT = _number(int, 0, 65535, "port must be 0..65535 (0: any free port)")
_SPEED = _number(float, 0, 1000, "speed must be > 0 and <= 1000")


def _say(line: str) -> None:
    print(f"pcie-tui: {line}", file=sys.stderr, flush=True)


def register(sub: Any, add_live_options: Callable[[Any], None], open_live: Callable[..., Any]) -> None:
    p = sub.add_parser("export", help="serve live or replayed readings as Prometheus metrics (/metrics)")
    p.add_argument("--prometheus", action="store_true", help="serve Prometheus text format at /metrics")
    p.add_argument("--port", type=_PORT, default=DEFAULT_PORT, help=f"TCP port (default {DEFAULT_PORT}; 0: any)")
    p.add_argument("--host", default="127.0.0.1", help="address to bind (default 127.0.0.1)")
    p.add_argument("--replay", metavar="FILE|DEMO", help="serve a recording or a bundled demo instead of live GPUs")
    p.add_argument("--speed", type=_SPEED, metavar="X", help="replay speed (default 1)")
    p.add_argument("--loop", action="store_true", help="replay: start again at the end")
    add_live_options(p)
    p.set_defaults(func=lambda args: run(args, open_live))


def _is_loopback(host: str) -> bool:
    try:
        return host.lower() == "localhost" or ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


def _open_source(args: argparse.Namespace, open_live: Callable[..., Any]) -> tuple[Any, str, str]:
    """(source, what it is for the status line, recording name or "")."""
    if args.replay is None:
        source, status = open_live(args, interactive=False)
        gpu_side = "engine alone (no GPU side)" if getattr(source, "gpus", None) is None else "live GPUs"
        return source, f"{gpu_side}; {status}", ""
    from pcie_tui.recording import demos
    from pcie_tui.recording.reader import read_recording
    from pcie_tui.recording.replay import ReplaySource

    path, _ = demos.recording_path(args.replay)  # as replay and report read it: a file wins over a demo's name
    speed = args.speed or 1.0
    source = ReplaySource(read_recording(path), speed=speed, loop=args.loop)
    return source, f"replay of {args.replay} at {speed:g}x{', looping' if args.loop else ''}", args.replay


def run(args: argparse.Namespace, open_live: Callable[..., Any]) -> int:
    if not args.prometheus:
        raise UserError("say what to export: --prometheus (the only format so far)")
    if args.replay is None and (args.speed is not None or args.loop):
        raise UserError("--speed and --loop apply to --replay only")
    if args.replay is not None and (args.pid or args.url or args.log or args.gpus or args.stacks or args.no_engine):
        raise UserError("--pid/--url/--log/--gpus/--stacks/--no-engine apply to live collection, not --replay")
    from prometheus_client.registry import CollectorRegistry

    state = ExportState()
    try:  # a collector whose names change with the session: ?name[]= filters need it kept as nameless
        registry = CollectorRegistry(auto_describe=False, support_collectors_without_names=True)
    except TypeError:  # an older prometheus-client: everything but the ?name[]= filter works
        registry = CollectorRegistry(auto_describe=False)
    registry.register(PrometheusCollector(state))
    shown = f"[{args.host}]" if ":" in args.host else args.host
    try:
        httpd = _start_http(args.host, args.port, registry)
    except (OSError, UnicodeError, ValueError) as e:
        why = getattr(e, "strerror", None) or str(e) or type(e).__name__
        raise UserError(f"cannot serve on {shown}:{args.port}: {why}") from None
    if not _is_loopback(args.host):
        _say(f"warning: {args.host} is not a loopback address: anyone who can reach it can read the metrics")
    try:
        return _serve(args, open_live, state, f"http://{shown}:{httpd.server_port}/metrics")
    finally:
        httpd.shutdown()
        httpd.server_close()


def _start_http(host: str, port: int, registry: Any) -> Any:
    """prometheus-client's exposition on /metrics alone, a one-line page at /, 404 elsewhere
    (its own start_http_server answers every path with the metrics); threads, no access log."""
    import socket
    from socketserver import ThreadingMixIn
    from wsgiref.simple_server import WSGIRequestHandler, WSGIServer, make_server

    from prometheus_client import make_wsgi_app

    metrics = make_wsgi_app(registry)

    def app(environ: dict[str, Any], start_response: Callable[..., Any]) -> Any:
        path, method = environ.get("PATH_INFO") or "/", environ.get("REQUEST_METHOD", "GET")
        if path == "/metrics" and method == "HEAD":  # health checks: GET's headers, no body
            for _ in metrics({**environ, "REQUEST_METHOD": "GET"}, start_response):
                pass
            return [b""]
        if path == "/metrics":
            return metrics(environ, start_response)  # prometheus-client's own rules (GET, OPTIONS)
        if method not in ("GET", "HEAD"):
            status, body = "405 Method Not Allowed", b""
        elif path == "/":
            status, body = "200 OK", b"pcie-tui exporter: metrics at /metrics\n"
        else:
            status, body = "404 Not Found", b""
        headers = [("Content-Type", "text/plain; charset=utf-8"), ("Content-Length", str(len(body)))]
        if status.startswith("405"):
            headers.append(("Allow", "GET, HEAD"))
        start_response(status, headers)
        return [b"" if method == "HEAD" else body]

    family = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)[0][0]

    class Server(ThreadingMixIn, WSGIServer):
        daemon_threads = True
        address_family = family

    class Quiet(WSGIRequestHandler):
        def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 - the base class's name
            pass

    httpd = make_server(host, port, app, Server, handler_class=Quiet)
    threading.Thread(target=httpd.serve_forever, name="pcie-tui-http", daemon=True).start()
    return httpd


def _serve(args: argparse.Namespace, open_live: Callable[..., Any], state: ExportState, url: str) -> int:
    source, what, recording = _open_source(args, open_live)
    stop, outcome = threading.Event(), {}
    events = getattr(getattr(source, "recording", None), "events", ()) or ()
    state.start(source.header, "live" if source.live else "replay", recording, events)
    drain = getattr(source, "drain_events", None)

    def loop() -> None:
        try:
            while not stop.is_set():
                s = source.read()
                if s is None:
                    state.finish()  # the answer gauges are now final: what report says
                    break
                if drain is not None:
                    state.note_events(drain())
                state.feed(s)
        except Exception as e:  # a failing collector must stop the command with a line, not hang it
            outcome["error"] = f"{type(e).__name__}: {e}"[:200]
            stop.set()

    worker = threading.Thread(target=loop, name="pcie-tui-export", daemon=True)
    old_term = signal.signal(signal.SIGTERM, lambda *_: stop.set())
    _say(f"serving Prometheus metrics at {url} ({what}); Ctrl-C to stop")
    worker.start()
    ended = False
    try:
        while not stop.wait(0.2):
            if not (ended or worker.is_alive()):
                ended = True
                _say("the source ended; still serving its last readings (Ctrl-C to stop)")
    except KeyboardInterrupt:
        pass
    finally:
        stop.set()
        if not source.live:
            source.close()  # wakes a replay waiting for its next tick; a live source is closed after its read
        worker.join(timeout=5.0)
        source.close()
        signal.signal(signal.SIGTERM, old_term)
    if "error" in outcome:
        _say(f"error: collection stopped: {outcome['error']}")
        return 1
    return 0
