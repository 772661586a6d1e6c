"""The live TUI's CPU on a GPU machine, attached to a llama-server under load, against the GPU side alone.

Run ON the GPU machine (scripts/device_attrib.sh calls it with WATCH_CPU=1). Starts llama-server
with the pageable session's flags, then, in 170x45 pseudo-terminals at once: `pcie-tui watch --pid`
(engine attached) and `pcie-tui watch --no-engine` (the GPU side alone), plus a third `watch --pid`
under ptyshot.py that saves a screenshot mid-prefill and exits. Drives a 6000-token prefill, then
192-token decodes until about 10 s before the end, keeps both apps up for --seconds, and reads each app's CPU from /proc at 10 s (start-up)
and at the end (steady = the difference over the time between). py-spy samples the attached app's
steady part. Writes watch-cpu.json, pyspy-watch-pid.txt and watch-pid-170x45.svg under --out.

usage: python3 scripts/h200_watch_cpu.py --server BIN --model GGUF --out DIR [--seconds 60]
"""

from __future__ import annotations

import argparse
import json
import os
import pty
import random
import subprocess
import sys
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
from h200_attrib_sessions import BASE, N_VOCAB, SESSIONS, cpu_s, post, stop, wait_health  # noqa: E402

STARTUP_S = 10.0


def app_in_pty(argv: list[str]) -> tuple[subprocess.Popen[bytes], threading.Thread]:
    """Start a Textual app in a 170x45 pseudo-terminal; a thread drains what it draws."""
    import fcntl
    import struct
    import termios

    master, slave = pty.openpty()
    fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", 45, 170, 0, 0))
    env = dict(os.environ, TERM="xterm-256color", COLUMNS="170", LINES="45")
    p = subprocess.Popen(argv, stdin=slave, stdout=slave, stderr=slave, env=env, start_new_session=True)
    os.close(slave)

    def drain() -> None:
        while True:
            try:
                if not os.read(master, 65536):
                    break
            except OSError:
                break

    t = threading.Thread(target=drain, daemon=True)
    t.start()
    return p, t


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--server", required=True)
    ap.add_argument("--model", required=True)
    ap.add_argument("--out", required=True)
    ap.add_argument("--seconds", type=float, default=60.0)
    ap.add_argument("--shot-delay", type=int, default=14)
    args = ap.parse_args()
    if args.seconds < STARTUP_S + 10:
        ap.error(f"--seconds must be at least {STARTUP_S + 10:.0f} (start-up {STARTUP_S:.0f} s, then a steady window)")
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    flags, _ = SESSIONS["pageable"]
    port = 18099
    url = f"http://127.0.0.1:{port}"
    argv = [args.server, "-m", args.model, "--host", "127.0.0.1", "--port", str(port), *BASE, *flags]
    log = open("/tmp/llama-watchcpu.log", "wb")  # noqa: SIM115
    server = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT)
    py = sys.executable
    t0 = time.time()
    attached, _ = app_in_pty([py, "-m", "pcie_tui", "watch", "--pid", str(server.pid)])
    alone, _ = app_in_pty([py, "-m", "pcie_tui", "watch", "--no-engine"])
    shot = subprocess.Popen(
        [py, ".whl/tools/ptyshot.py", str(args.shot_delay), str(out / "watch-pid-170x45.svg"), "170", "45"]
        + [py, "-m", "pcie_tui", "watch", "--pid", str(server.pid)],
        stdout=open(out / "ptyshot.txt", "wb"),  # noqa: SIM115
        stderr=subprocess.STDOUT,
    )
    res: dict[str, object] = {"argv": [Path(a).name if a in (args.server, args.model) else a for a in argv]}
    truth = []

    def drive() -> None:
        if wait_health(url, server, 120.0) is None:
            res["error"] = f"llama-server not ready (rc={server.poll()})"
            return
        time.sleep(2.0)
        rng = random.Random(7)
        plan = [("prefill", 6000, 1), ("decode", 32, 192), ("decode", 32, 192)]
        while plan:
            label, n_prompt, n_gen = plan.pop(0)
            if not plan and time.time() < t0 + args.seconds - 12:
                plan.append(("decode", 32, 192))  # keep decoding so the load covers the steady window
            ids = [rng.randrange(3, N_VOCAB) for _ in range(n_prompt)]
            t = time.time()
            try:
                r = post(
                    url + "/completion", {"prompt": ids, "n_predict": n_gen, "ignore_eos": True, "cache_prompt": False}
                )
            except OSError as e:  # the server stopped at the end of the window
                res["driver_error"] = f"{type(e).__name__}: {e}"
                return
            tm = r.get("timings") or {}
            truth.append({"label": label, "t_send": t - t0, "t_done": time.time() - t0, **tm})

    driver = threading.Thread(target=drive, daemon=True)
    driver.start()
    time.sleep(max(0.0, t0 + STARTUP_S - time.time()))
    c0 = {"attached": cpu_s(attached.pid), "gpu_only": cpu_s(alone.pid)}
    w0 = time.time()
    spy = subprocess.Popen(
        ["py-spy", "record", "--pid", str(attached.pid), "--rate", "100", "--format", "raw", "--nonblocking"]
        + ["--duration", str(int(args.seconds - STARTUP_S - 2)), "-o", str(out / "pyspy-watch-pid.txt")],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    time.sleep(max(0.0, t0 + args.seconds - time.time()))
    c1 = {"attached": cpu_s(attached.pid), "gpu_only": cpu_s(alone.pid)}
    wall = time.time() - w0
    res["startup_cpu_s"] = {k: v for k, v in c0.items()}
    res["steady_window_s"] = round(wall, 1)
    res["steady_pct_core"] = {
        k: round(100 * (c1[k] - c0[k]) / wall, 2) if c1[k] is not None and c0[k] is not None else None for k in c0
    }
    res["apps_alive_at_end"] = {"attached": attached.poll() is None, "gpu_only": alone.poll() is None}
    res["requests"] = truth
    for p in (attached, alone):
        p.terminate()
    for p in (attached, alone, spy, shot):
        try:
            p.wait(30)
        except subprocess.TimeoutExpired:
            p.kill()
    stop(server, 20)
    driver.join(5)
    res["driver_done"] = not driver.is_alive()  # false: requests were still running at the end
    res["screenshot"] = (out / "ptyshot.txt").read_text(errors="replace").strip()
    (out / "watch-cpu.json").write_text(json.dumps(res, indent=1))
    print(json.dumps(res, indent=1), flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
