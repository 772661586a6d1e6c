"""vLLM processes: which are its API servers and workers, its parallel layout, its version."""

from __future__ import annotations

import os
from collections.abc import Sequence
from typing import Any

from pcie_tui.engines.argv import dist_version, flag_values, int_or, is_flag

FLAGS: dict[str, tuple[str, ...]] = {
    "tensor_parallel_size": ("--tensor-parallel-size", "-tp"),
    "pipeline_parallel_size": ("--pipeline-parallel-size", "-pp"),
    "data_parallel_size": ("--data-parallel-size", "-dp"),
    "model": ("--model",),
    "served_model_name": ("--served-model-name",),
    "host": ("--host",),
    "port": ("--port",),
}
CHILD_PREFIX = "VLLM::"  # process titles of its EngineCore and Worker processes


def classify(argv: Sequence[str], name: str = "") -> str | None:
    """ "root" (an API server: ``vllm serve``, ``-m vllm.entrypoints...``), "child" (a VLLM:: title), or None."""
    first = argv[0] if argv else ""
    if first.startswith(CHILD_PREFIX) or name.startswith(CHILD_PREFIX):
        return "child"
    for i, a in enumerate(argv[:3]):
        if os.path.basename(a) == "vllm" and i + 1 < len(argv) and argv[i + 1] == "serve":
            return "root"
    for i, a in enumerate(argv):
        if a in ("vllm.entrypoints.openai.api_server", "vllm.entrypoints.api_server") and i > 0 and argv[i - 1] == "-m":
            return "root"
        if a == "-m" and i + 2 < len(argv) and argv[i + 1] == "vllm.entrypoints.cli.main" and argv[i + 2] == "serve":
            return "root"
        if a.endswith(("vllm/entrypoints/openai/api_server.py", "vllm/entrypoints/api_server.py")):
            return "root"
    return None


def child_title(argv: Sequence[str], name: str) -> str | None:
    """The VLLM:: process title of an EngineCore/Worker child, else None."""
    t = argv[0] if argv and argv[0].startswith(CHILD_PREFIX) else name
    return t.strip() if t.startswith(CHILD_PREFIX) else None


def parse_layout(argv: Sequence[str]) -> dict[str, Any]:
    """tp/pp/dp sizes (1 where absent) plus model/host/port from a vLLM command line."""
    f = flag_values(argv, FLAGS)
    tp = int_or(f.get("tensor_parallel_size"), 1)
    pp = int_or(f.get("pipeline_parallel_size"), 1)
    dp = int_or(f.get("data_parallel_size"), 1)
    model = f.get("model")
    if model is None:  # `vllm serve MODEL ...`
        for i, a in enumerate(argv[:-1]):
            if a == "serve" and not is_flag(argv[i + 1]):
                model = argv[i + 1]
                break
    out: dict[str, Any] = {
        "tensor_parallel_size": tp,
        "pipeline_parallel_size": pp,
        "data_parallel_size": dp,
        "gpus_expected": tp * pp * dp if all(isinstance(x, int) for x in (tp, pp, dp)) else None,
        "explicit": sorted(
            k for k in ("tensor_parallel_size", "pipeline_parallel_size", "data_parallel_size") if k in f
        ),
        "model": model if isinstance(model, str) else None,
        "host": f.get("host") if isinstance(f.get("host"), str) else None,
        "port": int_or(f.get("port")),
    }
    return out


def version_from_venv(argv: Sequence[str]) -> str | None:
    """vLLM's version from the dist-info beside the interpreter that runs it (no import)."""
    return dist_version(argv, "vllm*.dist-info", r"vllm(?:[_-]cpu)?-([0-9][^-]*)\.dist-info")
