"""The text report fits the terminal it is printed on; piped, it keeps long lines (no 80-column wrap)."""

from __future__ import annotations

import io
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
from rich.cells import cell_len
from rich.console import Console

from pcie_tui.recording import demos
from pcie_tui.recording.reader import read_recording
from pcie_tui.report.text import build_report, render_text

REPO = Path(__file__).parent.parent
RECORDINGS = {**demos.available(), "probe": REPO / "tests" / "fixtures" / "h200-probe.jsonl"}


def rendered(path: Path, width: int) -> list[str]:
    rec = read_recording(path, warn=False)
    report, _ = build_report(rec)
    console = Console(width=width, file=io.StringIO(), force_terminal=True, color_system=None)
    render_text(report, rec, console)
    return console.file.getvalue().splitlines()  # type: ignore[attr-defined]


@pytest.mark.parametrize("width", [80, 120])
@pytest.mark.parametrize("name", sorted(RECORDINGS))
def test_no_line_exceeds_the_width(name, width):
    lines = rendered(RECORDINGS[name], width)
    assert len(lines) > 20
    too_long = [ln for ln in lines if cell_len(ln) > width]
    assert not too_long, too_long[:3]


def test_wrapped_lines_keep_their_indent():
    """A per-phase finding too long for 80 columns continues indented, not at column 0."""
    lines = rendered(RECORDINGS["h200-llama-partial"], 80)
    start = lines.index("What held each phase back")
    block = lines[start + 1 : lines.index("", start)]
    prefill = next(i for i, ln in enumerate(block) if ln.startswith("  prefill 5.5 s: link-saturated"))
    assert block[prefill + 1].startswith("      ") and not block[prefill + 1].startswith("      cause:")
    assert all(ln.startswith("  ") for ln in block)
    wide = rendered(RECORDINGS["h200-llama-partial"], 240)
    one = [ln for ln in wide if ln.startswith("  prefill 5.5 s: link-saturated")]
    assert len(one) == 1 and one[0].rstrip().endswith("Gen5 x16)")  # at 240 columns the same line is whole


@pytest.mark.skipif(not hasattr(os, "openpty"), reason="needs a pty")
@pytest.mark.parametrize("cols", [72, 100])
def test_cli_on_a_terminal_follows_its_width(cols):
    import fcntl
    import struct
    import termios

    master, slave = os.openpty()
    fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", 50, cols, 0, 0))
    env = {k: v for k, v in os.environ.items() if k not in ("COLUMNS", "LINES")}
    env["TERM"] = "xterm-256color"
    p = subprocess.Popen(
        [sys.executable, "-m", "pcie_tui", "report", "h200-llama-partial"],
        stdout=slave,
        stderr=subprocess.PIPE,
        cwd=REPO,
        env=env,
    )
    os.close(slave)
    chunks = []
    while True:
        try:
            b = os.read(master, 65536)
        except OSError:  # EIO: the child closed the terminal
            break
        if not b:
            break
        chunks.append(b)
    os.close(master)
    assert p.wait(120) == 0, p.stderr.read() if p.stderr else ""
    text = re.sub(r"\x1b\[[0-9;?]*[A-Za-z]|\x1b\][^\x07]*\x07", "", b"".join(chunks).decode())
    lines = text.replace("\r\n", "\n").splitlines()
    assert any("What held each phase back" in ln for ln in lines)
    assert max(cell_len(ln) for ln in lines) <= cols
    assert max(cell_len(ln) for ln in lines) >= cols - 10  # it used the width it had


@pytest.mark.parametrize(("columns", "fits"), [("80", 80), ("200", 200), (None, 160), ("junk", 160)])
def test_piped_report_follows_columns_when_set(columns, fits):
    env = {k: v for k, v in os.environ.items() if k not in ("COLUMNS", "LINES")}
    if columns is not None:
        env["COLUMNS"] = columns
    out = subprocess.run(
        [sys.executable, "-m", "pcie_tui", "report", "h200-pageable"],
        capture_output=True,
        text=True,
        cwd=REPO,
        env=env,
        timeout=120,
        check=True,
    ).stdout.splitlines()
    widest = max(cell_len(ln) for ln in out)
    assert widest <= fits and (widest > 80 or fits == 80), (columns, widest)
