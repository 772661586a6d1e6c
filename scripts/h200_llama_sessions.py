"""Record two real llama-server sessions on a GPU (run ON the H200; scripts/device_llama.sh calls it).

(a) ``full``: every layer offloaded (-ngl 999): load, long-prompt prefill, decode.
(b) ``partial``: -ngl below the layer count: the layers left in host memory are streamed to
    the GPU for every prefill micro-batch (llama.cpp offloads large batches), so prefill
    should be link-bound while decode runs those layers on the CPU.

Our own NvmlCollector samples at 10 Hz; the engine field comes from LlamaCppClient through
the EnginePoller (the same path as ``pcie-tui record``).  The engine phase is the poller's
(loading/down from liveness and link traffic) with prefill/decode taken from /slots
(``slot_phase``), since llama-server's generation counter only moves when a request ends.
Each tick also carries ``label``: what the load driver was doing.  Prompts are random token
ids; no text is sent or recorded.

usage: python3 scripts/h200_llama_sessions.py --server BIN --model GGUF --layers N --out DIR
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import random
import socket
import subprocess
import sys
import threading
import time
import urllib.request
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from pcie_tui import __version__  # noqa: E402
from pcie_tui.analyze.phases import phase_verdicts  # noqa: E402
from pcie_tui.analyze.session import analyze  # noqa: E402
from pcie_tui.core.model import Sample, SessionHeader  # noqa: E402
from pcie_tui.engines.llamacpp.client import LlamaCppClient
from pcie_tui.engines.llamacpp.log import request_stats  # noqa: E402
from pcie_tui.engines.llamacpp.scrape import slot_phase  # noqa: E402
from pcie_tui.engines.poller import EnginePoller  # noqa: E402
from pcie_tui.recording.writer import RecordingWriter  # noqa: E402
from pcie_tui.sources.nvml import NvmlCollector  # noqa: E402

INTERVAL_S = 0.1
N_VOCAB = 259  # tests/engines/gguf_model.py: <unk> <s> </s> + 256 byte tokens


def post(url: str, body: dict[str, Any], timeout_s: float = 120.0) -> dict[str, Any]:
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


class BufferedClient(LlamaCppClient):
    """Keeps the log's completed requests until a tick takes them: the poller hands its latest
    scrape to every tick, so without this a request would repeat on several ticks or, when two
    scrapes fall between ticks, be lost."""

    def __init__(self, *a: Any, **kw: Any) -> None:
        super().__init__(*a, **kw)
        self._pending: list[dict[str, Any]] = []
        self._plock = threading.Lock()

    def read(self) -> Any:
        s = super().read()
        reqs = s.extra.pop("requests", None)
        if reqs:
            with self._plock:
                self._pending.extend(reqs)
        return s

    def take_requests(self) -> list[dict[str, Any]]:
        with self._plock:
            out, self._pending = self._pending, []
        return out


class TickLoop(threading.Thread):
    """10 Hz: GPU readings + the poller's latest engine sample, labelled with the driver's step."""

    def __init__(self, collector: NvmlCollector, poller: EnginePoller, client: BufferedClient) -> None:
        super().__init__(daemon=True)
        self.collector, self.poller, self.client = collector, poller, client
        self.infos = collector.gpu_infos()
        self.label = "start"
        self.samples: list[Sample] = []
        self.events: list[dict[str, Any]] = []
        self.stop = threading.Event()

    def run(self) -> None:
        nxt = time.monotonic()
        while not self.stop.is_set():
            t = time.time()
            gpus = self.collector.read()
            eng = self.poller.sample_for_tick(t, gpus, self.infos)
            if eng is not None and eng.up and eng.phase in ("prefill", "decode", "mixed", "idle"):
                sp = slot_phase(eng)
                if sp is not None:
                    eng = dataclasses.replace(eng, phase=sp)
            if eng is not None:
                reqs = self.client.take_requests()
                extra = {k: v for k, v in eng.extra.items() if k != "requests"}
                eng = dataclasses.replace(eng, extra={**extra, "requests": reqs} if reqs else extra)
            self.samples.append(Sample(t=t, gpus=gpus, engine=eng, extra={"label": self.label}))
            self.events.extend(self.poller.drain_events())
            nxt += INTERVAL_S
            self.stop.wait(max(0.0, nxt - time.monotonic()))


def drive(url: str, loop: TickLoop, label: str, seconds: float, prompt_len: int, n_predict: int) -> list[dict]:
    """Send requests one after another for about ``seconds``; returns what the client saw (numbers only)."""
    loop.label = label
    out = []
    end = time.time() + seconds
    rng = random.Random(len(label) * 7919 + prompt_len)
    while time.time() < end:
        ids = [rng.randrange(3, N_VOCAB) for _ in range(prompt_len)]
        t0 = time.time()
        r = post(
            url + "/completion",
            {"prompt": ids, "n_predict": n_predict, "ignore_eos": True, "cache_prompt": False, "temperature": 0.0},
        )
        tm = r.get("timings") or {}
        out.append(
            {
                "label": label,
                "t_send": t0,
                "wall_ms": (time.time() - t0) * 1e3,
                "sent_ids": len(ids),
                **{k: tm.get(k) for k in ("prompt_n", "prompt_ms", "predicted_n", "predicted_ms")},
            }
        )
    return out


def run_session(name: str, args: argparse.Namespace, collector: NvmlCollector, ngl: int, port: int) -> dict:
    url = f"http://127.0.0.1:{port}"
    argv = [
        args.server,
        "-m",
        args.model,
        "--host",
        "127.0.0.1",
        "--port",
        str(port),
        "--metrics",
        "-ngl",
        str(ngl),
        "-c",
        str(args.ctx),
        "-b",
        "512",
        "-ub",
        "512",
        "-np",
        "1",
        "-fa",
        "off",
        "-lm",
        "none",
        "-fit",
        "off",
        *args.extra_args,
        *(args.partial_extra_args if name == "partial" else []),
    ]
    log_path = Path(f"/tmp/llama-{name}.log")
    logf = open(log_path, "wb")  # noqa: SIM115 - the server holds it
    t_start = time.time()
    proc = subprocess.Popen(argv, stdout=logf, stderr=subprocess.STDOUT)
    client = BufferedClient(url, pid=proc.pid)  # finds the log through /proc/PID/fd/1
    poller = EnginePoller(client, interval_s=INTERVAL_S, rediscover=False)
    poller.start()
    loop = TickLoop(collector, poller, client)
    loop.label = "load"
    loop.start()
    client_reqs: list[dict] = []
    desc: dict[str, Any] | None = None
    t_ready = None
    try:
        t_ready = wait_health(url, proc, 240.0)
        if t_ready is None:
            raise RuntimeError(f"{name}: llama-server did not become ready (rc={proc.poll()})")
        loop.label = "idle"
        time.sleep(1.5)
        client_reqs += drive(url, loop, "prefill", args.prefill_s, args.prompt_len, 1)
        loop.label = "idle"
        time.sleep(1.0)
        n_dec = args.decode_tokens_full if name == "full" else args.decode_tokens_partial
        client_reqs += drive(url, loop, "decode", args.decode_s, 32, n_dec)
        loop.label = "idle"
        time.sleep(1.0)
        desc = poller.describe()
        if not desc.get("version"):
            desc = client.describe()
    finally:
        loop.label = "stop"
        proc.terminate()
        try:
            proc.wait(20)
        except subprocess.TimeoutExpired:
            proc.kill()
        time.sleep(0.5)
        loop.stop.set()
        loop.join(5)
        poller.stop()
        logf.close()
    header = SessionHeader(
        created=datetime.fromtimestamp(t_start, timezone.utc).isoformat(),
        host=socket.gethostname(),
        tool_version=__version__,
        gpus=loop.infos,
        engine=desc,
        interval_s=INTERVAL_S,
        extra={
            "source": f"scripts/h200_llama_sessions.py on the project's H200: session '{name}' "
            "(NvmlCollector 10 Hz, LlamaCppClient via EnginePoller; labels = load driver step)",
            "session": name,
            "server_argv": [Path(a).name if a in (args.server, args.model) else a for a in argv],
            "model_shape": args.model_shape,
            "client_requests": client_reqs,
            "ready_after_s": (t_ready - t_start) if t_ready else None,
        },
    )
    out = Path(args.out) / f"h200-llama-{name}.jsonl.gz"
    lines: list[tuple[float, Any]] = [(s.t, s) for s in loop.samples] + [(e.get("t", 0.0), e) for e in loop.events]
    lines.sort(key=lambda x: x[0])
    with RecordingWriter(out, header) as w:
        for t, obj in lines:
            if isinstance(obj, Sample):
                w.write(obj)
            else:
                fields = {k: v for k, v in obj.items() if k not in ("t", "event")}
                w.write_event(str(obj.get("event")), t, **fields)
    if args.keep_log:
        Path(args.out, f"server-{name}.log").write_bytes(log_path.read_bytes()[-400_000:])
    return summarize(name, header, loop.samples, client_reqs, out, log_path)


def summarize(
    name: str, header: SessionHeader, samples: list[Sample], client_reqs: list[dict], out: Path, log_path: Path
) -> dict:
    an = analyze(header, samples)
    per_label: dict[str, dict[str, Any]] = {}
    for key in ("label", "phase"):
        groups: dict[str, list[Sample]] = {}
        for s in samples:
            k = s.extra.get("label") if key == "label" else (s.engine.phase if s.engine else None)
            groups.setdefault(str(k), []).append(s)
        for k, ss in groups.items():
            g = [x.gpus[0] for x in ss if x.gpus]

            def med(vals: list[float | None]) -> float | None:
                v = sorted(x for x in vals if x is not None)
                return v[len(v) // 2] if v else None

            per_label[f"{key}:{k}"] = {
                "ticks": len(ss),
                "rx_GBps_median": (m / 1e9 if (m := med([x.pcie_rx_Bps for x in g])) is not None else None),
                "rx_GBps_max": max((x.pcie_rx_Bps or 0) for x in g) / 1e9 if g else None,
                "tx_GBps_median": (m / 1e9 if (m := med([x.pcie_tx_Bps for x in g])) is not None else None),
                "dram_util_median": med([x.dram_bw_util for x in g]),
                "sm_util_median": med([x.sm_util for x in g]),
            }
    reqs = [r for s in samples if s.engine for r in (s.engine.extra.get("requests") or [])]
    buffers = [
        ln.strip()
        for ln in log_path.read_text(errors="replace").splitlines()
        if "buffer size" in ln or "offloaded" in ln
    ][:12]
    res = {
        "session": name,
        "file": str(out),
        "bytes": out.stat().st_size,
        "ticks": len(samples),
        "phase_verdicts": phase_verdicts(an).get(0, {}),
        "gpu0_summary_phases": an.summary()["gpus"][0]["phases"] if an.summary()["gpus"] else None,
        "per_label": per_label,
        "log_request_stats": request_stats(reqs),
        "client_requests": len(client_reqs),
        "client_vs_log_prompt_n": [(r.get("prompt_n"), r.get("predicted_n")) for r in client_reqs][:40],
        "log_requests": [(r.get("prompt_n"), r.get("predicted_n")) for r in reqs][:40],
        "server_log_lines": buffers,
    }
    print(json.dumps({k: v for k, v in res.items() if k != "gpu0_summary_phases"}, indent=1, default=str))
    return res


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--server", required=True)
    ap.add_argument("--model", required=True)
    ap.add_argument("--layers", type=int, required=True)
    ap.add_argument("--partial-ngl", type=int, default=None)
    ap.add_argument("--out", required=True)
    ap.add_argument("--ctx", type=int, default=16384)
    ap.add_argument("--prompt-len", type=int, default=8000)
    ap.add_argument("--prefill-s", type=float, default=4.0)
    ap.add_argument("--decode-s", type=float, default=4.0)
    ap.add_argument("--decode-tokens-full", type=int, default=256)
    ap.add_argument("--decode-tokens-partial", type=int, default=16)
    ap.add_argument("--model-shape", type=json.loads, default={})
    ap.add_argument("--only", choices=["full", "partial"], default=None)
    ap.add_argument("--extra-args", type=json.loads, default=[], help="JSON list of extra llama-server flags")
    ap.add_argument("--partial-extra-args", type=json.loads, default=[], help="JSON list, partial session only")
    ap.add_argument("--keep-log", action="store_true", help="copy the server log (timings and load lines) to --out")
    args = ap.parse_args()
    Path(args.out).mkdir(parents=True, exist_ok=True)
    collector = NvmlCollector(indices=[0])
    results = []
    try:
        plan = [("full", 999, 18081), ("partial", args.partial_ngl or max(1, args.layers // 4), 18082)]
        for name, ngl, port in plan:
            if args.only and name != args.only:
                continue
            try:
                results.append(run_session(name, args, collector, ngl, port))
            except Exception as e:  # one session failing must not lose the other
                print(f"session {name} failed: {type(e).__name__}: {e}", flush=True)
                results.append({"session": name, "error": f"{type(e).__name__}: {e}"})
    finally:
        collector.close()
    Path(args.out, "h200-llama-summary.json").write_text(json.dumps(results, indent=1, default=str))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
