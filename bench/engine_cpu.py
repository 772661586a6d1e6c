"""CPU cost of attaching the recorder to a real engine, against the GPU-only recorder in the same run.

Starts the CPU llama-server (and vLLM when its venv exists) the way the tests do
(``tests/engines``), keeps a bounded request loop running, and runs the real CLI
``pcie-tui record --headless --interval 0.1`` three ways, one after the other:

* GPU only: ``--no-engine``;
* GPU + engine: ``--pid <engine>``;
* engine alone: ``--pid <engine>`` without NVML (what a CPU box records).

The GPU side is the stand-in NVML of ``tests/fakenvml`` (replayed H200 answers,
PCIe calls blocking as on the H200) when the machine has no GPU, the real one
otherwise. The recorder's CPU time is read from /proc (user + system, all its
threads) over a window that starts after attach (``warmup_s``), so start-up
imports are not in it. Engine side = (GPU + engine) - (GPU only).

  python bench/engine_cpu.py [--seconds 20] [--engine llamacpp|vllm|all] [--profile DIR]
"""

from __future__ import annotations

import argparse
import os
import random
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
TESTS = ROOT / "tests"
if str(TESTS) not in sys.path:
    sys.path.insert(0, str(TESTS))

# The recorder child: the real CLI, optionally with the replayed H200 NVML in place of pynvml.
CHILD = f"""
import sys
fake = sys.argv[1]
sys.argv = ["pcie-tui", *sys.argv[2:]]
if fake == "fake":
    sys.path.insert(0, {str(TESTS)!r})
    import fakenvml
    sys.modules["pynvml"] = fakenvml.FakeNvml(fakenvml.load_capture())
elif fake == "none":
    import importlib.abc
    class _Block(importlib.abc.MetaPathFinder):
        def find_spec(self, name, path=None, target=None):
            if name == "pynvml": raise ImportError("pynvml hidden by the bench (engine alone)")
    sys.meta_path.insert(0, _Block())
from pcie_tui.cli.main import main
raise SystemExit(main())
"""


