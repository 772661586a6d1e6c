"""CPU use of the TUI replaying a recording at 10 Hz for N seconds (headless Textual).

Runs the real app (make_app + ReplaySource, looping, speed 1) in a child process with
Textual's headless driver, so layout, rendering and the reader thread all run; the
parent reads the child's CPU time. Once with the recording as it is (1 GPU), once with it
scaled to 8 GPUs (:func:`scaled`: every tick carries 8 GPUs, GPU i the real reading of
i/8 of the recording later, so the GPUs differ as on a real machine).
usage: python bench/tui_cpu.py [SECONDS] [RECORDING] [GPUS]
"""

from __future__ import annotations

import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
TARGET_STEADY = {1: 0.03, 8: 0.06}  # of one core at 10 Hz with 1 GPU, with 8 GPUs (issue 22)
TARGET_FIRST_S = 1.0
CHILD = """
import sys, threading, time
def first_frame():  # the moment the app holds its first frame (it is drawn on the next refresh)
    while getattr(app, "frame", None) is None:
        time.sleep(0.005)
    print("FIRST_FRAME", time.time(), file=sys.stderr, flush=True)
from pcie_tui.recording.reader import read_recording
from pcie_tui.recording.replay import ReplaySource
from pcie_tui.tui.app import make_app
rec = read_recording(sys.argv[1], warn=False)
src = ReplaySource(rec, speed=1.0, loop=True)
app = make_app(src)
threading.Thread(target=first_frame, daemon=True).start()
def stop():
    app.call_from_thread(app.exit)
threading.Timer(float(sys.argv[2]), stop).start()
app.run(headless=True, size=(140, 45))
src.close()
"""


def measure(seconds: float, recording: Path, root: Path = ROOT) -> tuple[float, float, float | None]:
    """(cpu seconds, wall seconds, seconds from the process's start to its first frame) of one headless
    run of the code in ``root`` (another checkout: its pcie_tui is the one imported)."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    t0, w0 = time.monotonic(), time.time()
    env = {**os.environ, "PYTHONPATH": str(root)}
    p = subprocess.run(
        [sys.executable, "-c", CHILD, str(recording), str(seconds)], check=True, cwd=root, env=env,
        stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    wall = time.monotonic() - t0
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    first = next((float(ln.split()[1]) - w0 for ln in p.stderr.splitlines() if ln.startswith("FIRST_FRAME")), None)
    return cpu, wall, first


def scaled(src: Path, n_gpus: int, out: Path) -> Path:
    """``src`` as an ``n_gpus``-GPU recording at ``out`` (:func:`pcie_tui.tui.headless.scaled_gpus`)."""
    sys.path.insert(0, str(ROOT))
    from pcie_tui.recording.reader import read_recording
    from pcie_tui.recording.writer import RecordingWriter
    from pcie_tui.tui.headless import scaled_gpus

    rec = scaled_gpus(read_recording(src, warn=False), n_gpus)
    with RecordingWriter(out, rec.header) as w:
        for s in rec.samples:
            w.write(s)
    return out


def bench_tui(seconds: float, recording: Path, n_gpus: int = 1) -> list[tuple[str, str]]:
    """The steady CPU share with ``n_gpus`` (1: the recording as it is) and the first frame's time."""
    if n_gpus > 1:
        with tempfile.TemporaryDirectory() as d:
            path = scaled(recording, n_gpus, Path(d) / f"{recording.name.split('.')[0]}-x{n_gpus}.jsonl.gz")
            return _bench(seconds, path, n_gpus, f"{recording.name} scaled to {n_gpus} GPUs")
    return _bench(seconds, recording, 1, recording.name)


def _bench(seconds: float, recording: Path, n_gpus: int, name: str) -> list[tuple[str, str]]:
    # Start-up (imports, reading the file) is measured separately and taken off.
    cpu0, wall0, first0 = measure(0.5, recording)
    cpu, wall, first = measure(seconds, recording)
    steady = (cpu - cpu0) / max(seconds - 0.5, 1e-9)
    target = TARGET_STEADY[1 if n_gpus == 1 else 8]
    ok = "OK" if steady <= target else "MISSED"
    firsts = [f for f in (first0, first) if f is not None]
    ff = f"{max(firsts):.2f} s" if firsts else "n/a"
    ff_ok = "OK" if firsts and max(firsts) <= TARGET_FIRST_S else "MISSED"
    gpus = "1 GPU" if n_gpus == 1 else f"{n_gpus} GPUs"
    return [
        (
            f"TUI replaying {name} at 10 Hz for {seconds:.0f} s (headless, 140x45, {gpus})",
            f"{steady * 100:.2f} % of one core in steady state (target <= {target * 100:g} %) {ok}; "
            f"whole run {cpu:.2f} s CPU in {wall:.1f} s wall, start-up {cpu0:.2f} s CPU",
        ),
        (
            f"TUI first frame, from the process's start (python, imports, reading {name})",
            f"{ff} (the slower of two starts; target <= {TARGET_FIRST_S:g} s) {ff_ok}",
        ),
    ]


def steady(seconds: float, recording: Path, root: Path = ROOT) -> float:
    """Steady CPU share of one run (a 0.5 s run's start-up taken off)."""
    cpu0, _, _ = measure(0.5, recording, root)
    cpu, _, _ = measure(seconds, recording, root)
    return (cpu - cpu0) / max(seconds - 0.5, 1e-9)


def compare(seconds: float, recording: Path, other: Path, rounds: int = 3) -> list[tuple[str, str]]:
    """This checkout against ``other`` (the code before a change), A B A B interleaved on this busy
    machine, 1 GPU and 8 GPUs: each one's steady CPU per round, the medians and their ratio."""
    label = subprocess.run(
        ["git", "-C", str(other), "log", "-1", "--format=%h"], capture_output=True, text=True
    ).stdout.strip() or str(other)
    mine = subprocess.run(["git", "-C", str(ROOT), "log", "-1", "--format=%h"], capture_output=True, text=True)
    rows = []
    with tempfile.TemporaryDirectory() as d:
        for n_gpus in (1, 8):
            rec = recording if n_gpus == 1 else scaled(recording, n_gpus, Path(d) / f"x{n_gpus}.jsonl.gz")
            a: list[float] = []
            b: list[float] = []
            for _ in range(rounds):
                a.append(steady(seconds, rec, other))
                b.append(steady(seconds, rec, ROOT))
            ma, mb = statistics.median(a), statistics.median(b)
            gpus = "1 GPU" if n_gpus == 1 else f"{n_gpus} GPUs"
            rows.append(
                (
                    f"TUI steady CPU, {gpus}, {label} (before) vs {mine.stdout.strip() or 'this tree'} (after), "
                    f"{rounds} rounds of {seconds:.0f} s interleaved A B",
                    f"before {' '.join(f'{x * 100:.2f}' for x in a)} % (median {ma * 100:.2f} %); "
                    f"after {' '.join(f'{x * 100:.2f}' for x in b)} % (median {mb * 100:.2f} %): "
                    f"after/before {mb / ma:.2f} (target <= {TARGET_STEADY[n_gpus] * 100:g} %)",
                )
            )
    return rows


if __name__ == "__main__":
    secs = float(sys.argv[1]) if len(sys.argv) > 1 else 60.0
    rec = Path(sys.argv[2]) if len(sys.argv) > 2 else ROOT / "pcie_tui" / "data" / "h200-reference.jsonl.gz"
    for n in [int(sys.argv[3])] if len(sys.argv) > 3 else [1, 8]:
        for k, v in bench_tui(secs, rec, n):
            print(f"{k}: {v}")
