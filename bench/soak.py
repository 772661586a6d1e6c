"""An 8-hour live session at 10 Hz, simulated faster than real time (issue 25's soak).

The production live path, tick by tick: NvmlCollector on the stand-in NVML (tests/fakenvml: answers
captured on the project's H200, looping through its phases, with the clocks, clock-event reasons,
temperature and power limit of the H100 heat capture, tests/fixtures/h100-heat-capture.json, as a real
GPU reports them), LiveSource, a TeeSource writing a gzip
recording, and the live view's model (ViewModel.feed every tick, a frame built every 10 ticks, as the
TUI does at its frame rate). Only the clocks are virtual: each tick advances them by the interval, so
8 hours run in minutes. Measured: the process's RSS after the first simulated 10 minutes and at the end
(growth target < 5 MB), the recording's size per GPU-hour (target < 5 MB), and then `report` on the
result (peak RSS, wall time).

usage: python bench/soak.py [HOURS] [GPUS]
"""

from __future__ import annotations

import resource
import subprocess
import sys
import tempfile
import time
import types
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))
TARGET_GROWTH_MB = 5.0
TARGET_MB_PER_GPU_HOUR = 5.0
INTERVAL_S = 0.1


def _rss_mb() -> float:
    """The current resident set (not the peak), from /proc."""
    with open("/proc/self/statm") as f:
        pages = int(f.read().split()[1])
    return pages * resource.getpagesize() / 1e6


class VirtualClock:
    """time.monotonic / time.time / time.sleep that move only when a tick is due."""

    def __init__(self) -> None:
        self.mono, self.wall = 1000.0, time.time()

    def monotonic(self) -> float:
        return self.mono

    def time(self) -> float:
        return self.wall + (self.mono - 1000.0)

    def sleep(self, s: float) -> None:
        self.mono += max(s, 0.0)


def soak(hours: float, gpus: int, out: Path) -> dict[str, float]:
    import fakenvml

    from pcie_tui.recording.tee import TeeSource
    from pcie_tui.recording.writer import RecordingWriter
    from pcie_tui.sources import live
    from pcie_tui.sources.faults import SessionClock
    from pcie_tui.sources.nvml import NvmlCollector
    from pcie_tui.tui.state import ViewModel

    vc = VirtualClock()
    live.time = types.SimpleNamespace(monotonic=vc.monotonic, time=vc.time, sleep=vc.sleep)  # type: ignore[attr-defined]
    heat = ROOT / "tests" / "fixtures" / "h100-heat-capture.json"  # clocks, reasons, temperature: a real GPU's
    nv = fakenvml.FakeNvml(
        fakenvml.load_capture(),
        n_gpus=gpus,
        clock=vc.monotonic,
        block_s=0.0,
        heat=fakenvml.load_heat(heat) if heat.exists() else None,
    )
    source = live.LiveSource(NvmlCollector(nvml=nv, clock=vc.monotonic), interval_s=INTERVAL_S, calibrate=False)
    source.clock = SessionClock(vc.time, vc.monotonic)
    tee = TeeSource(source, RecordingWriter(out, source.header))
    model = ViewModel(source.header)
    ticks = int(hours * 3600 / INTERVAL_S)
    warm = int(600 / INTERVAL_S)  # the first simulated 10 minutes: caches, history rings and series fill
    t0 = time.monotonic()
    rss_warm = 0.0
    stamps = {}
    for i in range(ticks):
        s = tee.read()
        model.feed(s)
        if i % 10 == 0:
            model.frame()
            nv.windows.clear()  # the stand-in's own log of GPM windows (tests read it), not pcie-tui's
        if i == warm:
            rss_warm = _rss_mb()
        if i in (0, warm, ticks - warm):
            stamps[i] = time.monotonic()
    rss_end = _rss_mb()
    first_ms = (stamps[warm] - stamps[0]) / warm * 1e3
    last_ms = (time.monotonic() - stamps[ticks - warm]) / warm * 1e3
    tee.close()
    return {
        "ticks": ticks,
        "wall_s": time.monotonic() - t0,
        "rss_warm_MB": rss_warm,
        "rss_end_MB": rss_end,
        "file_MB": out.stat().st_size / 1e6,
        "first_ms": first_ms,
        "last_ms": last_ms,
    }


def bench_soak(hours: float = 8.0, gpus: int = 1) -> list[tuple[str, str]]:
    with tempfile.TemporaryDirectory() as d:
        out = Path(d) / "soak.jsonl.gz"
        code = f"import sys; sys.path.insert(0, 'bench'); import soak, json; print(json.dumps(soak.soak({hours}, {gpus}, __import__('pathlib').Path({str(out)!r}))))"
        p = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, check=True)
        import json

        r = json.loads(p.stdout.strip().splitlines()[-1])
        t0 = time.monotonic()
        before = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss
        subprocess.run([sys.executable, "-m", "pcie_tui", "report", str(out), "--json"], cwd=ROOT, check=True,
                       stdout=subprocess.DEVNULL)  # fmt: skip
        report_s = time.monotonic() - t0
        report_rss = max(before, resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss) / 1024
    growth = r["rss_end_MB"] - r["rss_warm_MB"]
    per_gpu_hour = r["file_MB"] / (hours * gpus)
    ok = growth < TARGET_GROWTH_MB and per_gpu_hour < TARGET_MB_PER_GPU_HOUR
    return [
        (
            f"soak: {hours:g} h live session at 10 Hz, {gpus} GPU(s), simulated ({r['ticks']:,} ticks: stand-in NVML, "
            "LiveSource, gzip recording, the live view's model)",
            f"ran in {r['wall_s']:.0f} s ({r['first_ms']:.2f} ms a tick in the first 10 min, {r['last_ms']:.2f} in the "
            f"last); RSS {r['rss_warm_MB']:.1f} MB after 10 min -> {r['rss_end_MB']:.1f} MB at "
            f"the end (growth {growth:+.1f} MB, target < {TARGET_GROWTH_MB:g}); recording {r['file_MB']:.1f} MB = "
            f"{per_gpu_hour:.2f} MB per GPU-hour (target < {TARGET_MB_PER_GPU_HOUR:g}); `report --json` on it "
            f"{report_s:.1f} s, peak RSS {report_rss:.0f} MB; met: {'yes' if ok else 'no'}",
        )
    ]


if __name__ == "__main__":
    h = float(sys.argv[1]) if len(sys.argv) > 1 else 8.0
    n = int(sys.argv[2]) if len(sys.argv) > 2 else 1
    for k, v in bench_soak(h, n):
        print(f"{k}: {v}")
