"""Faults that end nothing (issue 25, deliverable 3): a GPU that stops answering, NVML going away, the engine
killed and replaced mid-recording, the wall clock jumping. Each: one line in plain words as it happens, an
event line in the recording, the session keeps watching what it still can, every tick written reads back,
the last line lists the faults, and `record --headless` ends with the cause's documented exit code.

`pcie-tui record --headless` runs as a real process on the H200 stand-in NVML (tests/fakenvml), with the
faults injected around it: NVML calls that start failing with the real pynvml error codes, a clock that
steps; and a real llama-server killed with SIGKILL and started again on the same port."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import pytest

from pcie_tui.recording.reader import read_recording
from pcie_tui.report.text import report_file
from pcie_tui.sources.faults import EXIT_CODES, FaultWatch, SessionClock

REPO = Path(__file__).resolve().parents[1]

# The stand-in NVML, made to fail after FAIL_AFTER s with the given pynvml error (every device call),
# and a wall clock that steps by JUMP s after JUMP_AFTER s (time.time patched before pcie-tui is imported).
RUNNER = """
import sys, time
sys.path.insert(0, "tests")
fail_after, code, n_gpus, jump_after, jump = float(sys.argv[1]), sys.argv[2], int(sys.argv[3]), float(sys.argv[4]), float(sys.argv[5])
del sys.argv[1:6]
t0, real_time = time.monotonic(), time.time
if jump:
    time.time = lambda: real_time() + (jump if time.monotonic() - t0 > jump_after else 0.0)
import pynvml, fakenvml
fake = fakenvml.FakeNvml(fakenvml.load_capture(), n_gpus=n_gpus)

class Failing:
    def __getattr__(self, name):
        f = getattr(fake, name)
        if not callable(f) or not name.startswith("nvml") or name in ("nvmlInit", "nvmlShutdown") or not code:
            return f
        def call(*a, **k):
            if time.monotonic() - t0 > fail_after:
                raise pynvml.NVMLError(getattr(pynvml, code))
            return f(*a, **k)
        return call

