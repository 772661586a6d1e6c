"""Faults that end nothing silently (issue 25): a recording whose disk fills or whose file is removed mid-run
stops with one line that says why and how much was kept, exit 4 (documented), and the file reads up to the
fault. `pcie-tui record --headless` runs as a real process on the H200 stand-in NVML (tests/fakenvml)."""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

from pcie_tui.recording.reader import read_recording

REPO = Path(__file__).resolve().parents[1]
RUNNER = """
import resource, signal, sys
sys.path.insert(0, "tests")
limit = int(sys.argv.pop(1))
if limit:  # the file system fills at this size: writes past it fail (EFBIG), as a full disk's would (ENOSPC)
    signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
    resource.setrlimit(resource.RLIMIT_FSIZE, (limit, limit))
import fakenvml
sys.modules["pynvml"] = fakenvml.FakeNvml(fakenvml.load_capture())
from pcie_tui.cli.main import main
sys.exit(main(sys.argv[1:]))
"""


def _record(out: Path, limit: int = 0, seconds: float = 4.0) -> subprocess.Popen[str]:
    args = ["record", "--headless", "--no-engine", "--interval", "0.1", "--duration", str(seconds), "--out", str(out)]
    return subprocess.Popen(
        [sys.executable, "-c", RUNNER, str(limit), *args], cwd=REPO, stderr=subprocess.PIPE, text=True
    )


def _wait_for_ticks(out: Path) -> None:
    """Until the recording holds a few ticks (20 s at most)."""
    deadline = time.monotonic() + 20
    while (not out.exists() or out.stat().st_size < 2000) and time.monotonic() < deadline:
        time.sleep(0.1)


def test_a_full_disk_stops_the_recording_and_keeps_what_was_written(tmp_path):
    out = tmp_path / "full.jsonl"
    p = _record(out, limit=8_000)
    _, err = p.communicate(timeout=60)
    assert p.returncode == 4, err
    line = err.strip().splitlines()[-1]
    assert line.startswith("pcie-tui: error: recording stopped: file too large (") and "are kept)" in line
    assert "Traceback" not in err and "a bug" not in err
    rec = read_recording(out, warn=False)
    assert len(rec.samples) >= 5 and out.stat().st_size <= 8_000


def test_a_file_removed_mid_run_is_said_not_lost_silently(tmp_path):
    out = tmp_path / "gone.jsonl"
    p = _record(out, seconds=8.0)
    _wait_for_ticks(out)
    out.unlink()
    _, err = p.communicate(timeout=60)
    assert p.returncode == 4, err
    assert "was removed or replaced while recording" in err.strip().splitlines()[-1]


def test_a_device_that_takes_nothing(tmp_path):
    p = subprocess.run(
        [sys.executable, "-c", RUNNER, "0", "record", "--headless", "--no-engine", "--duration", "1", "--out", "/dev/full"],
        cwd=REPO, capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert p.returncode == 4
    assert p.stderr.strip().splitlines()[-1].startswith("pcie-tui: error: recording stopped: no space left on device")


def test_sighup_and_the_duration_end_it_cleanly_with_a_last_line(tmp_path):
    import json
    import signal

    out = tmp_path / "hup.jsonl"
    p = _record(out, seconds=30.0)
    _wait_for_ticks(out)
    p.send_signal(signal.SIGHUP)
    _, err = p.communicate(timeout=60)
    assert p.returncode == 0 and "(ended by SIGHUP)" in err, err
    last = json.loads(out.read_text().splitlines()[-1])
    assert last["event"] == "recording_ended" and last["reason"] == "SIGHUP" and last["ticks"] >= 1
    out2 = tmp_path / "dur.jsonl"
    p = _record(out2, seconds=1.0)
    _, err = p.communicate(timeout=60)
    assert p.returncode == 0 and json.loads(out2.read_text().splitlines()[-1])["reason"] == "--duration 1 s"
    assert len(read_recording(out2, warn=False).samples) >= 3
