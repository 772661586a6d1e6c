"""CPU use of the TUI replaying a recording at 10 Hz for N seconds (headless Textual).

Runs the real app (make_app + ReplaySource, looping, speed 1) in a child process with
Textual's headless driver, so layout, rendering and the reader thread all run; the
parent reads the child's CPU time. usage: python bench/tui_cpu.py [SECONDS] [RECORDING]
"""

from __future__ import annotations

import resource
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
CHILD = """
import sys, threading
from pcie_tui.recording.reader import read_recording
from pcie_tui.recording.replay import ReplaySource
from pcie_tui.tui.app import make_app
rec = read_recording(sys.argv[1], warn=False)
src = ReplaySource(rec, speed=1.0, loop=True)
app = make_app(src)
def stop():
    app.call_from_thread(app.exit)
threading.Timer(float(sys.argv[2]), stop).start()
app.run(headless=True, size=(140, 45))
src.close()
"""


def measure(seconds: float, recording: Path) -> tuple[float, float, float]:
    """(cpu seconds, wall seconds, tick rate of the recording) of one headless run."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    t0 = time.monotonic()
    subprocess.run([sys.executable, "-c", CHILD, str(recording), str(seconds)], check=True, cwd=ROOT)
    wall = time.monotonic() - t0
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    return cpu, wall, seconds


def bench_tui(seconds: float, recording: Path) -> list[tuple[str, str]]:
    # Start-up (imports, reading the file) is measured separately and taken off.
    cpu0, wall0, _ = measure(0.5, recording)
    cpu, wall, _ = measure(seconds, recording)
    steady = (cpu - cpu0) / max(seconds - 0.5, 1e-9)
    ok = "OK" if steady <= 0.05 else "MISSED"
    return [
        (
            f"TUI replaying {recording.name} at 10 Hz for {seconds:.0f} s (headless, 140x45)",
            f"{steady * 100:.2f} % of one core in steady state (target <= 5 %) {ok}; "
            f"whole run {cpu:.2f} s CPU in {wall:.1f} s wall, start-up {cpu0:.2f} s CPU",
        )
    ]


if __name__ == "__main__":
    secs = float(sys.argv[1]) if len(sys.argv) > 1 else 60.0
    rec = Path(sys.argv[2]) if len(sys.argv) > 2 else ROOT / "pcie_tui" / "data" / "h200-reference.jsonl.gz"
    for k, v in bench_tui(secs, rec):
        print(f"{k}: {v}")
