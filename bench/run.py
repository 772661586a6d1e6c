"""pcie-tui benchmarks; appends one dated section to bench/results.md.

  python bench/run.py              replay/report throughput, recording size, TUI CPU (any machine)
  python bench/run.py --sampler    also the live sampler vs nvitop (needs NVML + a GPU; nvitop)
  python bench/run.py --no-engines skip the recorder-attached-to-real-engines CPU rows (bench/engine_cpu.py)
  python bench/run.py --tui-vs DIR also the TUI's CPU against the code checked out in DIR, A B interleaved

Timings are only compared with each other inside one run; see results.md for history.
"""

from __future__ import annotations

import argparse
import cProfile
import io
import os
import platform
import pstats
import socket
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import replace
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from pcie_tui.core.model import Sample  # noqa: E402
from pcie_tui.recording.reader import read_recording  # noqa: E402
from pcie_tui.recording.writer import RecordingWriter  # noqa: E402

BUNDLED = ROOT / "pcie_tui" / "data" / "h200-reference.jsonl.gz"
FALLBACK = ROOT / "tests" / "fixtures" / "h200-probe.jsonl"
TARGET_REPLAY = 200_000  # GPU-samples/s
TARGET_SIZE_MB = 5.0  # per GPU-hour, gzipped


def machine() -> str:
    cpu = platform.processor() or platform.machine()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    return f"{socket.gethostname()}: {cpu}, {os.cpu_count()} cores, Python {platform.python_version()}"


# ---- (b) replay / report throughput -------------------------------------------


def one_hour(src: Path, hours: float = 1.0, n_gpus: int = 1) -> tuple[Any, list[Sample]]:
    """A recording of ``hours`` at the source's tick rate, repeating its real ticks in order.

    With ``n_gpus`` > 1 every tick carries that many copies of the real GPU reading (indices
    0..n-1), as an 8-GPU machine's recording would; the values stay real readings.
    """
    rec = read_recording(src, warn=False)
    base = list(rec.samples)
    dt = rec.header.interval_s or 0.1
    n = int(hours * 3600 / dt)
    t0 = base[0].t
    header = rec.header
    if n_gpus > 1:
        g0 = header.gpus[0]
        header = replace(header, gpus=tuple(replace(g0, index=i, uuid=f"{g0.uuid}-{i}") for i in range(n_gpus)))
        base = [replace(s, gpus=tuple(replace(s.gpus[0], index=i) for i in range(n_gpus))) for s in base]
    out = [replace(base[i % len(base)], t=t0 + i * dt) for i in range(n)]
    return header, out


