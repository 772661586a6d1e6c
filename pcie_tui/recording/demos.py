"""Recorded sessions shipped with the package, replayed by ``pcie-tui demo``."""

from __future__ import annotations

from importlib import resources
from pathlib import Path

from pcie_tui.core.errors import UserError

DEFAULT_DEMO = "h200-pageable"

# name -> one-line description; files live in pcie_tui/data/<name>.jsonl.gz
DESCRIPTIONS = {
    "h200-pageable": "H200, llama-server --n-cpu-ffn 12, default mmap loading: prefill transfer-bound at 9 GB/s from pageable memory; fix -lm none",
    "h200-pinned": "H200, the same with -lm none: host weights pinned, prefill link-saturated (47-50 GB/s RX, median 50.1), 3.3-3.5 s per 6000-token prompt (2 prompts, 7.0 s in all) vs 19.2 s for the same prompt pageable (h200-pageable)",
    "h200-hostdecode": "H200, llama-server -ngl 4 of 16: decode host-bound (CPU layers), GPU idle, bus quiet",
    "h200-moe-pageable": "H200, MoE with --cpu-moe, mmap: expert uploads transfer-bound at 9 GB/s; fix -lm none",
    "h200-moe-pinned": "H200, MoE with --cpu-moe -lm none: expert uploads at 40-47 GB/s, near the link",
    "h200-nkvo": "H200, llama-server -nkvo: KV cache in host memory, attention on the CPU, prefill host-bound",
    "h200-ngl8": "H200, llama-server -ngl 8 of 16, pinned: prefill host-bound though weights stream at 7 GB/s",
    "h200-reference": "H200, real collector at 10 Hz: idle, pinned H2D/D2H, D2D, bf16 matmul, half-duty link, pageable copies",
    "h200-llama-full": "H200, llama-server fully offloaded: load, long-prompt prefill, decode",
    "h200-llama-partial": "H200, llama-server with FFN weights of 12/16 layers in host memory: prefill link-saturated (45 GB/s RX)",
    "h200-llama-ngl4": "H200, llama-server -ngl 4/16: prefill uploads at 7 GB/s, held back by CPU attention, not the link",
    "h200-prompt-cache": "H200, llama-server fully on the GPU, 6 sequential 9,600-token prompts, host prompt cache on (default): 1.8 s of each 2.3 s TTFT is the server's own housekeeping between requests",
    "h200-prompt-cache-off": "H200, the same with --cache-ram 0: no housekeeping, TTFT 0.53 s (prefill compute-bound)",
    "h200-mlock": "H200, llama-server -ngl 4 -lm mlock: host weights in pinned buffers (the log says so), 3 requests; decode host-bound (CPU layers); clients' TTFT beside",
    "h200-no-op-offload": "H200, llama-server -ngl 4 --no-op-offload: the CPU prefills its 13 layers, prefill host-bound 100 %; fix: drop --no-op-offload; clients' TTFT beside",
    "h200-fit": "H200, llama-server -ngl auto with a --fit-target that leaves the model too little VRAM: prefill transfer-bound at 8 GB/s; placement unknown at default verbosity (said so); clients' TTFT beside",
    "h100-np4c4": "H100 SXM, 4 slots, 4 concurrent clients, 8 prompts of 4,000 tokens, 13 of 16 layers pageable (-ngl 4): prefill transfer-bound at 8.7 GB/s, TTFT p50 13.9 s vs the clients' 15.4 s; fix -lm none",
    "h100-prompt-cache": "H100 SXM, llama-server fully on the GPU, 6 sequential 9,600-token prompts, host prompt cache on (default): 1.3 s of each 1.95 s TTFT is the server's own housekeeping; fix --cache-ram 0, priced at 0.59 s",
    "h100-prompt-cache-off": "H100 SXM, the same with --cache-ram 0: TTFT 0.60 s measured (prefill compute-bound)",
    "h100-heat": "H100 SXM (80GB HBM3, PCIe Gen5 x16 to the host), 150 s of back-to-back bf16 matmuls (no engine): clocks held by power capping (SW power cap, 697 of 700 W) from the first busy tick, SM clock 1,350 of 1,980 MHz, 670 TFLOP/s measured beside it",
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
        hint = _did_you_mean(name, demos)
        raise UserError(f"no demo named {name!r}{hint or '; choose one of: ' + ', '.join(demos)}")
    return demos[name]


def _did_you_mean(name: str, demos: dict[str, Path]) -> str:
    import difflib

    close = difflib.get_close_matches(name, list(demos), n=1, cutoff=0.8)
    return f"; did you mean {close[0]}?" if close else ""


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
    hint = _did_you_mean(arg, demos)
    if path.is_absolute() or len(path.parts) > 1 or path.suffix:
        raise UserError(f"no such recording: {arg}{hint}")  # a path, not a demo name: no list of demos
    names = f" (nor a bundled demo: {', '.join(demos)}){hint}" if demos else ""
    raise UserError(f"no such recording: {arg}{names}")
