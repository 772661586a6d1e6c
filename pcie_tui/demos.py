"""Recorded sessions shipped with the package, replayed by ``pcie-tui demo``."""

from __future__ import annotations

from importlib import resources
from pathlib import Path

from pcie_tui.errors import UserError

DEFAULT_DEMO = "h200-llama-partial"

# name -> one-line description; files live in pcie_tui/data/<name>.jsonl.gz
DESCRIPTIONS = {
    "h200-reference": "H200, real collector at 10 Hz: idle, pinned H2D/D2H, D2D, bf16 matmul, half-duty link, pageable copies",
    "h200-llama-full": "H200, llama-server fully offloaded: load, long-prompt prefill, decode",
    "h200-llama-partial": "H200, llama-server with FFN weights of 12/16 layers in host memory: prefill link-bound (45 GB/s RX)",
    "h200-llama-ngl4": "H200, llama-server -ngl 4/16: prefill uploads at 7 GB/s, held back by CPU attention, not the link",
    "h200-probe": "H200 NVML probe before the collector existed: ~7 Hz, GPM windows under 100 ms (half void: shown n/a)",
}


def data_dir() -> Path:
    return Path(str(resources.files("pcie_tui") / "data"))


def available() -> dict[str, Path]:
    """Bundled demos that exist in this install, in a stable order."""
    found = {p.name.removesuffix(".jsonl.gz"): p for p in sorted(data_dir().glob("*.jsonl.gz"))}
    order = [n for n in DESCRIPTIONS if n in found] + [n for n in found if n not in DESCRIPTIONS]
    return {n: found[n] for n in order}


def resolve(name: str | None) -> Path:
    demos = available()
    if not demos:
        raise UserError("no bundled demo recordings in this install (pcie_tui/data is empty)")
    if name is None:
        name = DEFAULT_DEMO if DEFAULT_DEMO in demos else next(iter(demos))
    if name not in demos:
        raise UserError(f"no demo named {name!r}; choose one of: {', '.join(demos)}")
    return demos[name]


def recording_path(arg: str) -> tuple[Path, str | None]:
    """A recording argument: an existing file, else a bundled demo's name. Returns (path, demo name or None).

    A real path wins over a demo of the same spelling; neither is one line naming the demos.
    """
    path = Path(arg)
    if path.exists():
        return path, None
    demos = available()
    if arg in demos:
        return demos[arg], arg
    names = f" (nor a bundled demo: {', '.join(demos)})" if demos else ""
    raise UserError(f"no such recording: {arg}{names}")