def bench_replay(src: Path, n_gpus: int = 1) -> list[tuple[str, str]]:
    from pcie_tui.report.text import build_report

    header, samples = one_hour(src, n_gpus=n_gpus)
    n_gpu = sum(len(s.gpus) for s in samples)
    tag = f"{n_gpus} GPU" + ("s" if n_gpus > 1 else "")
    rows: list[tuple[str, str]] = [
        (
            f"source of ticks ({tag})",
            f"{src.relative_to(ROOT)} repeated to 1 h, {len(samples)} ticks, {n_gpu} GPU-samples",
        )
    ]
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "hour.jsonl.gz"
        w0 = time.perf_counter()
        with RecordingWriter(path, header) as w:
            for s in samples:
                w.write(s)
        w_s = time.perf_counter() - w0
        del samples
        size = path.stat().st_size
        gpus_in_header = max(1, len(header.gpus))
        mb_per_gpu_h = size / 1e6 / gpus_in_header
        rows.append((f"write (RecordingWriter, gzip, flush per line), {tag}", f"{n_gpu / w_s:,.0f} GPU-samples/s"))
        rows.append(
            (
                f"recording size per GPU-hour, gzipped, {tag}",
                f"{mb_per_gpu_h:.2f} MB (target <= {TARGET_SIZE_MB:g}) {_ok(mb_per_gpu_h <= TARGET_SIZE_MB)}",
            )
        )
        best: dict[str, float] = {}
        for _ in range(3):
            t0 = time.perf_counter()
            rec = read_recording(path, warn=False)
            t1 = time.perf_counter()
            build_report(rec)
            t2 = time.perf_counter()
            for k, v in (("read", t1 - t0), ("analyze", t2 - t1), ("total", t2 - t0)):
                best[k] = min(best.get(k, v), v)
            del rec
            t0 = time.perf_counter()  # the same, value rules off (structure and time order still checked)
            build_report(read_recording(path, warn=False, validate=False))
            v = time.perf_counter() - t0
            best["unvalidated"] = min(best.get("unvalidated", v), v)
        # Replay needs Sample objects (the TUI's path): read and build every one.
        t0 = time.perf_counter()
        rec = read_recording(path, warn=False)
        n_built = sum(len(s.gpus) for s in rec.samples)
        replay_load = n_built / (time.perf_counter() - t0)
        del rec
        rate = n_gpu / best["total"]
        rows.append((f"read (orjson, raw ticks), {tag}", f"{n_gpu / best['read']:,.0f} GPU-samples/s"))
        rows.append(
            (
                f"report analysis (SessionAnalyzer fed in chunks) + summary, engine, what-if, {tag}",
                f"{n_gpu / best['analyze']:,.0f} GPU-samples/s",
            )
        )
        rows.append((f"replay load (read + build every Sample), {tag}", f"{replay_load:,.0f} GPU-samples/s"))
        rows.append((f"analyzer fed one tick at a time (live, TUI replay and seek), {tag}", _per_tick(src, n_gpus)))
        rows.append(
            (
                f"report: read_recording + build_report (what `pcie-tui report` does), best of 3, {tag}",
                f"**{rate:,.0f} GPU-samples/s** (target >= {TARGET_REPLAY:,}) {_ok(rate >= TARGET_REPLAY)}",
            )
        )
        cost = best["total"] / best["unvalidated"] - 1.0
        rows.append(
            (
                f"validation's cost: report throughput without / with the value rules, best of 3, {tag}",
                f"{n_gpu / best['unvalidated']:,.0f} / {rate:,.0f} GPU-samples/s: **{cost * 100:+.1f} %** "
                f"(target < 10 %) {_ok(cost < 0.10)}",
            )
        )
        # The attribution (what bound each tick and phase) and the headline, on the analysed session:
        # their share of what `pcie-tui report` costs, in the same run.
        from pcie_tui.analyze.answer import answer

        rec = read_recording(path, warn=False)
        _, an = build_report(rec)
        hdr = rec.header
        att = min(_once(lambda hdr=hdr, an=an: answer(hdr, an)) for _ in range(3))
        del rec, an
        rows.append(
            (
                f"attribution + headline (answer) on the analysed session, best of 3, {tag}",
                f"{att * 1e3:.0f} ms = {att / best['total'] * 100:.1f} % of the report's time "
                f"({n_gpu / att:,.0f} GPU-samples/s)",
            )
        )
        if rate < TARGET_REPLAY:
            rows.append(
                (
                    f"hot functions (cProfile, tottime), {tag}",
                    _profile(lambda: build_report(read_recording(path, warn=False))),
                )
            )
    return rows


def _per_tick(src: Path, n_gpus: int) -> str:
    """SessionAnalyzer.feed(sample), as the TUI calls it on every tick: cost per GPU-tick, best of 3."""
    from pcie_tui.analyze.session import SessionAnalyzer

    header, samples = one_hour(src, hours=0.05, n_gpus=n_gpus)
    best = min(
        _once(lambda: [an.feed(s) for an in [SessionAnalyzer(header, keep_series=False)] for s in samples])
        for _ in range(3)
    )
    n = sum(len(s.gpus) for s in samples)
    return f"{best / n * 1e6:.1f} us per GPU-tick ({n / best:,.0f} GPU-samples/s)"


def _profile(fn: Callable[[], object]) -> str:
    pr = cProfile.Profile()
    pr.enable()
    fn()
    pr.disable()
    buf = io.StringIO()
    st = pstats.Stats(pr, stream=buf)
    st.sort_stats("tottime")
    top = []
    for (file, line, name), (_cc, _nc, tt, _ct, _callers) in sorted(st.stats.items(), key=lambda kv: -kv[1][2])[:6]:  # type: ignore[attr-defined]
        top.append(f"{Path(file).name}:{line} {name} {tt:.2f}s")
    return "; ".join(top)


