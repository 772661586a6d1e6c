"""Where each vLLM figure of the engine panel comes from (the TUI's ``?`` page)."""

from __future__ import annotations

from pcie_tui.engines.base import SourceRow


def rows(win: str) -> list[SourceRow]:
    """One row per figure of the engine panel; ``win`` names the statistics window."""
    return [
        (
            "tokens prompt / generated",
            "vLLM /metrics counters vllm:prompt_tokens_total, vllm:generation_tokens_total: "
            "increase between the first and last tick of the window / its duration (a drop = engine restart)",
            "tokens/s",
            win,
        ),
        (
            "TTFT, ITL",
            "vLLM /metrics histograms vllm:time_to_first_token_seconds, vllm:inter_token_latency_seconds "
            "(older: vllm:time_per_output_token_seconds): bucket count increases over the window, "
            "p50/p95/p99 interpolated linearly within a bucket (as Prometheus histogram_quantile); TTFT as the "
            "client waits: + the mean API-server time per request outside vLLM's interval (http_request_duration_seconds "
            "of /v1/completions and /v1/chat/completions less vllm:e2e_request_latency_seconds, over the window)",
            "s / ms",
            win,
        ),
        (
            "prefill, decode, queue",
            "vLLM /metrics histograms vllm:request_prefill_time_seconds, vllm:request_decode_time_seconds, "
            "vllm:request_queue_time_seconds: same bucket deltas and interpolation",
            "s / ms",
            win,
        ),
        (
            "running, waiting",
            "vLLM /metrics gauges vllm:num_requests_running, vllm:num_requests_waiting",
            "requests",
            "latest tick",
        ),
        (
            "KV cache",
            "vLLM /metrics gauge vllm:kv_cache_usage_perc (older: vllm:gpu_cache_usage_perc), a fraction 0..1",
            "% of KV cache blocks in use",
            "latest tick",
        ),
        (
            "prefix hits",
            "vLLM /metrics counters vllm:prefix_cache_hits, vllm:prefix_cache_queries (older: vllm:gpu_prefix_cache_*): "
            "increase of hits over increase of queries, in prompt tokens; a hit's KV blocks were already on the GPU, "
            "so its prefill computes and moves nothing",
            "% of looked-up prompt tokens",
            win,
        ),
        (
            "KV offload",
            "vLLM /metrics counters vllm:kv_offload_load_bytes (host->device) + vllm:kv_offload_store_bytes "
            "(device->host) (older: vllm:kv_offload_total_bytes by transfer_type), only with KV offloading on: "
            "increase / the time between the readings; the report sets it beside NVML's PCIe RX + TX",
            "bytes/s",
            win,
        ),
    ]
