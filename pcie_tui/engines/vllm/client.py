"""vLLM client: scrapes ``/metrics`` (Prometheus text) into EngineSamples.

Parsing goes through prometheus-client's parser. Metric names of vLLM 0.32
and the older ones (``time_per_output_token``, ``gpu_cache_usage_perc``) are
both accepted. Histograms are kept as cumulative buckets in
``extra["hist"]`` so recordings can recompute quantiles later. Nothing here
reads or records prompt or completion text.
"""

from __future__ import annotations

import json
import re
import time
from pathlib import Path
from typing import Any

from prometheus_client.parser import text_string_to_metric_families

from pcie_tui.core.model import EngineSample
from pcie_tui.engines.http import SCRAPE_TIMEOUT_S, failure_reason, http_get, normalize_url

# Our name -> vLLM sample names, newest first.
COUNTERS = {
    "prompt_tokens_total": ("vllm:prompt_tokens_total",),
    "generation_tokens_total": ("vllm:generation_tokens_total",),
    "requests_finished_total": ("vllm:request_success_total",),
    "preemptions_total": ("vllm:num_preemptions_total",),
    # Prompt tokens looked up in / found in the GPU's prefix cache (vLLM < 0.10: gpu_prefix_cache_*).
    # A hit is a prompt token whose KV blocks were already on the GPU: nothing is computed or moved.
    "prefix_cache_queries_total": ("vllm:prefix_cache_queries_total", "vllm:gpu_prefix_cache_queries_total"),
    "prefix_cache_hits_total": ("vllm:prefix_cache_hits_total", "vllm:gpu_prefix_cache_hits_total"),
    # Hits a KV connector supplied (host memory, disk, another instance): those blocks are loaded.
    "external_prefix_cache_queries_total": ("vllm:external_prefix_cache_queries_total",),
    "external_prefix_cache_hits_total": ("vllm:external_prefix_cache_hits_total",),
    # KV offloading (OffloadingConnector, distributed/kv_transfer/kv_connector/v1/offloading/metrics.py):
    # bytes loaded from the offload medium to the GPU (host->device) and stored from the GPU to it.
    "kv_offload_h2d_bytes_total": ("vllm:kv_offload_load_bytes_total",),
    "kv_offload_d2h_bytes_total": ("vllm:kv_offload_store_bytes_total",),
    # ... and the seconds its copies took each way (``vllm:kv_offload_load_time`` / ``_store_time``: "Total
    # load time from offload storage to GPU, in seconds"): the engine's own rate is bytes over these seconds.
    "kv_offload_h2d_seconds_total": ("vllm:kv_offload_load_time_total",),
    "kv_offload_d2h_seconds_total": ("vllm:kv_offload_store_time_total",),
}
# Counters read per label value (our name -> sample name, label, value): the deprecated KV offload
# byte counter of the same connector, kept beside the flat ones above during vLLM's migration.
LABELLED = {
    "kv_offload_h2d_bytes_total": ("vllm:kv_offload_total_bytes_total", "transfer_type", "CPU_to_GPU"),
    "kv_offload_d2h_bytes_total": ("vllm:kv_offload_total_bytes_total", "transfer_type", "GPU_to_CPU"),
    "kv_offload_h2d_seconds_total": ("vllm:kv_offload_total_time_total", "transfer_type", "CPU_to_GPU"),
    "kv_offload_d2h_seconds_total": ("vllm:kv_offload_total_time_total", "transfer_type", "GPU_to_CPU"),
    # Waiting requests held back by the engine's own transfers or limits, not by capacity: vLLM >= 0.11's
    # ``vllm:num_requests_waiting_by_reason{reason="deferred"}`` ("deferred by transient constraints (LoRA
    # budget, KV transfer, blocked status)"; vllm/v1/metrics/loggers.py of 0.32). A gauge, read per scrape.
    "requests_waiting_deferred": ("vllm:num_requests_waiting_by_reason", "reason", "deferred"),
}
# Counters copied into EngineSample.extra as they are (cumulative; the analysis takes differences).
EXTRA_COUNTERS = (
    "requests_finished_total",
    "preemptions_total",
    "prefix_cache_queries_total",
    "prefix_cache_hits_total",
    "external_prefix_cache_queries_total",
    "external_prefix_cache_hits_total",
    "kv_offload_h2d_bytes_total",
    "kv_offload_d2h_bytes_total",
    "kv_offload_h2d_seconds_total",
    "kv_offload_d2h_seconds_total",
    "http_seconds_total",
    "http_requests_total",
)
# The engine's own work between requests, by the counter that shows it (our name -> ``own_work`` word).
TOKENS = ("prompt_tokens_total", "generation_tokens_total")
OWN_WORK = {
    "preemptions_total": "preemption",
    "kv_offload_h2d_bytes_total": "kv_offload_load",
    "kv_offload_d2h_bytes_total": "kv_offload_store",
}
# The API server's own timing of each generation request, HTTP in to the last byte out
# (prometheus-fastapi-instrumentator's ``http_request_duration_seconds``, which vLLM exposes): its mean
# less the mean of ``vllm:e2e_request_latency_seconds`` (arrival to finish) is the time a client waits that
# vLLM's TTFT leaves out (the HTTP parse and render before arrival, the stream out after).
HTTP_DURATION = "http_request_duration_seconds"
GENERATION_HANDLERS = frozenset({"/v1/completions", "/v1/chat/completions"})
GAUGES = {
    "requests_running": ("vllm:num_requests_running",),
    "requests_waiting": ("vllm:num_requests_waiting",),
    # A fraction 0..1 despite "perc" in the name (vLLM's help text: 1 means 100 percent).
    "kv_cache_util": ("vllm:kv_cache_usage_perc", "vllm:gpu_cache_usage_perc", "vllm:cpu_cache_usage_perc"),
    "requests_waiting_deferred": (),  # LABELLED only
}
HISTOGRAMS = {
    "ttft_s": ("vllm:time_to_first_token_seconds",),
    "itl_s": ("vllm:inter_token_latency_seconds", "vllm:time_per_output_token_seconds"),
    "prefill_s": ("vllm:request_prefill_time_seconds",),
    "decode_s": ("vllm:request_decode_time_seconds",),
    "queue_s": ("vllm:request_queue_time_seconds",),
    "e2e_s": ("vllm:e2e_request_latency_seconds",),
    # Times each finished request was preempted (its count and sum: preemptions per request); the buckets
    # (1, 2, 3, 4, 5, 10, 20) hold never- and once-preempted requests together (vllm/v1/metrics/buckets.py).
    "preemptions_n": ("vllm:request_num_preemptions",),
}