def _cpu_s(pid: int) -> float | None:
    """utime + stime of a live process in seconds (all its threads), from /proc."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return None
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def gpu_mode() -> str:
    """ "real" when NVML sees a GPU here, else "fake" (the replayed H200)."""
    try:
        from pcie_tui.sources.nvml import nvml_unavailable_reason

        return "real" if nvml_unavailable_reason() is None else "fake"
    except Exception:
        return "fake"


def run_recorder(
    args: list[str], nvml: str, seconds: float, warmup_s: float, profile: Path | None = None
) -> tuple[float, float, str]:
    """(CPU s, wall s, last stderr line) of one headless recording measured after ``warmup_s``."""
    out = Path(tempfile.mkdtemp(prefix="pcie-bench-")) / "rec.jsonl.gz"
    cmd = [sys.executable, "-c", CHILD, nvml, "record", "--headless", "--interval", "0.1", "--out", str(out), *args]
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    p = subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    spy = None
    try:
        time.sleep(warmup_s)
        if p.poll() is not None:
            err = (p.stderr.read() if p.stderr else b"").decode(errors="replace").strip().splitlines()
            raise RuntimeError(f"recorder exited early: {err[-1] if err else p.returncode}")
        c0, w0 = _cpu_s(p.pid), time.monotonic()
        spy_bin = shutil.which("py-spy") or str(Path(sys.executable).with_name("py-spy"))
        if profile is not None and os.path.exists(spy_bin):
            spy = subprocess.Popen(
                [
                    spy_bin,
                    "record",
                    "--pid",
                    str(p.pid),
                    "--format",
                    "raw",
                    "-d",
                    str(int(seconds)),
                    "-o",
                    str(profile),
                ],
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
            )
        time.sleep(seconds)
        c1, w1 = _cpu_s(p.pid), time.monotonic()
    finally:
        if spy is not None:
            spy.wait(30)
        p.send_signal(signal.SIGTERM)
        try:
            _, err_b = p.communicate(timeout=15)
        except subprocess.TimeoutExpired:
            p.kill()
            _, err_b = p.communicate()
        shutil.rmtree(out.parent, ignore_errors=True)
    if c0 is None or c1 is None:
        raise RuntimeError("recorder's CPU time unreadable")
    lines = (err_b or b"").decode(errors="replace").strip().splitlines()
    return c1 - c0, w1 - w0, lines[-1] if lines else ""


class LoadLoop:
    """A bounded request loop in a thread: one request at a time until stopped or ``max_requests``."""

    def __init__(self, send: Callable[[int], Any], max_requests: int = 2000) -> None:
        self.send, self.max_requests = send, max_requests
        self.done = 0
        self.errors = 0
        self._stop = threading.Event()
        self._t = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        i = 0
        while not self._stop.is_set() and i < self.max_requests:
            try:
                self.send(i)
                self.done += 1
            except Exception:
                self.errors += 1
                self._stop.wait(0.2)
            i += 1

    def __enter__(self) -> LoadLoop:
        self._t.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._t.join(timeout=60)


def _measure(
    label: str, pid: int, nvml: str, seconds: float, warmup_s: float, profile_dir: Path | None
) -> list[tuple[str, str]]:
    runs: dict[str, tuple[float, float]] = {}
    for name, extra, mode in (
        ("GPU only (--no-engine)", ["--no-engine"], nvml),
        ("GPU + engine", ["--pid", str(pid)], nvml),
        ("engine alone (no NVML)", ["--pid", str(pid)], "none"),
    ):
        prof = (
            profile_dir / f"{label}-{name.split()[0].lower()}{'-engine' if '+' in name else ''}.txt"
            if profile_dir
            else None
        )
        cpu, wall, _ = run_recorder(extra, mode, seconds, warmup_s, prof)
        runs[name] = (cpu, wall)
    g_c, g_w = runs["GPU only (--no-engine)"]
    e_c, e_w = runs["GPU + engine"]
    a_c, a_w = runs["engine alone (no NVML)"]
    gpu_pct, both_pct, alone_pct = 100 * g_c / g_w, 100 * e_c / e_w, 100 * a_c / a_w
    src = "replayed H200 NVML (tests/fakenvml)" if nvml == "fake" else "real NVML"
    ratio = f"{both_pct / gpu_pct:.2f}x" if gpu_pct > 0 else "n/a (GPU-only CPU time was 0)"
    return [
        (
            f"recorder attached to {label} at 10 Hz, {seconds:.0f} s each, request loop running (GPU side: {src})",
            f"GPU only {gpu_pct:.2f} % of a core; GPU + engine {both_pct:.2f} % ({ratio} GPU only); "
            f"engine side {both_pct - gpu_pct:.2f} % of a core (target <= 1.5 %); engine alone {alone_pct:.2f} %",
        )
    ]


def bench_llamacpp(seconds: float, warmup_s: float, nvml: str, profile_dir: Path | None) -> list[tuple[str, str]]:
    from engines.gguf_model import write_llama_gguf
    from engines.llama_server import LlamaServer, llama_available, random_prompt, stream_completion

    why = llama_available()
    if why is not None:
        return [("recorder attached to llama-server", f"skipped: {why}")]
    tmp = Path(tempfile.mkdtemp(prefix="pcie-bench-llama-"))
    try:
        model = tmp / "tiny.gguf"
        write_llama_gguf(model, n_embd=256, n_ff=768, n_layer=4, n_head=8)
        srv = LlamaServer(model, tmp / "llama.log").start()
        rng = random.Random(0)
        try:

            def send(i: int) -> None:
                stream_completion(srv.url, random_prompt(rng, 40 + 20 * (i % 4)), 0, 24)
                time.sleep(0.05)

            with LoadLoop(send) as load:
                rows = _measure("llama-server (CPU)", srv.pid, nvml, seconds, warmup_s, profile_dir)
            rows[-1] = (rows[-1][0], rows[-1][1] + f"; {load.done} requests served")
            return rows
        finally:
            srv.stop()
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def bench_vllm(seconds: float, warmup_s: float, nvml: str, profile_dir: Path | None) -> list[tuple[str, str]]:
    from engines.load import stream_completion
    from engines.vllm_server import SERVED_NAME, VllmServer, ensure_model, free_port, vllm_available

    why = vllm_available()
    if why is not None:
        return [("recorder attached to vLLM", f"skipped: {why}")]
    # Written once into the temp folder (the tests' cache, .engines/models, may be shared).
    model_dir = Path(tempfile.gettempdir()) / "pcie-tui-bench" / "vllm-tiny-llama"
    vocab = ensure_model(model_dir)
    tmp = Path(tempfile.mkdtemp(prefix="pcie-bench-vllm-"))
    srv = VllmServer(model_dir, free_port(), tmp / "vllm.log")
    try:
        srv.start(timeout_s=120)
        rng = random.Random(0)

        def send(i: int) -> None:
            stream_completion(srv.url, SERVED_NAME, [rng.randrange(3, vocab) for _ in range(32 + 16 * (i % 4))], 16)
            time.sleep(0.05)

        with LoadLoop(send) as load:
            rows = _measure("vLLM (CPU)", srv.pid, nvml, seconds, warmup_s, profile_dir)
        rows[-1] = (rows[-1][0], rows[-1][1] + f"; {load.done} requests served")
        return rows
    except RuntimeError as e:
        return [("recorder attached to vLLM", f"not measured: {str(e).splitlines()[0][:160]}")]
    finally:
        srv.stop()
        shutil.rmtree(tmp, ignore_errors=True)


def bench_engine_cpu(
    seconds: float = 15.0, warmup_s: float = 3.0, engines: str = "all", profile_dir: Path | None = None
) -> list[tuple[str, str]]:
    nvml = gpu_mode()
    rows: list[tuple[str, str]] = []
    if engines in ("all", "llamacpp"):
        rows += bench_llamacpp(seconds, warmup_s, nvml, profile_dir)
    if engines in ("all", "vllm"):
        rows += bench_vllm(seconds, warmup_s, nvml, profile_dir)
    return rows


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seconds", type=float, default=15.0, help="measured seconds per recorder run")
    ap.add_argument("--warmup", type=float, default=3.0, help="seconds after start before measuring")
    ap.add_argument("--engine", choices=("all", "llamacpp", "vllm"), default="all")
    ap.add_argument("--profile", metavar="DIR", help="also py-spy each run (raw collapsed stacks) into DIR")
    a = ap.parse_args(argv)
    prof = Path(a.profile) if a.profile else None
    if prof:
        prof.mkdir(parents=True, exist_ok=True)
    for k, v in bench_engine_cpu(a.seconds, a.warmup, a.engine, prof):
        print(f"{k}: {v}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
