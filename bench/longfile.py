"""`report` on a day-long recording against a bare parse of the same file (issue 21's long-file targets).

Builds a ~200 MB recording (uncompressed JSON lines, ~7.5 h at 10 Hz) by repeating the real H200 session
h200-pageable with its times shifted (finished requests dropped, so none repeats), then runs, each in its
own process: a bare ``orjson`` parse of every line, and ``pcie-tui report FILE --json``. Wall time and peak
RSS of each; the targets: the report within 3x the bare parse, under 300 MB.

In h200-pageable, as in the other real recordings, most ticks repeat the engine reading before them (81 %
here; the engine is polled more slowly than the GPUs, and an idle one reads the same), which ``report``
decodes once. So the same is measured again on a second file, the worst case: every engine reading made
distinct by one more per-tick counter (``poll_n``), as an engine read anew every tick would be.
The report runs as installed: bytecode cached. Its process runs without PYTHONDONTWRITEBYTECODE, after a
warm-up report of a bundled demo has written the .pyc files, as a pip install has them (an editable checkout
under PYTHONDONTWRITEBYTECODE=1 would recompile ~80 modules on every run, ~0.2 s).
usage: python bench/longfile.py [MB]
"""

from __future__ import annotations

import gzip
import os
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SOURCE = ROOT / "pcie_tui" / "data" / "h200-pageable.jsonl.gz"
TARGET_RATIO = 3.0
TARGET_RSS_MB = 300.0
TARGET_FIRST_S = 1.0
PARSE = """
import sys, orjson
n = 0
with open(sys.argv[1], "rb") as f:
    for line in f:
        orjson.loads(line)
        n += 1
print(n)
"""


def build(path: Path, megabytes: float, distinct: bool = False) -> tuple[int, float]:
    """Write the long recording; (ticks, hours). ``distinct``: no engine reading repeats the one before."""
    import orjson

    with gzip.open(SOURCE) as f:
        lines = [orjson.loads(raw) for raw in f]
    header, ticks = lines[0], [d for d in lines[1:] if "t" in d and "gpus" in d]
    span = ticks[-1]["t"] - ticks[0]["t"] + 0.1
    size, k, n = 0, 0, 0
    with path.open("wb") as out:
        out.write(orjson.dumps(header) + b"\n")
        while size < megabytes * 1e6:
            for d in ticks:
                e = dict(d, t=d["t"] + k * span)
                if isinstance(e.get("engine"), dict):
                    e["engine"] = {key: v for key, v in e["engine"].items() if key != "requests"}
                    if distinct:
                        e["engine"]["poll_n"] = n
                b = orjson.dumps(e) + b"\n"
                out.write(b)
                size += len(b)
                n += 1
            k += 1
    return n, k * span / 3600


REPLAY = """
import sys, threading, time
def first_frame():  # the moment the app holds its first frame (it is drawn on the next refresh)
    while getattr(app, "frame", None) is None:
        time.sleep(0.005)
    ld = src.loading
    print("FIRST_FRAME", time.time(), ld.fraction if ld is not None else 1.0, src.loading_text(), file=sys.stderr, flush=True)
    app.call_from_thread(app.exit)
from pcie_tui.recording.reader import open_progressively
from pcie_tui.recording.replay import ReplaySource
from pcie_tui.tui.app import make_app
rec = open_progressively(sys.argv[1])
src = ReplaySource(rec, speed=1.0)
app = make_app(src)
threading.Thread(target=first_frame, daemon=True).start()
app.run(headless=True, size=(140, 45))
src.close()
"""


def replay_first_frame(path: Path) -> tuple[float, str]:
    """(seconds from the process's start to the replay's first frame, what the screen said of loading)."""
    w0 = time.time()
    p = subprocess.run(
        [sys.executable, "-c", REPLAY, str(path)], check=True, cwd=ROOT, stderr=subprocess.PIPE, text=True
    )
    line = next(ln for ln in p.stderr.splitlines() if ln.startswith("FIRST_FRAME"))
    _, t, _frac, *said = line.split(" ", 3)
    return float(t) - w0, " ".join(said)


