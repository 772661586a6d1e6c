"""Command line: builds a source and hands it to an output (TUI, recorder, report)."""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import signal
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, NoReturn

from pcie_tui import __version__
from pcie_tui.cli.args import (
    INTERVAL_MAX_S,
    INTERVAL_MIN_S,
    SPEED_MAX,
    gpu_list,
    one_blas_thread,
    pick_engine,
    piped_width,
    positive,
)
from pcie_tui.cli.args import need_terminal as _need_terminal
from pcie_tui.core.errors import OutputError, UserError


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> NoReturn:
        # One line, not argparse's usage block.
        self.exit(2, f"{self.prog}: error: {message} (see {self.prog} --help)\n")


def _add_live_options(p: argparse.ArgumentParser) -> None:
    from pcie_tui.engines import registry

    timed = " or ".join(e.display for e in registry.engines() if e.per_request_timing) or "engine"
    p.add_argument(
        "--interval",
        type=positive(float, hi=INTERVAL_MAX_S, lo=INTERVAL_MIN_S),
        default=0.1,
        metavar="S",
        help="seconds between ticks, 0.01-60 (default 0.1 = 10 Hz)",
    )
    p.add_argument(
        "--gpus", type=gpu_list, default=None, metavar="LIST", help="GPU indices to watch, e.g. 0,1 (default all)"
    )
    p.add_argument(
        "--pid", type=positive(int), default=None, help=f"attach to this engine process ({registry.displays()})"
    )
    p.add_argument("--url", default=None, help="attach to the engine serving at this URL, e.g. http://127.0.0.1:8000")
    p.add_argument("--log", default=None, metavar="FILE", help=f"{timed} log file to parse per-request timings from")
    p.add_argument("--no-engine", action="store_true", help="do not look for an inference engine; GPU only")
    p.add_argument(
        "--stacks", action="store_true", help="sample the engine's Python stacks with py-spy (needs ptrace rights)"
    )


# ---- sources -----------------------------------------------------------------


def open_gpus(indices: list[int] | None) -> Any:
    from pcie_tui.sources.nvml import NvmlCollector

    return NvmlCollector(indices)


def open_engine(args: argparse.Namespace, gpus: Any, interactive: bool) -> tuple[Any, str]:
    """Attach to an engine per --pid/--url or discovery. Returns (poller or None, a status line)."""
    if args.no_engine:
        return None, "engine: not looked for (--no-engine)"
    from pcie_tui.engines import discover as process
    from pcie_tui.engines import registry
    from pcie_tui.engines.poller import EnginePoller

    running = gpus.running_pids() if gpus is not None else None
    if args.log is not None and not Path(args.log).is_file():
        print(
            f"pcie-tui: warning: --log {args.log}: no such file (yet); per-request timings start once it appears",
            file=sys.stderr,
        )
    if args.pid is not None or args.url is not None:
        client = process.attach(pid=args.pid, url=args.url, log_path=args.log, running_pids=running)
    else:
        found = process.discover()
        if not found:
            # The status line says what follows only where GPUs are shown (open_live words the other case).
            return None, f"engine: no {registry.displays()} process found" + (
                "; showing GPUs only" if gpus is not None else ""
            )
        cand = found[0] if len(found) == 1 else pick_engine(found, interactive)
        client = process.attach(pid=cand.pid, url=cand.url, log_path=args.log, running_pids=running)
    # An engine whose client asks for it is read faster (llama-server: its request timeline counts slot
    # waits from the deferred gauge, so the gauge is read at 10 Hz; it answers between batches, cheaply).
    poller = EnginePoller(client, interval_s=getattr(client, "poll_interval_s", 0.5), stacks=args.stacks)
    poller.start()
    d = poller.describe()
    name = registry.display(d.get("kind"))
    pid = d.get("pid")
    # --url to a server in another namespace or on another host: no local process to name.
    if pid is None:
        return poller, f"engine: attached to {name} at {d.get('url')} (no local process found for it)"
    return poller, f"engine: attached to {name} pid {pid} at {d.get('url')}"