def _once(fn: Callable[[], object]) -> float:
    t0 = time.perf_counter()
    fn()
    return time.perf_counter() - t0


def _ok(cond: bool) -> str:
    return "OK" if cond else "MISSED"


# ---- (a) live sampler vs nvitop ---------------------------------------------------


def _timed(fn: Callable[[], object], seconds: float) -> tuple[int, float, float]:
    """Call ``fn`` back to back for ``seconds``: (calls, cpu_s, wall_s)."""
    fn()
    fn()
    n = 0
    c0, w0 = time.process_time(), time.perf_counter()
    while time.perf_counter() - w0 < seconds:
        fn()
        n += 1
    return n, time.process_time() - c0, time.perf_counter() - w0


def _paced(fn: Callable[[], object], seconds: float, hz: float) -> tuple[int, float, float, float]:
    """Call ``fn`` at ``hz``: (calls, cpu_s in fn, wall_s in fn, elapsed_s)."""
    n = 0
    cpu = wall = 0.0
    period = 1.0 / hz
    w0 = time.perf_counter()
    nxt = w0
    while time.perf_counter() - w0 < seconds:
        c1, w1 = time.process_time(), time.perf_counter()
        fn()
        cpu += time.process_time() - c1
        wall += time.perf_counter() - w1
        n += 1
        nxt += period
        d = nxt - time.perf_counter()
        if d > 0:
            time.sleep(d)
    return n, cpu, wall, time.perf_counter() - w0


class _TimedNvml:
    """pynvml with every nvml* call timed (CPU and wall), for the per-call breakdown."""

    def __init__(self) -> None:
        import pynvml

        self._m = pynvml
        self.cost: dict[str, list[float]] = {}

    def __getattr__(self, name: str) -> Any:
        attr = getattr(self._m, name)
        if not (name.startswith("nvml") and callable(attr)):
            return attr
        slot = self.cost.setdefault(name, [0.0, 0.0, 0])

        def timed(*args: Any) -> Any:
            c0, w0 = time.process_time(), time.perf_counter()
            try:
                return attr(*args)
            finally:
                slot[0] += time.process_time() - c0
                slot[1] += time.perf_counter() - w0
                slot[2] += 1

        return timed


def bench_sampler(seconds: float = 3.0) -> list[tuple[str, str]]:
    from pcie_tui.sources.nvml import NvmlCollector

    rows: list[tuple[str, str]] = []
    col = NvmlCollector()
    n_gpu = len(col.devices)
    src = ",".join(i.metrics_source or "?" for i in col.gpu_infos())
    rows.append(("GPUs", f"{n_gpu} ({col.gpu_infos()[0].name}), metrics source {src}"))

    def fmt(label: str, r: tuple[int, float, float]) -> tuple[str, str]:
        n, c, w = r
        return (
            label,
            f"{c / n / n_gpu * 1e3:.3f} ms CPU, {w / n / n_gpu * 1e3:.2f} ms wall per GPU-tick; {n / w:,.1f} ticks/s",
        )

    def paced(label: str, r: tuple[int, float, float, float]) -> tuple[str, str]:
        n, c, w, el = r
        return (
            label,
            f"{c / n / n_gpu * 1e3:.3f} ms CPU, {w / n / n_gpu * 1e3:.2f} ms wall per GPU-tick; achieved {n / el:.2f} Hz; {c / el * 100:.2f} % of one core",
        )

    rows.append(fmt("pcie-tui NvmlCollector.read(), GPM, back to back", _timed(col.read, seconds)))
    rows.append(paced("pcie-tui NvmlCollector.read(), GPM, paced 10 Hz", _paced(col.read, seconds, 10.0)))
    col.close()
    timed = _TimedNvml()
    col = NvmlCollector(nvml=timed)
    timed.cost.clear()  # ticks only, not start-up
    n, _c, _w, _el = _paced(col.read, seconds, 10.0)
    parts = sorted(timed.cost.items(), key=lambda kv: -kv[1][0])
    rows.append(
        (
            "where a paced 10 Hz GPM tick goes (CPU / wall ms per GPU-tick, per NVML call)",
            "; ".join(f"{k} {c / n / n_gpu * 1e3:.3f}/{w / n / n_gpu * 1e3:.3f}" for k, (c, w, _k) in parts),
        )
    )
    col.close()
    col = NvmlCollector(gpm=False)
    rows.append(fmt("pcie-tui NvmlCollector.read(), NVML fallback (PcieThroughput in pool)", _timed(col.read, seconds)))
    col.close()
    try:
        from nvitop import Device
    except ImportError as e:
        rows.append(("nvitop", f"not run: {e}"))
        return rows
    devs = Device.all()

    def nvitop_tick() -> None:
        for d in devs:
            d.pcie_tx_throughput()
            d.pcie_rx_throughput()
            d.memory_utilization()
            d.gpu_utilization()
            d.memory_used()
            d.power_usage()

    import nvitop

    rows.append(
        fmt(
            f"nvitop {nvitop.__version__} Device API, same figures (PCIe TX/RX, mem busy, util, mem used, power)",
            _timed(nvitop_tick, seconds),
        )
    )
    rows.append(paced(f"nvitop {nvitop.__version__}, paced 10 Hz", _paced(nvitop_tick, seconds, 10.0)))
    return rows


