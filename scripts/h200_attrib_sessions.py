"""Record llama-server sessions on a GPU with the real CLI (`pcie-tui record --pid`), with labelled truth.

Run ON the GPU machine (scripts/device_attrib.sh calls it). For each session: start llama-server
with the session's flags, attach `python3 -m pcie_tui record --pid PID --headless` to it at once
(the recording covers load, every request and the idle after), drive requests of random token ids
(no text is sent or recorded), stop the recorder with SIGTERM, then the server. Beside each
recording: ``<name>.truth.json`` (what the client sent and the server's own timings per request,
with wall-clock windows) and the recorder's CPU time read from /proc.

usage: python3 scripts/h200_attrib_sessions.py --server BIN --model GGUF --out DIR --sessions a,b [--spy a]
"""

from __future__ import annotations

import argparse
import json
import os
import random
import signal
import subprocess
import sys
import time
import urllib.request
from pathlib import Path
from typing import Any

N_VOCAB = 259  # tests/engines/gguf_model.py: <unk> <s> </s> + 256 byte tokens
BASE = ["--metrics", "-c", "16384", "-np", "1", "-fa", "off", "-fit", "off", "--cache-ram", "0"]

# name -> (flags after BASE, plan: (label, prompt tokens, tokens to generate, requests))
SESSIONS: dict[str, tuple[list[str], list[tuple[str, int, int, int]]]] = {
    # FFN weights of 12 of 16 layers in host memory, loaded the default way (mmap: pageable).
    "pageable": (
        ["-ngl", "999", "--n-cpu-ffn", "12", "-b", "128", "-ub", "128"],
        [("prefill", 6000, 1, 1), ("decode", 32, 64, 2)],
    ),
    # The same, with -lm none: host weights in pinned (CUDA host) buffers.
    "pinned": (
        ["-ngl", "999", "--n-cpu-ffn", "12", "-b", "128", "-ub", "128", "-lm", "none"],
        [("prefill", 6000, 1, 2), ("decode", 32, 64, 2)],
    ),
    # 12 of 16 layers run on the CPU: decode waits on the host while the GPU idles.
    "hostdecode": (
        ["-ngl", "4", "-lm", "none"],
        [("prefill", 256, 1, 1), ("decode", 32, 96, 2)],
    ),
    # MoE (scripts/device_attrib.sh writes model-moe.gguf): experts of every layer in host memory.
    "moe-pageable": (
        ["-ngl", "999", "--cpu-moe", "-b", "512", "-ub", "512"],
        [("prefill", 6000, 1, 1), ("decode", 32, 64, 2)],
    ),
    "moe-pinned": (
        ["-ngl", "999", "--cpu-moe", "-b", "512", "-ub", "512", "-lm", "none"],
        [("prefill", 6000, 1, 2), ("decode", 32, 64, 2)],
    ),
    # KV cache in host memory: attention runs on the CPU.
    "nkvo": (["-ngl", "999", "-nkvo", "-lm", "none"], [("prefill", 6000, 1, 1), ("decode", 32, 64, 2)]),
    # Partial offload by layer count, pinned.
    "ngl8": (["-ngl", "8", "-lm", "none", "-b", "512", "-ub", "512"], [("prefill", 4000, 1, 1), ("decode", 32, 48, 2)]),
}