def open_live(args: argparse.Namespace, interactive: bool) -> tuple[Any, str]:
    """GPUs plus engine. Without NVML (no driver, a CPU box) the engine side runs alone when asked for."""
    from pcie_tui.core.errors import NoGpuError
    from pcie_tui.sources.live import LiveSource

    why = None
    try:
        gpus = open_gpus(args.gpus)
    except NoGpuError as e:
        # Engine-only mode: an engine to watch was named (or may be found); the GPU side is unavailable.
        if args.no_engine or args.gpus is not None:
            raise
        gpus, why = None, str(e).split("try `pcie-tui demo`")[0].rstrip(" ;")
    try:
        engine, status = open_engine(args, gpus, interactive)
    except BaseException:
        if gpus is not None:
            gpus.close()
        raise
    if gpus is None:
        if engine is None:  # no GPU is the cause (an engine would have been watched alone): exit 3, as doctor's
            raise NoGpuError(f"nothing to watch: GPU side unavailable ({why}) and {status.removeprefix('engine: ')}")
        print(f"pcie-tui: GPU side unavailable: {why}; watching the engine alone", file=sys.stderr)
    extra = {"gpu_unavailable": why} if why else None
    return LiveSource(gpus, engine, interval_s=args.interval, extra_header=extra), status


def live_warnings(source: Any) -> None:
    """One stderr line per kind of reading the validation rules set aside during a live session."""
    src = getattr(source, "source", source)  # a TeeSource wraps the LiveSource
    for part in (getattr(src, "gpus", None), getattr(src, "engine", None)):
        tally = getattr(part, "tally", None)
        for w in tally.warnings() if tally is not None else ():
            print(f"pcie-tui: warning: {w}", file=sys.stderr)


# ---- commands ----------------------------------------------------------------


def _run_tui(source: Any, recorder_factory: Callable[[], Any] | None = None, status: str | None = None) -> int:
    from pcie_tui.tui.app import make_app

    app = make_app(source, recorder_factory=recorder_factory, status=status)
    try:
        app.run()
    finally:
        source.close()
        live_warnings(source)
        for path, ticks in app.saved:  # the screen is gone: say where the `r` recordings went
            print(f"pcie-tui: recording saved: {path} ({ticks} ticks)", file=sys.stderr)
    code = getattr(app, "return_code", 0)
    return int(code) if isinstance(code, int) else 0  # Textual sets 1 when the app died of an error


def cmd_watch(args: argparse.Namespace) -> int:
    from pcie_tui.recording.writer import RecordingWriter

    _need_terminal("watch", "to record without a screen use `pcie-tui record --headless --out FILE`")
    source, status = open_live(args, interactive=True)
    out_dir = Path(args.record_dir)

    def recorder() -> RecordingWriter:
        path = out_dir / time.strftime("pcie-tui-%Y%m%d-%H%M%S.jsonl.gz")
        return RecordingWriter(path, source.header)

    return _run_tui(source, recorder, status)


def cmd_record(args: argparse.Namespace) -> int:
    from pcie_tui.recording.writer import RecordingWriter

    out = Path(args.out)
    if out.is_dir():
        raise UserError(f"--out {args.out} is a directory; give a file name such as session.jsonl.gz")
    if not out.parent.is_dir():
        raise UserError(f"--out {args.out}: folder {out.parent} does not exist")
    if out.exists() and out.stat().st_size > 0 and not args.force:
        raise UserError(f"--out {args.out} exists: give another name, or --force to overwrite it")
    if not args.headless:
        _need_terminal("record", "add --headless to record without a screen")
    source, status = open_live(args, interactive=not args.headless)
    try:
        writer = RecordingWriter(args.out, source.header)
    except BaseException:
        source.close()
        raise
    if args.headless:
        return _record_headless(args, source, status, writer)
    from pcie_tui.recording.tee import TeeSource

    return _run_tui(TeeSource(source, writer), None, f"{status}; recording to {args.out}")


