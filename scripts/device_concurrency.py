"""Concurrent streaming clients against a real CUDA llama-server, recorded by the real CLI (run ON the GPU
machine; scripts/device_concurrency.sh calls it).

For each case: start llama-server (``-np SLOTS``, partial offload so prefill streams host weights over the
link), start ``pcie-tui record --pid`` on it (the CLI a user runs), run CONCURRENCY closed-loop streaming
clients (each sends its next request when its last one ends) with long random-token prompts, stop the
recording, then ``pcie-tui report`` (text and --json). The clients' own timings (numbers only) go beside the
recording as ``NAME.clients.json``: the truth for TTFT. Prompts are random token ids; no text is sent.

usage: python3 scripts/device_concurrency.py --server BIN --model GGUF --out DIR
           --case NAME:SLOTS:CONC:N:NGL[:PROMPT_LEN[:N_PREDICT[:EXTRA,SERVER,ARGS]]]
"""

from __future__ import annotations

import argparse
import json
import random
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.request
from pathlib import Path

N_VOCAB = 259  # tests/engines/gguf_model.py: <unk> <s> </s> + 256 byte tokens


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def wait_health(url: str, proc: subprocess.Popen[bytes], timeout_s: float) -> bool:
    end = time.time() + timeout_s
    while time.time() < end and proc.poll() is None:
        try:
            with urllib.request.urlopen(url + "/health", timeout=2) as r:
                if r.status == 200:
                    return True
        except OSError:
            pass
        time.sleep(0.25)
    return False


def stream(url: str, prompt: list[int], n_predict: int) -> dict:
    # Byte tokens 0x80..0xFF (ids 3 + byte) are banned: the server holds back a partial UTF-8 character, so
    # the client would see such a first token only with the next ones (tests/engines/llama_server.py).
    body = {"prompt": prompt, "n_predict": n_predict, "stream": True, "cache_prompt": False, "ignore_eos": True,
            "temperature": 0.0, "return_tokens": True,
            "logit_bias": [[i, False] for i in range(3 + 0x80, 3 + 0x100)]}  # fmt: skip
    req = urllib.request.Request(url + "/completion", json.dumps(body).encode(), {"Content-Type": "application/json"})
    out = {"t_send": time.time(), "t_first": None, "t_end": None, "tokens": 0, "prompt_tokens": len(prompt)}
    with urllib.request.urlopen(req, timeout=600) as r:
        for raw in r:
            line = raw.decode("utf-8", "replace").strip()
            if not line.startswith("data:"):
                continue
            ev = json.loads(line[5:])
            n = len(ev.get("tokens") or [])
            if n and out["t_first"] is None:
                out["t_first"] = time.time()
            out["tokens"] += n
            if ev.get("stop"):
                t = ev.get("timings") or {}
                out["server_prompt_ms"], out["server_predicted_ms"] = t.get("prompt_ms"), t.get("predicted_ms")
                break
    out["t_end"] = time.time()
    return out


def clients(url: str, conc: int, n: int, prompt_len: int, n_predict: int) -> list[dict]:
    rng, lock, left, done = random.Random(11), threading.Lock(), [n], []

    def worker() -> None:
        while True:
            with lock:
                if left[0] <= 0:
                    return
                left[0] -= 1
                prompt = [rng.randrange(3, N_VOCAB) for _ in range(prompt_len)]
            r = stream(url, prompt, n_predict)
            with lock:
                done.append(r)

    ws = [threading.Thread(target=worker) for _ in range(conc)]
    for w in ws:
        w.start()
    for w in ws:
        w.join()
    return done


def run_case(args: argparse.Namespace, spec: str) -> None:  # noqa: PLR0915 - one case, start to end
    name, slots_, conc_, n_, ngl_, *rest = spec.split(":")
    slots, conc, n, ngl = int(slots_), int(conc_), int(n_), ngl_  # ngl: a number, "auto" or "all"
    prompt_len = int(rest[0]) if rest else args.prompt_len
    n_predict = int(rest[1]) if len(rest) > 1 else args.n_predict
    extra = [a for a in rest[2].split(",") if a] if len(rest) > 2 else []
    out = Path(args.out)
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    log = out / f"{name}.server.log"
    argv = [args.server, "-m", args.model, "--host", "127.0.0.1", "--port", str(port), "-np", str(slots),
            "-c", str(slots * (prompt_len + n_predict + 64)), "-ngl", str(ngl), "--metrics", "-t", "16", *extra]  # fmt: skip
    print(f"== {name}: {' '.join(argv[1:])}", flush=True)
    with open(log, "wb") as lf:
        srv = subprocess.Popen(argv, stdout=lf, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
    try:
        if not wait_health(url, srv, 300):
            print(f"{name}: server not ready", flush=True)
            return
        rec_path = out / f"{name}.jsonl.gz"
        rec = subprocess.Popen([sys.executable, "-m", "pcie_tui", "record", "--pid", str(srv.pid), "--headless",
                                "--interval", "0.1", "--force", "--out", str(rec_path)])  # fmt: skip
        time.sleep(3.0)
        t0 = time.time()
        done = clients(url, conc, n, prompt_len, n_predict)
        time.sleep(2.0)  # the last requests' log lines and a tick after them
        rec.send_signal(signal.SIGTERM)
        rec.wait(60)
        ttft = sorted(r["t_first"] - r["t_send"] for r in done if r["t_first"])
        truth = {"case": name, "slots": slots, "concurrency": conc, "ngl": ngl, "prompt_len": prompt_len,
                 "n_predict": n_predict, "server_args": argv[3:], "t0": t0, "requests": done,
                 "client_ttft_p50": ttft[len(ttft) // 2] if ttft else None}  # fmt: skip
        (out / f"{name}.clients.json").write_text(json.dumps(truth, indent=1))
        print(f"{name}: {len(done)} requests, client TTFT p50 {truth['client_ttft_p50']}", flush=True)
        for extra in ([], ["--json"]):
            r = subprocess.run([sys.executable, "-m", "pcie_tui", "report", *extra, str(rec_path)],
                               capture_output=True, text=True, timeout=300)  # fmt: skip
            suffix = "report.json" if extra else "report.txt"
            (out / f"{name}.{suffix}").write_text(r.stdout + r.stderr)
    finally:
        srv.terminate()
        try:
            srv.wait(30)
        except subprocess.TimeoutExpired:
            srv.kill()


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--server", required=True)
    ap.add_argument("--model", required=True)
    ap.add_argument("--out", required=True)
    ap.add_argument("--prompt-len", type=int, default=4000)
    ap.add_argument("--n-predict", type=int, default=8)
    ap.add_argument("--case", action="append", required=True, help="NAME:SLOTS:CONC:N:NGL[:PROMPT[:PREDICT[:ARGS]]]")
    args = ap.parse_args()
    for spec in args.case:
        run_case(args, spec)
    return 0


if __name__ == "__main__":
    sys.exit(main())
