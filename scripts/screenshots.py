"""Regenerate the README screenshots from a replay, at a moment where LINK SATURATED shows.

The moment is found by running the analyzer over the recording (the middle of
the first link saturation), not picked by hand.
Writes screenshots/demo.svg (140x45) and screenshots/demo-80x24.svg.

usage: python scripts/screenshots.py [RECORDING] [OUT_DIR]
"""

from __future__ import annotations

import sys
from pathlib import Path

from pcie_tui.record.reader import read_recording
from pcie_tui.record.replay import ReplaySource
from pcie_tui.tui.app import make_app
from pcie_tui.tui.headless import frame_at, run, saturated_moment, wait_until

REPO = Path(__file__).resolve().parents[1]
RECORDINGS = (REPO / "pcie_tui/data/h200-reference.jsonl.gz", REPO / "tests/fixtures/h200-probe.jsonl")
SHOTS = (("demo.svg", (140, 45)), ("demo-80x24.svg", (80, 24)))


async def shoot(recording: Path, out: Path, size: tuple[int, int]) -> int:
    rec = read_recording(recording)
    pos = saturated_moment(rec, "link", "")
    src = ReplaySource(rec)
    src.seek_to_index(pos)
    src.set_paused(True)
    app = make_app(src)
    async with app.run_test(size=size) as pilot:
        await wait_until(pilot, lambda: frame_at(app, pos), 20)
        await pilot.pause()
        badge = str(app.query_one("#gpu-0").badge.render())
        if "LINK SATURATED" not in badge:
            raise SystemExit(f"no LINK SATURATED badge at tick {pos} of {recording}: {badge!r}")
        app.save_screenshot(out.name, str(out.parent))
    return pos


def main(argv: list[str]) -> int:
    recording = Path(argv[1]) if len(argv) > 1 else next(p for p in RECORDINGS if p.exists())
    out_dir = Path(argv[2]) if len(argv) > 2 else REPO / "screenshots"
    out_dir.mkdir(parents=True, exist_ok=True)
    for name, size in SHOTS:
        pos = run(shoot(recording, out_dir / name, size))
        print(f"{out_dir / name}: {size[0]}x{size[1]}, {recording.name} at tick {pos}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv))