def _record_headless(args: argparse.Namespace, source: Any, status: str, writer: Any) -> int:
    """Record until Ctrl-C, SIGTERM, --duration or a write that fails (OutputError: exit 4, the file keeps
    what was written before it)."""
    from pcie_tui.recording.tee import TeeSource

    tee = TeeSource(source, writer)
    print(f"pcie-tui: {status}", file=sys.stderr)
    print(f"pcie-tui: recording to {args.out} every {args.interval:g} s; Ctrl-C to stop", file=sys.stderr)
    # SIGTERM and SIGHUP end the loop like Ctrl-C so the file is closed cleanly (every line is flushed
    # anyway), with a last line that says what ended it and when.
    why = ["Ctrl-C"]

    def stop(signum: int, _frame: Any) -> None:
        why[0] = signal.Signals(signum).name
        raise KeyboardInterrupt

    for sig in (signal.SIGTERM, signal.SIGHUP):
        signal.signal(sig, stop)
    end = time.monotonic() + args.duration if args.duration else None
    n = 0
    faults = getattr(source, "faults", None)
    try:
        while end is None or time.monotonic() < end:
            if tee.read() is None:
                why[0] = "the source ended"
                break
            _say_faults(faults)
            if tee.failed is not None:
                raise OutputError(tee.failed)
            n += 1
        else:
            why[0] = f"--duration {args.duration:g} s"
    except KeyboardInterrupt:
        pass
    finally:
        _say_faults(faults)
        if tee.failed is None:
            clock = getattr(source, "clock", None)
            t_end = clock.now()[0] if clock is not None else time.time()
            extra = {"faults": faults.summary()} if faults is not None and faults.faults else {}
            with contextlib.suppress(OutputError):
                writer.write_event("recording_ended", t_end, reason=why[0], ticks=n, **extra)
        tee.close()
        live_warnings(tee)
    return _ended(args.out, n, why[0], faults)


def _say_faults(faults: Any) -> None:
    """One line per fault as it happens (the recording goes on)."""
    for f in faults.drain() if faults is not None else ():
        print(f"pcie-tui: {f.message}", file=sys.stderr)


def _ended(out: str, n: int, why: str, faults: Any) -> int:
    """The closing line; the first fault's documented exit code (0 when none)."""
    code = faults.exit_code() if faults is not None else 0
    if code:
        kinds = ", ".join(dict.fromkeys(f.kind.replace("_", " ") for f in faults.faults))
        print(f"pcie-tui: wrote {n} ticks to {out} (ended by {why}); faults: {kinds} (exit {code})", file=sys.stderr)
    else:
        print(f"pcie-tui: wrote {n} ticks to {out} (ended by {why})", file=sys.stderr)
    return code


def _replay(path: str | Path, speed: float, loop: bool, label: str, command: str, report_arg: str) -> int:
    from pcie_tui.recording.reader import open_progressively
    from pcie_tui.recording.replay import ReplaySource

    # The header and first block are read here (a bad file is named before anything else), the rest while
    # the replay plays: a day-long recording shows its first frame at once, and its loading progress.
    rec = open_progressively(path)
    read_whole = rec.loading is None or rec.loading.done
    if read_whole:
        _warn_reading(rec.warnings)
    _need_terminal(command, f"for the text report use `pcie-tui report {report_arg}`")
    source = ReplaySource(rec, speed=speed, loop=loop)
    try:
        return _run_tui(source, None, f"replay of {label}")
    finally:
        if not read_whole and rec.loading is not None and rec.loading.done:  # read while it played
            _warn_reading(rec.warnings)


def _warn_reading(warnings: list[str]) -> None:
    for w in warnings:
        print(f"pcie-tui: warning: {w}", file=sys.stderr)


def _recording_arg(arg: str) -> tuple[Path, str | None]:
    """FILE of replay/report: a path, or a bundled demo's name (the path wins)."""
    from pcie_tui.recording import demos

    return demos.recording_path(arg)