_VERSION_RES = (
    re.compile(r"Initializing a V\d LLM engine \(v([^)\s]+)\)"),
    re.compile(r"vLLM API server version ([0-9][^\s,]*)"),
)


def _wanted_samples() -> frozenset[str]:
    names: set[str] = set()
    for group in (COUNTERS, GAUGES):
        for alts in group.values():
            names.update(alts)
    for alts in HISTOGRAMS.values():
        for n in alts:
            names.update((n + "_bucket", n + "_count", n + "_sum"))
    names.update(name for name, _, _ in LABELLED.values())
    names.update((HTTP_DURATION + "_count", HTTP_DURATION + "_sum"))
    return frozenset(names)


_WANTED = _wanted_samples()
_WANTED_FAMILIES = (
    frozenset(n.removesuffix("_total") for n in _WANTED)
    | {n for alts in HISTOGRAMS.values() for n in alts}
    | {HTTP_DURATION}
)


def select_lines(text: str) -> str:
    """Only the exposition lines of the metrics we read (vLLM exposes ~600 lines; we need ~150).

    A cheap pre-selection by metric name, so prometheus-client's parser (pure
    Python, ~30 ms for the whole text) holds the GIL for a quarter of that.
    """
    keep = []
    for line in text.splitlines():
        if line.startswith("#"):
            parts = line.split(None, 3)
            if len(parts) >= 3 and parts[1] in ("HELP", "TYPE") and parts[2] not in _WANTED_FAMILIES:
                continue
        else:
            end = len(line)
            for ch in "{ ":
                i = line.find(ch)
                if 0 <= i < end:
                    end = i
            if line[:end] not in _WANTED:
                continue
        keep.append(line)
    return "\n".join(keep) + "\n"


def _add_http(s: Any, http: dict[str, float]) -> None:
    """Sum one ``http_request_duration_seconds`` sample of a generation request into ``http``."""
    suffix = s.name[len(HTTP_DURATION) :]
    if (
        suffix in ("_sum", "_count")
        and s.labels.get("handler") in GENERATION_HANDLERS
        and s.labels.get("method") == "POST"
    ):
        http[suffix] = http.get(suffix, 0.0) + float(s.value)


