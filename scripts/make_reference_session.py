"""Record the bundled demo session on a real GPU (run ON the H200, needs torch).

Our own NvmlCollector samples at 10 Hz into a RecordingWriter while a traffic
thread runs labelled phases (bench/traffic.py). Each tick carries
``extra={"label": phase}``; the header's ``ground_truth`` holds each phase's rate
timed with CUDA syncs. The header is only complete once the traffic has run, so
ticks are kept in memory and written at the end.

usage: PYTHONPATH=. python3 scripts/make_reference_session.py [OUT.jsonl.gz] [seconds_per_phase]
"""

from __future__ import annotations

import socket
import sys
from datetime import datetime, timezone
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.traffic import PHASES, Traffic, sample_phases  # noqa: E402
from pcie_tui import __version__  # noqa: E402
from pcie_tui.core.model import Sample, SessionHeader  # noqa: E402
from pcie_tui.recording.writer import RecordingWriter  # noqa: E402
from pcie_tui.sources.nvml import NvmlCollector  # noqa: E402

DEFAULT_OUT = "pcie_tui/data/h200-reference.jsonl.gz"
INTERVAL_S = 0.1


def main(out: str = DEFAULT_OUT, seconds: float = 7.0) -> int:
    collector = NvmlCollector(indices=[0])
    try:
        traffic = Traffic(0)
        infos = collector.gpu_infos()
        pids = collector.running_pids()
        phases = [p for p, _ in PHASES]
        ticks, truth = sample_phases(collector.read, traffic, phases, seconds, INTERVAL_S)
    finally:
        collector.close()
    ground_truth = {
        ph: {k: (round(v, 4) if isinstance(v, float) else v) for k, v in r.items()} for ph, r in truth.items()
    }
    header = SessionHeader(
        created=datetime.fromtimestamp(ticks[0][0], timezone.utc).isoformat(),
        host=socket.gethostname(),
        tool_version=__version__,
        gpus=infos,
        interval_s=INTERVAL_S,
        extra={
            "source": "scripts/make_reference_session.py on the project's H200: NvmlCollector at 10 Hz "
            "while bench/traffic.py ran the labelled phases",
            "phases": [{"label": p, "expect": e} for p, e in PHASES],
            "ground_truth": ground_truth,
            "ground_truth_units": "GBps = payload 1e9 B/s timed with CUDA syncs (d2d counts read+write); TFLOPs bf16",
            "gpu_pids_at_start": {str(k): v for k, v in pids.items()},
        },
    )
    Path(out).parent.mkdir(parents=True, exist_ok=True)
    with RecordingWriter(out, header) as w:
        for t, label, gpus in ticks:
            w.write(Sample(t=t, gpus=gpus, extra={"label": label}))
    print(f"wrote {len(ticks)} ticks to {out} ({Path(out).stat().st_size} bytes)")
    for ph, r in ground_truth.items():
        print(f"  {ph:14s} {r}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main(*(sys.argv[1:2] or [DEFAULT_OUT]), *(float(a) for a in sys.argv[2:3])))
