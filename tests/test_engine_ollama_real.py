"""Ollama server logs captured from real servers (tests/fixtures/real-payloads/ollama/README.md), read through
OllamaClient from a log file beside a local fake /api/ps: the layer split each gives, by hand. Also the two
/api/ps behaviours real reports showed (size_vram left out when 0; mmap'd weights counted twice before
v0.30.11). No Ollama runs here."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from engines.stub_http import serve

from pcie_tui.engines import FindingFacts, ollama

REAL = Path(__file__).parent / "fixtures" / "real-payloads" / "ollama"


@pytest.fixture
def url():
    """A fake `ollama serve` answering /api/ps with no model loaded (these logs come without their /api/ps)."""
    with serve({"/api/ps": (200, b'{"models": []}')}) as served:
        yield served


@pytest.mark.parametrize(
    ("name", "gpu", "total", "line"),
    [
        # llama.cpp runner of early 2025 (journald prefix): 'llm_load_tensors: offloaded 37/49 layers to GPU'.
        ("issue8995-serve-2025-02-10.log", 37, 49, "offloaded 37/49 layers to GPU"),
        # Ollama's plan only, ollama engine runner (--ollama-engine --n-gpu-layers 49), wrapped as pasted.
        ("issue10823-serve-2025-05-22.log", 49, 63, "layers.offload=49 of layers.model=63 (Ollama's offload plan)"),
        # Ollama's plan only ("offload to cuda"), whole model on the GPU.
        ("issue7610-serve-2024-11-11.log", 27, 27, "layers.offload=27 of layers.model=27 (Ollama's offload plan)"),
    ],
)
def test_real_logs_give_the_layer_split(url, tmp_path, name, gpu, total, line):
    """Hand reading: #8995 offloaded 37 of 49 -> 12 layers' weights in host memory; #10823 planned 49 of 63
    (the runner started with --n-gpu-layers 49) -> 14; #7610 planned 27 of 27 -> none, so no host weights
    and no advice."""
    log = tmp_path / "serve.log"
    log.write_bytes((REAL / name).read_bytes())
    c = ollama.ENGINE.client(url, None, {}, str(log))
    s = c.read()
    assert s.up and (s.extra["gpu_layers"], s.extra["total_layers"]) == (gpu, total)
    fx = ollama.ENGINE.facts(c.describe())
    assert fx.fact("gpu_layers").value == f"{gpu}/{total}" and fx.fact("gpu_layers").source == f"log: '{line}'"
    assert fx.host_layers == total - gpu
    if gpu == total:
        assert fx.host_weights is None and ollama.ENGINE.advise(fx, FindingFacts(bound="link")) == []
    else:
        assert fx.host_weights == f"weights of {total - gpu} of {total} layers (log: '{line}')"


def test_the_runner_line_wins_over_the_plan_before_it():
    """One load as v0.5 logs it: Ollama's plan, then the runner's own line (real lines of #7610 and #8995,
    joined): the runner's 37/49 is read, not the plan's 27/27."""
    text = (REAL / "issue7610-serve-2024-11-11.log").read_bytes() + (
        REAL / "issue8995-serve-2025-02-10.log"
    ).read_bytes()
    assert ollama.offload_from_log(text) == {
        "gpu_layers": 37,
        "total_layers": 49,
        "line": "offloaded 37/49 layers to GPU",
    }
    assert ollama.offload_from_log(b"no offload here") is None


def test_ps_without_size_vram_is_all_on_the_cpu():
    """v0.1.38-v0.1.41 omitted size_vram when it was 0 (ollama#4840: "Should return 'size_vram': 0, denoting
    100% CPU"; api/types.go `size_vram,omitempty` until 4bf1da49, v0.1.42). No real body of that shape was
    found: this one is the nirmato#13 capture with its size_vram key removed. 0 of 5964735424 B in VRAM."""
    obj = json.loads((Path(__file__).parent / "fixtures" / "engines" / "ollama-ps-real-2025-08-07.json").read_text())
    del obj["models"][0]["size_vram"]
    (m,) = ollama.parse_ps(obj)
    assert (m["vram_bytes"], m["vram_frac"], m["host_bytes"]) == (0, 0.0, 5964735424)


@pytest.mark.parametrize(
    ("version", "caveat"),
    [("0.30.8", True), ("0.30.11", False), ("0.33.0-rc2", False), (None, True), ("0.6.0", True)],
)
def test_memory_not_in_vram_is_an_upper_bound_before_0_30_11(version, caveat):
    """ollama#16637 (fixed by #16709, first in v0.30.11): a partly offloaded model's size counted its mmap'd
    weights twice (26.7 GiB size for 13.4 GiB in VRAM). Before that version, or with no version, the fact
    says its figure is an upper bound."""
    m = {"name": "m", "size_bytes": 2 * 13 << 30, "vram_bytes": 13 << 30, "vram_frac": 0.5, "host_bytes": 13 << 30}
    f = ollama.memory_fact([m], version)
    assert f.value == "14.0 GB of m (50 %)"
    assert ("an upper bound" in f.source) is caveat and f.source.startswith("/api/ps size - size_vram")
