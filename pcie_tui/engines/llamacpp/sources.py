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
            "llama-server log, per finished request. TTFT as the client waits: its arrival (a request that "
            "waited for a slot: counted from the gauge llamacpp:requests_deferred at the scrape interval; one "
            "that found a slot free: when the log shows it was given one, less the server loop's turn it "
            "waited behind), slot setup ('selected slot' to 'processing task', where the host prompt cache "
            "is saved and loaded), the wait for batch room and the prefill ('prompt eval time'), from the "
            "log's timestamps. Prefill alone: 'prompt eval time'. A request whose start the log did not "
            "show has TTFT = prefill (a lower bound); p50/p95/p99 exact over the requests",
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
            "llama-server does not report it: arrival (as for TTFT) to the log's 'selected slot'; n/a "
            "without the log or without --metrics' deferred gauge (a wait then reads 0)",
            "s / ms",
            f"requests that ended in {win}",
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
            "llama-server's /metrics and /slots, as read here, carry no KV cache use, so the panel shows n/a (never 0)",
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