def parse_vllm_metrics(text: str) -> dict[str, Any]:
    """Prometheus text -> {counters, gauges, hist}; sums over label sets (engines, finish reasons).

    Raises ValueError when the text is not Prometheus exposition or holds no vLLM metric.
    """
    sums: dict[str, float] = {}
    buckets: dict[str, dict[float, float]] = {}
    labelled: dict[str, float] = {}
    by_label = {(n, lab, v): key for key, (n, lab, v) in LABELLED.items()}
    http: dict[str, float] = {}
    for fam in text_string_to_metric_families(select_lines(text)):
        for s in fam.samples:
            if s.name.startswith(HTTP_DURATION):
                _add_http(s, http)
                continue
            if not s.name.startswith("vllm:"):
                continue
            lkey = next((k for (n, lab, v), k in by_label.items() if n == s.name and s.labels.get(lab) == v), None)
            if lkey is not None:
                labelled[lkey] = labelled.get(lkey, 0.0) + float(s.value)
            elif s.name.endswith("_bucket") and "le" in s.labels:
                le = float(s.labels["le"])
                b = buckets.setdefault(s.name[: -len("_bucket")], {})
                b[le] = b.get(le, 0.0) + float(s.value)
            else:
                sums[s.name] = sums.get(s.name, 0.0) + float(s.value)
    if not sums and not buckets:
        raise ValueError("no vllm: metrics in the response")

    def first(names: tuple[str, ...], key: str) -> float | None:
        for n in names:
            if n in sums:
                return sums[n]
        return labelled.get(key)

    hist: dict[str, dict[str, Any]] = {}
    for key, names in HISTOGRAMS.items():
        for n in names:
            hb = buckets.get(n)
            if not hb:
                continue
            b = hb
            les = sorted(b)
            finite = [le for le in les if le != float("inf")]
            count = sums.get(n + "_count", b.get(float("inf"), max(b.values())))
            hist[key] = {
                "le": finite,
                "cum": [b[le] for le in finite],
                "count": count,
                "sum": sums.get(n + "_sum"),
            }
            break
    counters = {k: first(v, k) for k, v in COUNTERS.items()}
    if "_sum" in http and "_count" in http:
        counters["http_seconds_total"], counters["http_requests_total"] = http["_sum"], http["_count"]
    return {
        "counters": counters,
        "gauges": {k: first(v, k) for k, v in GAUGES.items()},
        "hist": hist,
    }


def version_from_log(path: str | Path, max_bytes: int = 1 << 20) -> str | None:
    """vLLM version from its startup log line, reading at most the first ``max_bytes``."""
    try:
        with open(path, "rb") as f:
            head = f.read(max_bytes).decode("utf-8", "replace")
    except OSError:
        return None
    for rx in _VERSION_RES:
        m = rx.search(head)
        if m:
            return m.group(1)
    return None


def _stdout_log(pid: int | None) -> str | None:
    """The file the process writes its stdout/stderr to, when that is a regular file."""
    if pid is None:
        return None
    for fd in (2, 1):
        try:
            target = Path(f"/proc/{pid}/fd/{fd}").resolve(strict=True)
        except OSError:
            continue
        if target.is_file():
            return str(target)
    return None