sys.modules["pynvml"] = Failing()
from pcie_tui.cli.main import main
sys.exit(main(sys.argv[1:]))
"""


def _record(out: Path, *, fail_after: float = 1e9, code: str = "", n_gpus: int = 1, jump_after: float = 0.0,
            jump: float = 0.0, seconds: float = 4.0) -> subprocess.CompletedProcess[str]:  # fmt: skip
    args = ["record", "--headless", "--no-engine", "--interval", "0.1", "--duration", str(seconds), "--out", str(out)]
    return subprocess.run(
        [sys.executable, "-c", RUNNER, str(fail_after), code, str(n_gpus), str(jump_after), str(jump), *args],
        cwd=REPO, capture_output=True, text=True, timeout=120,
    )  # fmt: skip


def _wait_for_engine_up(out: Path, timeout_s: float = 40.0) -> None:
    """Until the recording holds a tick whose engine answered."""
    end = time.monotonic() + timeout_s
    while time.monotonic() < end:
        if out.exists() and '"up":true' in out.read_text().replace(" ", ""):
            return
        time.sleep(0.2)
    raise AssertionError(f"no tick with the engine up in {timeout_s} s")


def _lines(out: Path) -> list[dict]:
    return [json.loads(x) for x in out.read_text().splitlines() if x.strip()]


def test_a_gpu_that_falls_off_the_bus_is_said_once_and_the_recording_goes_on(tmp_path: Path) -> None:
    out = tmp_path / "lost.jsonl"
    p = _record(out, fail_after=1.5, code="NVML_ERROR_GPU_IS_LOST")
    assert p.returncode == EXIT_CODES["gpu_lost"] == 5, p.stderr
    said = [ln for ln in p.stderr.splitlines() if "stopped answering" in ln]
    assert len(said) == 1 and "GPU 0 stopped answering at" in said[0] and "fell off the bus" in said[0], p.stderr
    assert "faults: gpu lost (exit 5)" in p.stderr
    lines = _lines(out)
    lost = [x for x in lines if x.get("event") == "gpu_lost"]
    assert len(lost) == 1 and lost[0]["gpu"] == 0
    ticks = [x for x in lines if "gpus" in x and "t" in x]
    after = [x for x in ticks if x["t"] > lost[0]["t"]]
    assert len(after) >= 10  # still recording, 10 Hz
    assert all(g.get("sm_util") is None and g.get("pcie_rx_Bps") is None for x in after for g in x["gpus"])  # not 0
    assert lines[-1]["event"] == "recording_ended" and lines[-1]["faults"][0]["kind"] == "gpu_lost"
    rec = read_recording(out, warn=False)
    assert len(rec.samples) == len(ticks)  # every tick written reads back
    report = report_file(out)[0]
    assert [f["event"] for f in report["faults"]] == ["gpu_lost"]
    assert "GPU 0 stopped answering" in report["faults"][0]["words"]


def test_nvml_going_away_under_every_gpu_is_one_fault(tmp_path: Path) -> None:
    out = tmp_path / "nvml.jsonl"
    p = _record(out, fail_after=1.5, code="NVML_ERROR_UNINITIALIZED", n_gpus=2)
    assert p.returncode == 5, p.stderr
    assert "every GPU stopped answering at" in p.stderr and "NVML was shut down or unloaded" in p.stderr
    events = [x for x in _lines(out) if x.get("event") == "nvml_lost"]
    assert len(events) == 1 and events[0]["gpus"] == [0, 1]


def test_a_clock_that_jumps_back_loses_no_tick(tmp_path: Path) -> None:
    out = tmp_path / "clock.jsonl"
    p = _record(out, jump_after=1.5, jump=-3600.0)
    assert p.returncode == EXIT_CODES["clock_jump"] == 7, p.stderr
    assert "the system clock jumped back by 3600.0 s" in p.stderr
    lines = _lines(out)
    ticks = [x["t"] for x in lines if "gpus" in x and "t" in x]
    assert all(b > a for a, b in zip(ticks, ticks[1:], strict=False))  # the recording's time runs on
    assert max(b - a for a, b in zip(ticks, ticks[1:], strict=False)) < 1.0
    jump = next(x for x in lines if x.get("event") == "clock_jump")
    assert jump["jump_s"] == pytest.approx(-3600, abs=1)
    rec = read_recording(out, warn=False)
    assert len(rec.samples) == len(ticks) and not rec.warnings  # nothing set aside, no gap


def test_the_session_clock_follows_drift_and_takes_out_steps() -> None:
    wall, mono = [1000.0], [5.0]
    clock = SessionClock(lambda: wall[0], lambda: mono[0])
    for _ in range(10):  # 50 ms of slewing per 0.1 s tick: followed, never a jump
        mono[0] += 0.1
        wall[0] += 0.15
        t, ev = clock.now()
        assert ev is None and t == wall[0]
    mono[0] += 0.1
    wall[0] += 0.1 + 30.0  # a step forward
    t, ev = clock.now()
    assert ev is not None and ev["jump_s"] == pytest.approx(30.0) and t == pytest.approx(wall[0] - 30.0)
    mono[0] += 0.1
    wall[0] += 0.1
    assert clock.now()[0] == pytest.approx(t + 0.1)


def test_engine_events_become_faults_with_their_code() -> None:
    w = FaultWatch()
    w.engine([{"event": "engine_down", "t": 10.0, "pid": 7, "pid_alive": False, "reason": "connection refused"}])
    w.engine([{"event": "engine_reattach", "t": 12.0, "old_pid": 7, "new_pid": 9}])
    kinds = [f.kind for f in w.drain()]
    assert kinds == ["engine_lost", "engine_replaced"] and w.exit_code() == 6
    assert not w.drain()
    assert FaultWatch().exit_code() == 0
    g = FaultWatch()
    g.gpus(1.0, {0: "x"}, 2)
    g.gpus(1.1, {0: "x"}, 2)  # said once
    g.gpus(1.2, {}, 2)
    assert [f.kind for f in g.drain()] == ["gpu_lost", "gpu_back"]


@pytest.mark.engine
def test_a_llama_server_killed_and_started_again_mid_recording(tmp_path: Path) -> None:
    from engines.gguf_model import write_llama_gguf
    from engines.llama_server import LlamaServer, llama_available

    why = llama_available()
    if why:
        pytest.skip(why)
    model = tmp_path / "tiny.gguf"
    write_llama_gguf(model, n_embd=256, n_ff=768, n_layer=4, n_head=8)
    srv = LlamaServer(model, tmp_path / "a.log").start()
    out = tmp_path / "engine.jsonl"
    args = ["record", "--headless", "--pid", str(srv.pid), "--interval", "0.1", "--duration", "20", "--out", str(out)]
    rec_proc = subprocess.Popen(
        [sys.executable, "-c", RUNNER, "1e9", "", "1", "0", "0", *args], cwd=REPO, stderr=subprocess.PIPE, text=True
    )
    again = None
    try:
        _wait_for_engine_up(out)  # the recorder watched it answer before it is killed (a loaded machine is slow)
        time.sleep(1.0)
        old_pid = srv.pid
        srv.kill()
        again = LlamaServer(model, tmp_path / "b.log", port=srv.port).start()
        _, err = rec_proc.communicate(timeout=60)
    finally:
        if rec_proc.poll() is None:
            rec_proc.kill()
        srv.stop()
        if again is not None:
            again.stop()
    assert rec_proc.returncode == EXIT_CODES["engine_lost"] == 6, err
    assert f"the engine (pid {old_pid}) exited at" in err, err
    assert f"a new engine process (pid {again.pid})" in err, err
    lines = _lines(out)
    kinds = [x.get("event") for x in lines]
    assert "engine_down" in kinds and "engine_reattach" in kinds
    assert lines[-1]["event"] == "recording_ended" and [f["kind"] for f in lines[-1]["faults"]] == [
        "engine_lost",
        "engine_replaced",
    ]
    ticks = [x for x in lines if "gpus" in x and "t" in x]
    assert len(read_recording(out, warn=False).samples) == len(ticks) >= 100
    up_after = [
        x for x in ticks if (x.get("engine") or {}).get("up") and x["t"] > lines[kinds.index("engine_reattach")]["t"]
    ]
    assert up_after, "the new engine was not watched"
    words = [f["words"] for f in report_file(out)[0]["faults"]]
    assert any("took the old one's" in w for w in words)