def save_fingerprint(directory: Path) -> str:
    """This machine's baseline (GPUs, links, driver, CPU, memory) beside the results; its file name."""
    from pcie_tui.core.errors import UserError
    from pcie_tui.doctor import fingerprint

    try:
        path = fingerprint.write(fingerprint.snapshot(source="bench"), directory)
    except UserError as e:
        return f"not written: {e}"
    return path.name


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sampler", action="store_true", help="also bench the live sampler and nvitop (needs a GPU)")
    ap.add_argument("--no-replay", action="store_true", help="skip the replay/report bench")
    ap.add_argument("--tui-seconds", type=float, default=60.0, help="seconds of TUI replay to time (0 skips)")
    ap.add_argument("--tui-vs", metavar="CHECKOUT", help="also the TUI's CPU against another checkout, A B interleaved")
    ap.add_argument("--results", default=str(ROOT / "bench" / "results.md"), help="markdown file to append to")
    ap.add_argument("--seconds", type=float, default=3.0, help="seconds per sampler measurement")
    ap.add_argument("--no-engines", action="store_true", help="skip the recorder-on-real-engines CPU rows")
    ap.add_argument("--engine-seconds", type=float, default=15.0, help="seconds per recorder run on an engine")
    ap.add_argument("--long-mb", type=float, default=200.0, help="MB of the long recording `report` reads (0 skips)")
    ap.add_argument("--soak-hours", type=float, default=8.0, help="hours of the simulated live soak (0 skips)")
    a = ap.parse_args(argv)
    rows: list[tuple[str, str]] = []
    if a.sampler:
        rows += bench_sampler(a.seconds)
    if not a.no_replay:
        for n_gpus in (1, 8):
            rows += bench_replay(BUNDLED if BUNDLED.exists() else FALLBACK, n_gpus)
    if a.long_mb > 0:
        from longfile import bench_longfile

        rows += bench_longfile(a.long_mb)
    if a.soak_hours > 0:
        from soak import bench_soak

        rows += bench_soak(a.soak_hours)
    if a.tui_seconds > 0:
        from tui_cpu import bench_tui

        for n_gpus in (1, 8):
            rows += bench_tui(a.tui_seconds, BUNDLED if BUNDLED.exists() else FALLBACK, n_gpus)
        if a.tui_vs:
            from tui_cpu import compare

            rows += compare(min(a.tui_seconds, 30.0), BUNDLED if BUNDLED.exists() else FALLBACK, Path(a.tui_vs))
    if not a.no_engines:
        from engine_cpu import bench_engine_cpu

        rows += bench_engine_cpu(a.engine_seconds)
    rows.append(("machine fingerprint (`pcie-tui doctor --since` it)", save_fingerprint(Path(a.results).parent)))
    now = datetime.now(timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    text = f"\n## {now} - {machine()}\n\n| what | result |\n|---|---|\n" + "".join(f"| {k} | {v} |\n" for k, v in rows)
    print(text)
    with open(a.results, "a") as f:
        f.write(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