def post(url: str, body: dict[str, Any], timeout_s: float = 300.0) -> dict[str, Any]:
    req = urllib.request.Request(url, json.dumps(body).encode(), {"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=timeout_s) as r:
        return json.loads(r.read())


def wait_health(url: str, proc: subprocess.Popen[bytes], timeout_s: float) -> float | None:
    end = time.time() + timeout_s
    while time.time() < end and proc.poll() is None:
        try:
            with urllib.request.urlopen(url + "/health", timeout=0.5) as r:
                if r.status == 200:
                    return time.time()
        except OSError:
            pass
        time.sleep(0.05)
    return None


def _cmdline(pid: str) -> bytes:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return b""


def stop(proc: subprocess.Popen[bytes], timeout_s: float) -> None:
    """SIGTERM, then SIGKILL if it is still there after ``timeout_s``."""
    proc.terminate()
    try:
        proc.wait(timeout_s)
    except subprocess.TimeoutExpired:
        proc.kill()


def cpu_s(pid: int) -> float | None:
    """utime + stime of a process (and its reaped children), seconds."""
    try:
        f = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return None
    return sum(int(x) for x in f[11:15]) / os.sysconf("SC_CLK_TCK")


def run(name: str, args: argparse.Namespace, model: str, port: int) -> dict[str, Any]:
    flags, plan = SESSIONS[name]
    url = f"http://127.0.0.1:{port}"
    argv = [args.server, "-m", model, "--host", "127.0.0.1", "--port", str(port), *BASE, *flags]
    log = Path(f"/tmp/llama-{name}.log")
    out = Path(args.out)
    rec_path = out / f"h200-{name}.jsonl.gz"
    t_start = time.time()
    server = subprocess.Popen(argv, stdout=open(log, "wb"), stderr=subprocess.STDOUT)  # noqa: SIM115
    rec_cmd = [sys.executable, "-m", "pcie_tui", "record", "--pid", str(server.pid), "--out", str(rec_path)]
    rec_cmd += ["--headless", "--interval", "0.1"]
    rec_log = open(out / f"{name}-record.txt", "wb")  # noqa: SIM115
    rec = subprocess.Popen(rec_cmd, stdout=rec_log, stderr=subprocess.STDOUT)
    # The GPU-only recorder beside it, same interval, for the engine side's cost as a ratio.
    base_cmd = [
        sys.executable,
        "-m",
        "pcie_tui",
        "record",
        "--no-engine",
        "--out",
        str(out / f"{name}-gpu-only.jsonl.gz"),
    ]
    base = subprocess.Popen(
        [*base_cmd, "--headless", "--interval", "0.1"], stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT
    )
    t_rec = time.time()
    spy = None
    if name in args.spy:
        spy = subprocess.Popen(
            [
                "py-spy",
                "record",
                "--pid",
                str(rec.pid),
                "--rate",
                "100",
                "--format",
                "raw",
                "-o",
                str(out / f"{name}-pyspy-record.txt"),
                "--nonblocking",
            ],
            stdout=subprocess.DEVNULL,
            stderr=open(out / f"{name}-pyspy.err", "wb"),  # noqa: SIM115
        )
    watch = watch_spy = None
    if name in args.watch:
        # The live TUI beside the recorder: a screenshot mid-prefill (ptyshot.py, carried in
        # .whl/tools) and, with py-spy, where its CPU goes.
        watch = subprocess.Popen(
            [
                sys.executable,
                ".whl/tools/ptyshot.py",
                str(int(args.watch_delay)),
                str(out / f"watch-{name}.svg"),
                "170",
                "45",
                sys.executable,
                "-m",
                "pcie_tui",
                "watch",
                "--pid",
                str(server.pid),
            ],
            stdout=open(out / f"{name}-watch.txt", "wb"),  # noqa: SIM115 - the child holds it
            stderr=subprocess.STDOUT,
        )
        time.sleep(1.0)
        app = next(
            (
                p
                for p in os.listdir("/proc")
                if p.isdigit() and b"pcie_tui\x00watch" in _cmdline(p) and b"ptyshot" not in _cmdline(p)
            ),
            None,
        )
        if app:
            watch_spy = subprocess.Popen(
                [
                    "py-spy",
                    "record",
                    "--pid",
                    app,
                    "--rate",
                    "100",
                    "--format",
                    "raw",
                    "-o",
                    str(out / f"{name}-pyspy-watch.txt"),
                    "--nonblocking",
                ],
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
            )
    truth: list[dict[str, Any]] = []
    steady0: tuple[float, float | None, float | None] | None = None
    res: dict[str, Any] = {"session": name, "argv": [Path(a).name if a in (args.server, model) else a for a in argv]}
    try:
        t_ready = wait_health(url, server, 300.0)
        res["ready_after_s"] = (t_ready - t_start) if t_ready else None
        if t_ready is None:
            raise RuntimeError(f"{name}: llama-server not ready (rc={server.poll()})")
        time.sleep(2.0)
        steady0 = (time.time(), cpu_s(rec.pid), cpu_s(base.pid))
        rng = random.Random(sum(map(ord, name)))
        for label, n_prompt, n_gen, count in plan:
            for _ in range(count):
                ids = [rng.randrange(3, N_VOCAB) for _ in range(n_prompt)]
                t0 = time.time()
                r = post(
                    url + "/completion",
                    {"prompt": ids, "n_predict": n_gen, "ignore_eos": True, "cache_prompt": False, "temperature": 0.0},
                )
                tm = r.get("timings") or {}
                truth.append(
                    {
                        "label": label,
                        "t_send": t0,
                        "t_done": time.time(),
                        "sent_prompt_ids": n_prompt,
                        **{k: tm.get(k) for k in ("prompt_n", "prompt_ms", "predicted_n", "predicted_ms")},
                    }
                )
            time.sleep(1.0)
        time.sleep(1.0)
    except Exception as e:  # one session failing must not lose the others
        res["error"] = f"{type(e).__name__}: {e}"
    finally:
        res["recorder_cpu_s"] = cpu_s(rec.pid)
        res["recorder_wall_s"] = time.time() - t_rec
        res["gpu_only_cpu_s"] = cpu_s(base.pid)
        if steady0 is not None and None not in steady0:
            wall = time.time() - steady0[0]
            eng, gpu = cpu_s(rec.pid), cpu_s(base.pid)
            if eng is not None and gpu is not None and wall > 0:
                # Steady state (after the server was ready): % of one core, both recorders at 10 Hz.
                res["steady_pct_core"] = {
                    "window_s": round(wall, 1),
                    "gpu_and_engine": round(100 * (eng - steady0[1]) / wall, 2),
                    "gpu_only": round(100 * (gpu - steady0[2]) / wall, 2),
                }
        base.send_signal(signal.SIGTERM)
        try:
            base.wait(20)
        except subprocess.TimeoutExpired:
            base.kill()
        rec.send_signal(signal.SIGTERM)
        try:
            res["recorder_rc"] = rec.wait(20)
        except subprocess.TimeoutExpired:
            rec.kill()
            res["recorder_rc"] = "killed"
        for p in (watch, spy, watch_spy):
            if p is not None:
                try:
                    p.wait(60 if p is watch else 10)
                except subprocess.TimeoutExpired:
                    p.kill()
        stop(server, 20)
        rec_log.close()
    res["truth"] = truth
    res["recording"] = rec_path.name
    (out / f"h200-{name}.truth.json").write_text(json.dumps(res, indent=1))
    lines = log.read_text(errors="replace").splitlines()
    keep = [ln for ln in lines if "slot " not in ln or "print_timing" in ln][:600]
    (out / f"{name}-server.log").write_text("\n".join(keep) + "\n")
    print(json.dumps({k: v for k, v in res.items() if k != "truth"}), flush=True)
    for t in truth:
        print("  ", {k: (round(v, 1) if isinstance(v, float) else v) for k, v in t.items() if not k.startswith("t_")})
    return res


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--server", required=True)
    ap.add_argument("--model", required=True)
    ap.add_argument("--moe-model", default=None)
    ap.add_argument("--out", required=True)
    ap.add_argument("--sessions", required=True, help="comma-separated names: " + ",".join(SESSIONS))
    ap.add_argument("--spy", default="", help="sessions whose recorder py-spy samples")
    ap.add_argument("--watch", default="", help="sessions to watch live in the TUI too (screenshot, CPU, py-spy)")
    ap.add_argument("--watch-delay", type=float, default=9.0, help="seconds from server start to the screenshot")
    args = ap.parse_args()
    args.spy = set(filter(None, args.spy.split(",")))
    args.watch = set(filter(None, args.watch.split(",")))
    Path(args.out).mkdir(parents=True, exist_ok=True)
    for i, name in enumerate(filter(None, args.sessions.split(","))):
        model = args.moe_model if name.startswith("moe") else args.model
        run(name, args, model, 18090 + i)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