def installed_env() -> dict[str, str]:
    """This environment with bytecode caching on (PYTHONDONTWRITEBYTECODE removed), as a user's install runs."""
    env = dict(os.environ)
    env.pop("PYTHONDONTWRITEBYTECODE", None)
    return env


def _run(cmd: list[str], env: dict[str, str] | None = None) -> tuple[float, float]:
    """(wall seconds, peak RSS MB of the children so far: the report, run after the smaller parse)."""
    t0 = time.monotonic()
    subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL, cwd=ROOT, env=env)
    wall = time.monotonic() - t0
    return wall, resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 1024


def _report_vs_parse(path: Path, rounds: int, env: dict[str, str]) -> tuple[float, float, float]:
    """Bare parse and report in turns (A B A B: this machine is noisy): (median parse s, median report s,
    peak RSS MB of the children so far)."""
    parse: list[float] = []
    report: list[float] = []
    rss = 0.0
    for _ in range(rounds):
        parse.append(_run([sys.executable, "-c", PARSE, str(path)])[0])
        wall, rss = _run([sys.executable, "-m", "pcie_tui", "report", str(path), "--json"], env)
        report.append(wall)
    return sorted(parse)[len(parse) // 2], sorted(report)[len(report) // 2], rss


def bench_longfile(megabytes: float = 200.0, rounds: int = 2) -> list[tuple[str, str]]:
    """The report against a bare parse on the long recording, then on its every-reading-distinct twin;
    the replay's first frame on the first."""
    with tempfile.TemporaryDirectory() as d:
        path = Path(d) / "long.jsonl"
        n, hours = build(path, megabytes)
        mb = path.stat().st_size / 1e6
        env = installed_env()
        _run([sys.executable, "-m", "pcie_tui", "report", str(SOURCE), "--json"], env)  # warm-up: writes the .pyc
        parse_s, report_s, rss = _report_vs_parse(path, rounds, env)
        firsts = [replay_first_frame(path) for _ in range(rounds)]
        path.unlink()
        build(path, megabytes, distinct=True)
        d_parse, d_report, d_rss = _report_vs_parse(path, rounds, env)
    ratio, d_ratio = report_s / parse_s, d_report / d_parse
    ok = "yes" if ratio <= TARGET_RATIO and rss < TARGET_RSS_MB else "no"
    d_ok = "yes" if d_ratio <= TARGET_RATIO and d_rss < TARGET_RSS_MB else "no"
    first = max(f for f, _ in firsts)
    return [
        (
            f"`report --json` on a {mb:.0f} MB recording ({n:,} ticks, {hours:.1f} h, h200-pageable repeated), "
            f"read a block at a time, as installed: bytecode cached",
            f"{report_s:.2f} s = {ratio:.1f}x a bare orjson parse ({parse_s:.2f} s; target <= {TARGET_RATIO:g}x; "
            f"median of {rounds} turns each); peak RSS of the report process {rss:.0f} MB (target < "
            f"{TARGET_RSS_MB:g}); met: {ok}",
        ),
        (
            "the same with every engine reading distinct (worst case: none decoded once for a run of repeats)",
            f"{d_report:.2f} s = {d_ratio:.1f}x a bare orjson parse ({d_parse:.2f} s; median of {rounds} turns "
            f"each); peak RSS {d_rss:.0f} MB; met: {d_ok}",
        ),
        (
            f"`replay` of the same {mb:.0f} MB recording: first frame from the process's start",
            f"{first:.2f} s (the slower of {rounds}; target <= {TARGET_FIRST_S:g} s) "
            f"{'OK' if first <= TARGET_FIRST_S else 'MISSED'}; the screen said: {firsts[0][1]!r}",
        ),
    ]


if __name__ == "__main__":
    for k, v in bench_longfile(float(sys.argv[1]) if len(sys.argv) > 1 else 200.0):
        print(f"{k}: {v}")
