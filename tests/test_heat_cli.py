"""`pcie-tui record --headless` as a real process on the stand-in NVML whose link starts replaying packets
(fault injection: the count is chosen): the recording carries the replay counter about once a second,
and `report` (text and --json) names the rise with its count, rate and what to check."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from pcie_tui.recording.reader import read_recording

REPO = Path(__file__).resolve().parents[1]
RUNNER = """
import sys
sys.path.insert(0, "tests")
import fakenvml
sys.modules["pynvml"] = fakenvml.FakeNvml(fakenvml.load_capture(), replay_fault=(1.5, 200.0))
from pcie_tui.cli.main import main
sys.exit(main(sys.argv[1:]))
"""


def test_a_link_that_starts_replaying_is_an_event_in_the_report(tmp_path):
    out = tmp_path / "replays.jsonl"
    args = ["record", "--headless", "--no-engine", "--interval", "0.1", "--duration", "5", "--out", str(out)]
    p = subprocess.run([sys.executable, "-c", RUNNER, *args], cwd=REPO, capture_output=True, text=True, timeout=120)
    assert p.returncode == 0, p.stderr
    rec = read_recording(out, warn=False)
    reads = [s.gpus[0].pcie_replays for s in rec.samples if s.gpus[0].pcie_replays is not None]
    assert 4 <= len(reads) <= 7 and reads[0] == 0 and reads[-1] > 300  # about once a second, rising
    assert all(s.gpus[0].temp_C is None for s in rec.samples)  # the H200 capture read no heat: absent, never 0
    rep = subprocess.run(
        [sys.executable, "-m", "pcie_tui", "report", str(out)], cwd=REPO, capture_output=True, text=True, timeout=120
    )
    assert rep.returncode == 0, rep.stderr
    text = " ".join(rep.stdout.split())
    assert "Link health" in text and "Heat and clocks" not in text
    assert " PCIe replays (" in text and "/s): check the riser or the slot" in text
    js = subprocess.run(
        [sys.executable, "-m", "pcie_tui", "report", str(out), "--json"],
        cwd=REPO, capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    doc = json.loads(js.stdout)
    [ev] = doc["link_health"]["events"]
    assert ev["kind"] == "pcie_replays" and ev["count"] == reads[-1] - reads[0]
    assert 100 <= ev["rate_per_s"] <= 260 and doc["heat"] is None