def cmd_replay(args: argparse.Namespace) -> int:
    path, demo = _recording_arg(args.file)
    label = f"demo {demo}" if demo else str(path)
    return _replay(path, args.speed, args.loop, label, "replay", args.file)


def cmd_report(args: argparse.Namespace) -> int:
    """The report (text or --json) on stdout, always in full; a --plot that cannot be drawn is one line on
    stderr after it (exit 2): the path is checked before any analysis, so a bad one costs no work."""
    from pcie_tui.recording.reader import read_recording
    from pcie_tui.report.text import build_report, report_file

    plot, plot_error = None, None
    if args.plot is not None:
        from pcie_tui.plot.figure import check_plot_path

        try:
            plot = check_plot_path(args.plot)  # before any analysis: a bad path is known at once
        except UserError as e:
            plot_error = e  # said after the report: the answer is never lost to a bad plot path
    try:
        if plot is None:  # streamed: the file is read a block at a time, nothing of it kept
            report, analyzer, rec, ticks = report_file(_recording_arg(args.file)[0])
        else:  # the plot draws every tick: the recording is held whole
            rec = read_recording(_recording_arg(args.file)[0], warn=False)
            ticks = len(rec.samples)
        for w in rec.warnings:
            print(f"pcie-tui: warning: {w}", file=sys.stderr)
        if not ticks:
            raise UserError(f"{args.file} holds a header but no ticks")
    except UserError:
        if plot_error is not None:  # no report to print: the first error found is the one line
            raise plot_error from None
        raise
    if plot is not None:
        report, analyzer = build_report(rec)
        if any(s.reps for s in analyzer.series.values()):  # a long session: the plot draws every tick
            analyzer = build_report(rec, exact=True)[1]
    _print_report(report, rec, args.json)
    if plot_error is not None:
        sys.stdout.flush()  # the report is out before the error line
        raise plot_error
    if plot is not None:
        from pcie_tui.plot.figure import render_plot

        sys.stdout.flush()
        render_plot(rec, analyzer, *plot)
        print(f"pcie-tui: wrote the timeline plot to {args.plot}", file=sys.stderr)
    return 0


def _print_report(report: dict[str, Any], rec: Any, as_json: bool) -> None:
    if as_json:
        from pcie_tui.recording.validate import finite_json

        json.dump(finite_json(report), sys.stdout, indent=1, allow_nan=False)
        sys.stdout.write("\n")
    else:
        from rich.console import Console  # only for the text report (rich costs --json ~30 ms of start-up)

        from pcie_tui.report.text import render_text

        console = Console() if sys.stdout.isatty() else Console(width=piped_width())
        console.on_broken_pipe = _broken_pipe  # type: ignore[method-assign]  # rich would exit 1
        render_text(report, rec, console)


def _broken_pipe() -> None:
    raise BrokenPipeError


def cmd_demo(args: argparse.Namespace) -> int:
    from pcie_tui.recording import demos

    if args.list:
        if args.name is not None:
            demos.resolve(args.name)  # a misspelt name still says so
        for name, path in demos.available().items():
            if args.name is not None and name != args.name:
                continue
            print(f"{name:20s} {demos.DESCRIPTIONS.get(name, path.name)}")
        return 0
    path = demos.resolve(args.name)
    name = path.name.removesuffix(".jsonl.gz")
    return _replay(path, args.speed, True, f"demo {name}", "demo", name)


# ---- parser ------------------------------------------------------------------


# Commands that never read the live options (nor the engine registry their help names): their command
# line is parsed without them.
_NO_LIVE_OPTIONS = frozenset({"report", "replay", "demo"})


def _skip_live_options(_p: argparse.ArgumentParser) -> None:
    """Stands in for :func:`_add_live_options` where the command given is not one that takes them."""