class VllmClient:
    """One vLLM API server. ``read`` never raises and never takes longer than about ``timeout_s``."""

    kind = "vllm"

    def __init__(
        self,
        url: str,
        pid: int | None = None,
        timeout_s: float = SCRAPE_TIMEOUT_S,
        info: dict[str, Any] | None = None,
    ) -> None:
        self.url = normalize_url(url)
        self.pid = pid
        self.timeout_s = timeout_s
        # Static facts from discovery (cmdline, layout, tree pids, gpus, version).
        self.info: dict[str, Any] = dict(info or {})
        self._model: str | None = None
        self._version: str | None = self.info.get("version")
        # The last scrape's KV offload byte counters and when it was read (for bytes/s between scrapes).
        self._prev_offload: tuple[float, float | None, float | None] | None = None
        # The last scrape's counters of the engine's own work (:data:`OWN_WORK`), for what rose since.
        self._prev_own: dict[str, float | None] = {}

    def _get_json(self, path: str) -> Any:
        status, body = http_get(self.url + path, self.timeout_s)
        if status != 200:
            return None
        try:
            return json.loads(body)
        except ValueError:
            return None

    def describe(self) -> dict[str, Any]:
        """Header facts: kind, url, pid, cmdline, layout, version, model, gpus, tree_pids."""
        if self._version is None:
            try:
                v = self._get_json("/version")
                if isinstance(v, dict) and isinstance(v.get("version"), str):
                    self._version = v["version"]
            except OSError:
                pass
            if self._version is None:
                log = _stdout_log(self.pid)
                self._version = version_from_log(log) if log else None
        if self._model is None:
            try:
                m = self._get_json("/v1/models")
                if isinstance(m, dict) and m.get("data"):
                    self._model = str(m["data"][0].get("id"))
            except (OSError, AttributeError, IndexError, TypeError):
                pass
        return {
            "kind": self.kind,
            "url": self.url,
            "pid": self.pid,
            "cmdline": self.info.get("cmdline"),
            "layout": self.info.get("layout"),
            "version": self._version,
            "model": self._model,
            "gpus": self.info.get("gpus"),
            "tree_pids": self.info.get("tree_pids"),
            "titles": self.info.get("titles"),
            "metrics_url": self.url + "/metrics",
        }

    def _offload_rates(self, c: dict[str, Any]) -> dict[str, float]:
        """Bytes/s the engine says its KV offloading moved host->device and device->host since the
        last scrape (``kv_offload_h2d_Bps``, ``kv_offload_d2h_Bps``); none where it has no such counter,
        on the first scrape, and across a restart (a counter that went down)."""
        h2d, d2h = c.get("kv_offload_h2d_bytes_total"), c.get("kv_offload_d2h_bytes_total")
        if h2d is None and d2h is None:
            self._prev_offload = None
            return {}
        now, prev = time.monotonic(), self._prev_offload
        self._prev_offload = (now, h2d, d2h)
        if prev is None or now - prev[0] <= 0:
            return {}
        out: dict[str, float] = {}
        for key, cur, old in (("kv_offload_h2d_Bps", h2d, prev[1]), ("kv_offload_d2h_Bps", d2h, prev[2])):
            if cur is not None and old is not None and cur >= old:
                out[key] = (cur - old) / (now - prev[0])
        return out

    def _own_work(self, c: dict[str, Any], g: dict[str, Any]) -> list[str]:
        """What the engine did of its own work since the last scrape, with no token counted meanwhile, that holds
        requests up (``own_work``, in
        vLLM's words; :func:`pcie_tui.engines.phases.tick_phase` makes a tick with requests outstanding and any
        of it ``housekeeping``): ``preemption`` (``vllm:num_preemptions`` rose: the scheduler took a running
        request's KV blocks for another and put it back in the queue to be recomputed, vllm/v1/core/sched/
        scheduler.py ``_preempt_request``), ``kv_offload_load`` (the OffloadingConnector loaded blocks
        host->GPU for a request that waits on them), and ``kv_offload_store`` (blocks stored GPU->host while
        requests wait for room; stores beside a running batch with none waiting hold no one up). None on the
        first scrape or across a restart. Requests waiting with reason "deferred" are not among them: vLLM
        defers for a grammar being compiled, streamed input, the LoRA limit or a remote KV transfer alike
        (scheduler.py), so the gauge says requests wait, not on what (``requests_waiting_deferred``)."""
        cur = {k: c.get(k) for k in (*OWN_WORK, *TOKENS)}
        prev, self._prev_own = self._prev_own, cur
        rose = {k for k, v in cur.items() if v is not None and prev.get(k) is not None and v > (prev[k] or 0.0)}
        if rose & set(TOKENS):
            # Tokens moved: the batch made progress and the tick is its prefill or decode (the preemptions and
            # copies stay counted per phase from the counters themselves, engine_bytes).
            return []
        out = [OWN_WORK[k] for k in OWN_WORK if k in rose]
        if "kv_offload_store" in out and not g.get("requests_waiting"):
            out.remove("kv_offload_store")
        return out

    def read(self) -> EngineSample:
        """One /metrics scrape -> EngineSample (phase left for the poller)."""
        try:
            status, body = http_get(self.url + "/metrics", self.timeout_s)
        except OSError as e:
            return EngineSample(kind=self.kind, up=False, error=failure_reason(e))
        if status != 200:
            return EngineSample(kind=self.kind, up=False, error=f"/metrics answered HTTP {status}")
        try:
            m = parse_vllm_metrics(body.decode("utf-8", "replace"))
        except ValueError as e:
            return EngineSample(kind=self.kind, up=False, error=f"/metrics unreadable: {str(e)[:120]}")
        c, g = m["counters"], m["gauges"]
        extra: dict[str, Any] = {"hist": m["hist"]}
        for k in ("kv_cache_util", "requests_waiting_deferred"):
            if g.get(k) is not None:
                extra[k] = g[k]
        for k in EXTRA_COUNTERS:
            if c.get(k) is not None:
                extra[k] = c[k]
        extra.update(self._offload_rates(c))
        own = self._own_work(c, g)
        if own:
            extra["own_work"] = own
        return EngineSample(
            kind=self.kind,
            up=True,
            prompt_tokens_total=c["prompt_tokens_total"],
            generation_tokens_total=c["generation_tokens_total"],
            requests_running=g["requests_running"],
            requests_waiting=g["requests_waiting"],
            extra=extra,
        )
