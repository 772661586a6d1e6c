"""Where each llama-server figure of the engine panel comes from (the TUI's ``?`` page)."""

from __future__ import annotations

from pcie_tui.engines.base import SourceRow


def rows(win: str) -> list[SourceRow]:
    """One row per figure of the engine panel; ``win`` names the statistics window."""
    return [
        (
            "tokens prompt / generated",
            "llama-server: the larger of two lower bounds over the window: per slot prompt tokens processed "
            "and tokens decoded from /slots, increases summed (misses requests that start and end between two "
            "polls), and the /metrics counters llamacpp:prompt_tokens_total, llamacpp:tokens_predicted_total "
            "(move only when a prompt or request ends); 'token rates now' on this page says which",
            "tokens/s",
            win,
        ),
        (
            "TTFT, prefill",
            "llama-server log, per finished request: 'prompt eval time' (server side; queue and HTTP "
            "excluded, so a lower bound of what a client sees); p50/p95/p99 exact over the requests",
            "s / ms",
            f"requests that ended in {win}",
        ),
        (
            "ITL, decode",
            "llama-server log, per finished request: 'eval time' (decode); ITL = eval time / (tokens - 1), "
            "the mean gap of each request",
            "s / ms",
            f"requests that ended in {win}",
        ),
        (
            "queue",
            "not reported by llama-server (shown as n/a)",
            "s / ms",
            "-",
        ),
        (
            "running, waiting",
            "running: /slots entries with is_processing (read just after /metrics; the same count as its "
            "gauge llamacpp:requests_processing, which stands in when /slots is off); "
            "waiting: /metrics gauge llamacpp:requests_deferred (n/a without --metrics)",
            "requests",
            "latest tick",
        ),
        (
            "KV cache",
            "not collected from llama-server (shown as n/a)",
            "% of KV cache in use",
            "latest tick",
        ),
        (
            "in host memory",
            HOST_MEMORY_SOURCE,
            "layers; pinned or pageable",
            "the model's load",
        ),
    ]


# What says where the weights went: the log before the flags (pcie_tui.engines.llamacpp.runtime).
HOST_MEMORY_SOURCE = (
    "llama-server's load log first ('CUDA_Host model buffer size' = pinned, 'CPU_Mapped' / 'CPU' = "
    "pageable; 'offloaded N/M layers to GPU'; '(load_mode = X)'; the loader's mmap warning), else its "
    "flags (-ngl, -lm, --no-host, --n-cpu-moe, -ot) and LLAMA_ARG_* / GGML_CUDA_NO_PINNED from "
    "/proc/PID/environ; each fact names its source, and one not read is unknown "
    "(report --json: engine_facts.runtime)"
)