def build_parser(command_line: Sequence[str] | None = None) -> argparse.ArgumentParser:
    """The whole parser; given the ``command_line`` it will parse, the live options (whose help imports
    every engine) are left out when its command takes none."""
    cmd = next((a for a in command_line if not a.startswith("-")), None) if command_line is not None else None
    live = _skip_live_options if cmd in _NO_LIVE_OPTIONS else _add_live_options
    p = _Parser(
        prog="pcie-tui",
        description="Is the PCIe/NVLink link, GPU memory or compute the bottleneck of your LLM inference?",
    )
    p.add_argument("--version", action="version", version=f"pcie-tui {__version__}")
    sub = p.add_subparsers(dest="command", metavar="COMMAND", parser_class=_Parser)

    w = sub.add_parser("watch", help="live view of every GPU and the attached engine")
    live(w)
    w.add_argument("--record-dir", default=".", metavar="DIR", help="where the r key writes recordings (default .)")
    w.set_defaults(func=cmd_watch)

    r = sub.add_parser("record", help="record a session to a file (JSON Lines; .gz compresses)")
    r.add_argument("--out", required=True, metavar="FILE", help="recording to write, e.g. session.jsonl.gz")
    r.add_argument("--duration", type=positive(), default=None, metavar="S", help="stop after S seconds")
    r.add_argument("--headless", action="store_true", help="no TUI: record until Ctrl-C, SIGTERM or --duration")
    r.add_argument("--force", action="store_true", help="overwrite --out if it exists (refused otherwise)")
    live(r)
    r.set_defaults(func=cmd_record)

    rp = sub.add_parser("replay", help="replay a recording in the TUI")
    rp.add_argument("file", help="a recording, or a bundled demo's name (pcie-tui demo --list)")
    rp.add_argument(
        "--speed", type=positive(float, hi=SPEED_MAX), default=1.0, metavar="X", help="playback speed (default 1)"
    )
    rp.add_argument("--loop", action="store_true", help="start again at the end")
    rp.set_defaults(func=cmd_replay)

    rep = sub.add_parser("report", help="summarise a recording: verdicts, events, use statistics")
    rep.add_argument("file", help="a recording, or a bundled demo's name (pcie-tui demo --list)")
    rep.add_argument("--json", action="store_true", help="machine-readable output")
    rep.add_argument(
        "--plot", default=None, metavar="FILE", help="also draw the session timeline to FILE (.svg, .png or .pdf)"
    )
    rep.set_defaults(func=cmd_report)

    d = sub.add_parser("demo", help="replay a bundled real session (no GPU needed)")
    d.add_argument("name", nargs="?", default=None, help="which demo (see --list)")
    d.add_argument("--list", action="store_true", help="list the bundled sessions")
    d.add_argument(
        "--speed", type=positive(float, hi=SPEED_MAX), default=1.0, metavar="X", help="playback speed (default 1)"
    )
    d.set_defaults(func=cmd_demo)

    from pcie_tui.export.command import register as register_export

    register_export(sub, live, open_live)
    for register in _extra_commands():
        register(sub)
    return p


def _extra_commands() -> list[Callable[[Any], None]]:
    from pcie_tui.doctor.cli import register

    return [register]


def main(argv: Sequence[str] | None = None) -> int:
    with one_blas_thread():  # before anything imports numpy (cli_args says why)
        return _main(argv)


def _main(argv: Sequence[str] | None) -> int:
    parser = build_parser(sys.argv[1:] if argv is None else argv)
    args = parser.parse_args(argv)
    if not getattr(args, "func", None):
        parser.print_help()
        return 2
    try:
        return int(args.func(args) or 0)
    except UserError as e:
        print(f"pcie-tui: error: {e}", file=sys.stderr)
        return e.exit_code
    except KeyboardInterrupt:
        return 130
    except BrokenPipeError:
        # `pcie-tui report x | head`: the reader left. Quietly, and without a second
        # error when the interpreter flushes stdout on the way out.
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        return 0
    except Exception as e:  # noqa: BLE001 - one line, never a traceback (PCIE_TUI_DEBUG=1 shows it)
        if os.environ.get("PCIE_TUI_DEBUG"):
            raise
        print(f"pcie-tui: error: {type(e).__name__}: {e} (a bug; PCIE_TUI_DEBUG=1 shows where)", file=sys.stderr)
        return 1
