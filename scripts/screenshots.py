"""Regenerate the README screenshots from a replay, at a moment where LINK SATURATED shows.

The default recording is the llama-server session on the H200
(pcie_tui/data/h200-llama-partial.jsonl.gz): the moment is the tick of the
first link saturation during the engine's prefill with the highest reading, found by running the
analyzer over the recording, not picked by hand; the engine panel shows the
engine's figures at that tick.
Writes screenshots/demo.svg (140x45), screenshots/demo-80x24.svg,
screenshots/demo-170x45.svg (wide: GPU and engine panels side by side) and screenshots/demo-200x50.svg
(link, DRAM and tokens/s on one time axis); with the default recording also the same moment scaled to
8 GPUs (pcie_tui.tui.headless.scaled_gpus) at 160x45, one line per GPU.

usage: python scripts/screenshots.py [RECORDING [PHASE [OUT_DIR]]]
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

from pcie_tui.recording.reader import read_recording
from pcie_tui.tui.headless import frame_at, paused_app, run, saturated_moment, scaled_gpus, wait_until

REPO = Path(__file__).resolve().parents[1]
# (recording, the phase the saturation must fall in), first found is used
RECORDINGS = (
    (REPO / "pcie_tui/data/h200-pinned.jsonl.gz", "prefill"),
    (REPO / "pcie_tui/data/h200-llama-partial.jsonl.gz", "prefill"),
    (REPO / "pcie_tui/data/h200-reference.jsonl.gz", ""),
    (REPO / "tests/fixtures/h200-probe.jsonl", ""),
)
SHOTS = (
    ("demo.svg", (140, 45)),
    ("demo-80x24.svg", (80, 24)),
    ("demo-170x45.svg", (170, 45)),
    ("demo-200x50.svg", (200, 50)),
)
EIGHT_GPUS = ("eight-gpus-160x45.svg", (160, 45))
# The answer where nothing saturates: the pageable session mid-prefill (transfer-bound at 9 GB/s).
ANSWER = (REPO / "pcie_tui/data/h200-pageable.jsonl.gz", "prefill", "answer-pageable-170x45.svg", (170, 45))
# The client's wait explained: the prompt-cache session in its last housekeeping stretch (issue 24).
HOUSEKEEPING = (REPO / "pcie_tui/data/h200-prompt-cache.jsonl.gz", "housekeeping", "prompt-cache-170x45.svg", (170, 45))


async def _paused_at(rec: Any, pos: int, out: Path, size: tuple[int, int], check: Any = None) -> int:
    """The replay of ``rec`` paused at tick ``pos``, its screen at ``size`` saved to ``out`` once that tick's
    frame is drawn (``check(app)`` first, where given)."""
    app = paused_app(rec, pos)
    async with app.run_test(size=size) as pilot:
        await wait_until(pilot, lambda: frame_at(app, pos), 20)
        await pilot.pause()
        if check is not None:
            check(app)
        app.save_screenshot(out.name, str(out.parent))
    return pos


async def shoot(recording: Path, phase: str, out: Path, size: tuple[int, int]) -> int:
    rec = read_recording(recording)
    pos = saturated_moment(rec, "link", phase, peak=True)

    def saturated(app: Any) -> None:
        badge = str(app.query_one("#gpu-0").badge.render())
        if "LINK SATURATED" not in badge:
            raise SystemExit(f"no LINK SATURATED badge at tick {pos} of {recording}: {badge!r}")

    return await _paused_at(rec, pos, out, size, saturated)


async def shoot_scaled(recording: Path, phase: str, out: Path, size: tuple[int, int], n_gpus: int) -> int:
    """The moment :func:`shoot` takes, on ``recording`` scaled to ``n_gpus`` GPUs."""
    rec = read_recording(recording)
    pos = saturated_moment(rec, "link", phase, peak=True)
    return await _paused_at(scaled_gpus(rec, n_gpus), pos, out, size)


async def shoot_mid_phase(recording: Path, phase: str, out: Path, size: tuple[int, int], last: bool = False) -> int:
    """The tick in the middle of the recording's ticks of ``phase`` (``last``: of its last run of them)."""
    rec = read_recording(recording)
    idx = [i for i, s in enumerate(rec.samples) if s.engine is not None and s.engine.phase == phase]
    if not idx:
        raise SystemExit(f"no {phase} in {recording}")
    if last:
        start = max(k for k in range(len(idx)) if k == 0 or idx[k] != idx[k - 1] + 1)
        idx = idx[start:]
    return await _paused_at(rec, idx[len(idx) // 2] + 1, out, size)


def main(argv: list[str]) -> int:
    if len(argv) > 1:
        recording, phase = Path(argv[1]), (argv[2] if len(argv) > 2 else "")
    else:
        recording, phase = next((p, ph) for p, ph in RECORDINGS if p.exists())
    out_dir = Path(argv[3]) if len(argv) > 3 else REPO / "screenshots"
    out_dir.mkdir(parents=True, exist_ok=True)
    for name, size in SHOTS:
        pos = run(shoot(recording, phase, out_dir / name, size))
        print(f"{out_dir / name}: {size[0]}x{size[1]}, {recording.name} at tick {pos} (phase {phase or 'any'})")
    if len(argv) <= 1:
        name, size = EIGHT_GPUS
        pos = run(shoot_scaled(recording, phase, out_dir / name, size, 8))
        print(f"{out_dir / name}: {size[0]}x{size[1]}, {recording.name} scaled to 8 GPUs at tick {pos}")
        rec, ph, name, size = ANSWER
        pos = run(shoot_mid_phase(rec, ph, out_dir / name, size))
        print(f"{out_dir / name}: {size[0]}x{size[1]}, {rec.name} at tick {pos} (middle of {ph})")
        rec, ph, name, size = HOUSEKEEPING
        pos = run(shoot_mid_phase(rec, ph, out_dir / name, size, last=True))
        print(f"{out_dir / name}: {size[0]}x{size[1]}, {rec.name} at tick {pos} (middle of its last {ph})")
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv))
