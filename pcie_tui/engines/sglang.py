"""SGLang: its Prometheus ``sglang:`` metrics, its launch flags, and what they mean for the bus.

Written from SGLang's documentation and source, never run against a real SGLang server (no SGLang build
runs on these machines): :attr:`SGLangEngine.tested` is False. Sources (sgl-project/sglang, read 2026-08):

* Metric names, types, labels: ``python/sglang/srt/metrics/collector.py`` at 93d04878cfb9b08645fae7b11bd340ee33b34acf
  (tokenizer counters ``sglang:prompt_tokens_total``, ``generation_tokens_total``, ``num_requests_total`` (one per
  finished request), ``cached_tokens_total``; scheduler gauges ``num_running_reqs``, ``num_queue_reqs``,
  ``token_usage`` (KV pool fraction 0..1), ``num_used_tokens``, ``gen_throughput`` (token/s); histograms
  ``time_to_first_token_seconds``, ``inter_token_latency_seconds``, ``e2e_request_latency_seconds``,
  ``queue_time_seconds``). Only with ``--enable-metrics``.
* https://docs.sglang.io/references/production_metrics.html (docs/references/production_metrics.md at
  40ef116f011cf1599811af1089ddf00971092bcf): the exposition example and the older ITL name
  ``sglang:time_per_output_token_seconds``.
* Scheduler labels ``model_name, engine_type, tp_rank, pp_rank[, dp_rank]``: ``managers/scheduler_metrics_mixin.py``
  (01bb3c807f7e62c19a31de7548837505488c2b64). One series per DP rank is read (its lowest tp/pp rank).
* Flags and defaults (``--port`` 30000, ``--host`` 127.0.0.1, ``--tp-size``/``--tensor-parallel-size``,
  ``--dp-size``, ``--pp-size``, ``--cpu-offload-gb``, ``--enable-hierarchical-cache``, ``--hicache-ratio``,
  ``--hicache-size``): https://docs.sglang.io/advanced_features/server_arguments.html (at
  004813e1dd464844bd92ddbca5cab8c024a75f78); its examples write ``--tp 2`` / ``--dp 2`` (argparse prefixes).
* ``GET /get_model_info`` (``model_path``, ``is_generation``) and ``GET /get_server_info`` (``version``):
  ``srt/entrypoints/http_server.py`` (0025436eab0556737d615b36a4dd3e1e26e82f3d), docs basic_usage/native_api.
* Child process titles ``sglang::scheduler[_DPn][_TPn]``, ``sglang::detokenizer`` (setproctitle in scheduler.py).

* Live tokens: ``sglang:realtime_tokens_total{mode="prefill_compute"|"prefill_cache"|"decode"}`` (scheduler,
  ``SchedulerMetricsCollector.increment_realtime_tokens``; collector.py at 00ae9c1590d2d0bb6c0bfff39e312c34ae3dd538,
  observability/metrics_collector.py at 44cedc2b9c7dd31d9acae4498ea4fa0d3665feed), added per prefill batch
  (``log_prefill_stats_late``) and per decode step (``log_decode_stats_every_iteration``): the phase and the
  token rates come from it where exported (``extra["live_*"]``), else from the tokenizer's counters, which
  move only when a request ends.
* HiCache (``RadixCacheMetricsCollector``, HiRadixCache only): ``sglang:load_back_tokens_total`` (host to GPU),
  ``sglang:evicted_tokens_total`` (GPU to host), ``sglang:load_back_duration_seconds`` and
  ``eviction_duration_seconds`` at 44cedc2b: tokens, not bytes. ``sglang:load_back_bytes_total``,
  ``sglang:hicache_backup_bytes_total`` / ``_tokens_total`` / ``_duration_seconds`` (and a ``pool`` label) are read
  where a newer build exports them; they are not in the source read (names as scrapers of SGLang 0.5.20 list them).
* ``/server_info`` and ``/model_info`` in newer SGLang (the ``/get_`` forms log a deprecation warning per call).

Not exposed by SGLang, so None here: prefill/decode-time histograms, a preemption counter.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping, Sequence
from typing import Any

from prometheus_client.parser import text_string_to_metric_families

from pcie_tui.core.model import EngineSample
from pcie_tui.core.units import size
from pcie_tui.engines.argv import dist_version, flag_values
from pcie_tui.engines.base import (
    Advice,
    Engine,
    EngineClient,
    EngineFacts,
    FindingFacts,
    Layout,
    Role,
    RuntimeFact,
    SourceRow,
    typed,
)
from pcie_tui.engines.http import SCRAPE_TIMEOUT_S, failure_reason, http_get, normalize_url
from pcie_tui.engines.stats import extra_counter_total

DOCS = (
    "https://docs.sglang.io/references/production_metrics.html",
    "https://docs.sglang.io/advanced_features/server_arguments.html",
    "https://github.com/sgl-project/sglang/blob/93d04878cfb9b08645fae7b11bd340ee33b34acf/python/sglang/srt/metrics/collector.py",
)

# Our name -> SGLang sample names, newest first. Token counters come from the tokenizer manager.
COUNTERS = {
    "prompt_tokens_total": ("sglang:prompt_tokens_total",),
    "generation_tokens_total": ("sglang:generation_tokens_total",),
    "requests_finished_total": ("sglang:num_requests_total",),
    "cached_tokens_total": ("sglang:cached_tokens_total",),
}
# Scheduler gauges: one series per (dp, tp, pp) rank that reports; see _per_dp.
GAUGES = {
    "requests_running": "sglang:num_running_reqs",
    "requests_waiting": "sglang:num_queue_reqs",
    "kv_cache_util": "sglang:token_usage",  # fraction 0..1 of the KV token pool in use
    "kv_tokens_used": "sglang:num_used_tokens",
    "gen_throughput_tps": "sglang:gen_throughput",
}
# Summed over data-parallel ranks; the others (fractions, rates) are averaged or summed as noted in _per_dp.
_SUMMED = frozenset(("requests_running", "requests_waiting", "kv_tokens_used", "gen_throughput_tps"))
HISTOGRAMS = {
    "ttft_s": ("sglang:time_to_first_token_seconds",),
    "itl_s": ("sglang:inter_token_latency_seconds", "sglang:time_per_output_token_seconds"),
    "queue_s": ("sglang:queue_time_seconds",),
    "e2e_s": ("sglang:e2e_request_latency_seconds",),
}

REALTIME = "sglang:realtime_tokens_total"
# Scheduler counters: our key -> (SGLang sample name, its ``mode`` label). realtime_tokens_total moves with
# every prefill batch and decode step (scheduler_metrics_mixin.py log_prefill_stats_late /
# log_decode_stats_every_iteration), unlike the tokenizer's counters, which move when a request ends.
SCHED_COUNTERS: dict[str, tuple[str, str | None]] = {
    "realtime_prefill_compute": (REALTIME, "prefill_compute"),
    "realtime_prefill_cache": (REALTIME, "prefill_cache"),
    "realtime_decode": (REALTIME, "decode"),
    # HiCache (HiRadixCache's RadixCacheMetricsCollector): host KV pages loaded back to the GPU and written
    # from it. Tokens in the source read; bytes only where a newer SGLang exports them.
    "load_back_tokens_total": ("sglang:load_back_tokens_total", None),
    "evicted_tokens_total": ("sglang:evicted_tokens_total", None),
    "backup_tokens_total": ("sglang:hicache_backup_tokens_total", None),
    "load_back_bytes_total": ("sglang:load_back_bytes_total", None),
    "backup_bytes_total": ("sglang:hicache_backup_bytes_total", None),
    "load_back_seconds_total": ("sglang:load_back_duration_seconds_sum", None),
    "eviction_seconds_total": ("sglang:eviction_duration_seconds_sum", None),
    "backup_seconds_total": ("sglang:hicache_backup_duration_seconds_sum", None),
}
_SCHED_BY_NAME = {v: k for k, v in SCHED_COUNTERS.items()}
_REALTIME_KEYS = ("realtime_prefill_compute", "realtime_prefill_cache", "realtime_decode")
HICACHE_KEYS = tuple(k for k in SCHED_COUNTERS if k not in _REALTIME_KEYS)

_SIZES = ("tensor_parallel_size", "pipeline_parallel_size", "data_parallel_size")
_BOOLS = ("enable_metrics", "enable_dp_attention", "enable_hierarchical_cache")
_NUMS = ("cpu_offload_gb", "hicache_ratio", "hicache_size", "mem_fraction_static")
_STRS = ("model", "served_model_name", "host", "kv_cache_dtype")
FLAGS: dict[str, tuple[str, ...]] = {
    "tensor_parallel_size": ("--tensor-parallel-size", "--tp-size", "--tp"),
    "pipeline_parallel_size": ("--pipeline-parallel-size", "--pp-size", "--pp"),
    "data_parallel_size": ("--data-parallel-size", "--dp-size", "--dp"),
    "model": ("--model-path", "--model"),
    **{k: ("--" + k.replace("_", "-"),) for k in (*_BOOLS, *_NUMS, *_STRS[1:], "port")},
}


def _num(v: Any) -> int | float | None:
    if not isinstance(v, str):
        return None
    try:
        return int(v)
    except ValueError:
        try:
            return float(v)
        except ValueError:
            return None


def _pos_int(v: Any) -> int | None:
    return v if isinstance(v, int) and not isinstance(v, bool) and v > 0 else None


def parse_layout(argv: Sequence[str]) -> dict[str, Any]:
    """Parallel sizes (1 where absent), offload/HiCache settings, model, host and port from the command line."""
    f = flag_values(list(argv), FLAGS)
    out: dict[str, Any] = {}
    for k in _SIZES:
        n = _num(f.get(k))
        out[k] = n if isinstance(n, int) and n > 0 else 1
    tp, pp, dp = (out[k] for k in _SIZES)
    dp_attention = f.get("enable_dp_attention") is True
    # With --enable-dp-attention the DP groups share the TP GPUs (docs: "DP for attention, TP for FFN").
    out["gpus_expected"] = tp * pp if dp_attention else tp * pp * dp
    out["explicit"] = sorted(k for k in _SIZES if k in f)
    for k in _BOOLS:
        out[k] = f.get(k) is True
    for k in _NUMS:
        out[k] = _num(f.get(k))
    for k in _STRS:
        v = f.get(k)
        out[k] = v if isinstance(v, str) else None
    port = _num(f.get("port"))
    out["port"] = port if isinstance(port, int) else None
    return out


def classify(argv: Sequence[str], proc_name: str = "") -> Role | None:
    """``python -m sglang.launch_server`` / ``sglang serve``: root; an ``sglang::`` process title: child."""
    first = argv[0] if argv else ""
    if first.startswith("sglang::") or proc_name.startswith("sglang::"):
        return "child"
    for i, a in enumerate(argv[:3]):
        if os.path.basename(a) == "sglang" and i + 1 < len(argv) and argv[i + 1] == "serve":
            return "root"
    for i, a in enumerate(argv):
        if a == "-m" and i + 1 < len(argv) and argv[i + 1] == "sglang.launch_server":
            return "root"
        if a.endswith("sglang/launch_server.py"):
            return "root"
    return None


def version_from_venv(argv: Sequence[str]) -> str | None:
    """SGLang's version from the dist-info beside the interpreter that runs it (no import)."""
    return dist_version(argv, "sglang-*.dist-info", r"sglang-([0-9][^-]*)\.dist-info")


def _rank(labels: Mapping[str, str], key: str) -> int:
    try:
        return int(labels.get(key, "0"))
    except ValueError:
        return 0


def _sched_key(name: str, labels: Mapping[str, str]) -> str | None:
    """Our key of a scheduler counter sample (``realtime_tokens_total`` by its ``mode``), or None."""
    return _SCHED_BY_NAME.get((name, labels.get("mode") if name == REALTIME else None))


def _per_dp_value(by_dp: Mapping[int, Mapping[tuple[int, int], float]], summed: bool) -> float | None:
    """One value per DP rank (its lowest tp/pp rank's series), then summed (or averaged) over DP ranks."""
    vals = [ranks[min(ranks)] for ranks in by_dp.values() if ranks]
    if not vals:
        return None
    return sum(vals) if summed else sum(vals) / len(vals)


def _hists(buckets: Mapping[str, Mapping[float, float]], sums: Mapping[str, float]) -> dict[str, dict[str, Any]]:
    hist: dict[str, dict[str, Any]] = {}
    for hname, names in HISTOGRAMS.items():
        for n in names:
            hb = buckets.get(n)
            if not hb:
                continue
            finite = sorted(le for le in hb if le != float("inf"))
            hist[hname] = {
                "le": finite,
                "cum": [hb[le] for le in finite],
                "count": sums.get(n + "_count", hb.get(float("inf"), max(hb.values()))),
                "sum": sums.get(n + "_sum"),
            }
            break
    return hist


def parse_metrics(text: str) -> dict[str, Any]:
    """Prometheus text -> {counters, gauges, sched, hist, dp_ranks}. Raises ValueError when it holds no
    ``sglang:`` metric.

    Tokenizer counters and histograms are summed over label sets (model names, custom labels). Scheduler
    gauges and counters (``realtime_tokens_total`` per mode, HiCache) are read once per data-parallel rank
    (its lowest tp/pp rank: with ``--enable-metrics-for-all-schedulers`` every TP rank reports the same
    batch) and summed over DP ranks, except the KV pool fraction, which is their mean.
    """
    sums: dict[str, float] = {}
    buckets: dict[str, dict[float, float]] = {}
    gauge_names = set(GAUGES.values())
    # name -> dp rank -> (tp, pp) -> value (scheduler counters summed over their other labels, e.g. pool)
    per_dp: dict[str, dict[int, dict[tuple[int, int], float]]] = {}
    for fam in text_string_to_metric_families(text):
        for s in fam.samples:
            if not s.name.startswith("sglang:"):
                continue
            v, sk = float(s.value), _sched_key(s.name, s.labels)
            if s.name in gauge_names or sk is not None:
                ranks = per_dp.setdefault(sk or s.name, {}).setdefault(_rank(s.labels, "dp_rank"), {})
                key = (_rank(s.labels, "tp_rank"), _rank(s.labels, "pp_rank"))
                ranks[key] = v if sk is None else ranks.get(key, 0.0) + v
            elif s.name.endswith("_bucket") and "le" in s.labels:
                b = buckets.setdefault(s.name[: -len("_bucket")], {})
                le = float(s.labels["le"])
                b[le] = b.get(le, 0.0) + v
            else:
                sums[s.name] = sums.get(s.name, 0.0) + v
    if not sums and not buckets and not per_dp:
        raise ValueError("no sglang: metrics in the response")
    counters = {k: next((sums[n] for n in names if n in sums), None) for k, names in COUNTERS.items()}
    gauges: dict[str, float | None] = {
        k: _per_dp_value(per_dp.get(name, {}), k in _SUMMED) for k, name in GAUGES.items()
    }
    sched = {k: x for k in SCHED_COUNTERS if (x := _per_dp_value(per_dp.get(k, {}), True)) is not None}
    dp_ranks = max((len(d) for d in per_dp.values()), default=0) or None
    return {"counters": counters, "gauges": gauges, "sched": sched, "hist": _hists(buckets, sums), "dp_ranks": dp_ranks}


def live_counters(sched: Mapping[str, float]) -> dict[str, float]:
    """``extra`` keys from ``sglang:realtime_tokens_total``: the prompt tokens the scheduler has taken into
    prefill batches (computed + served from the prefix cache) and the tokens its decode steps produced, as
    they happen; a mode with no series yet (SGLang leaves a mode out until it moves) counts 0. Empty
    when the server exports no realtime counter (older SGLang)."""
    if not any(k in sched for k in _REALTIME_KEYS):
        return {}
    compute, cache, decode = (sched.get(k, 0.0) for k in _REALTIME_KEYS)
    return {
        "live_prompt_tokens_total": compute + cache,
        "live_generation_tokens_total": decode,
        "live_prompt_cached_total": cache,
    }


class SGLangClient:
    """One SGLang HTTP server. ``read`` never raises and takes at most about ``timeout_s``."""

    kind = "sglang"

    def __init__(
        self, url: str, pid: int | None = None, info: dict[str, Any] | None = None, timeout_s: float = SCRAPE_TIMEOUT_S
    ):
        self.url = normalize_url(url)
        self.pid = pid
        self.timeout_s = timeout_s
        self.info: dict[str, Any] = dict(info or {})
        self._version: str | None = self.info.get("version")
        self._model: str | None = None
        self._version_from: str | None = None

    def _json(self, path: str) -> Any:
        try:
            status, body = http_get(self.url + path, max(self.timeout_s, 1.0))
            return json.loads(body) if status == 200 else None
        except (OSError, ValueError):
            return None

    def _first_json(self, *paths: str) -> tuple[str, dict[str, Any]] | None:
        """The first of ``paths`` that answers a JSON object, with its path (newer SGLang serves
        /server_info and /model_info; the /get_ forms are deprecated there and log a warning per call)."""
        for path in paths:
            obj = self._json(path)
            if isinstance(obj, dict):
                return path, obj
        return None

    def describe(self) -> dict[str, Any]:
        """Header facts; ``version`` from /server_info (older: /get_server_info), ``model`` from /model_info
        (older: /get_model_info), only those fields kept; HiCache counters as they stood at attach."""
        if self._version is None:
            got = self._first_json("/server_info", "/get_server_info")
            if got is not None and isinstance(got[1].get("version"), str):
                self._version, self._version_from = got[1]["version"], got[0]
        if self._model is None:
            got = self._first_json("/model_info", "/get_model_info")
            if got is not None and isinstance(got[1].get("model_path"), str):
                self._model = got[1]["model_path"]
        d = {k: self.info.get(k) for k in ("cmdline", "layout", "gpus", "tree_pids", "titles")}
        d.update(kind=self.kind, url=self.url, pid=self.pid, version=self._version, model=self._model)
        sched = self._sched_now()
        d.update(version_from=self._version_from, realtime_tokens=None if sched is None else "realtime" in sched)
        hicache = {k: sched[k] for k in HICACHE_KEYS if k in sched} if sched is not None else {}
        d["hicache"] = hicache or None
        return {**d, "metrics_url": self.url + "/metrics", "tested": False}

    def _sched_now(self) -> dict[str, Any] | None:
        """The scheduler counters of one /metrics read, with "realtime" set where SGLang exports
        ``sglang:realtime_tokens_total`` (None: /metrics not readable)."""
        try:
            status, body = http_get(self.url + "/metrics", max(self.timeout_s, 1.0))
            if status != 200:
                return None
            sched: dict[str, Any] = dict(parse_metrics(body.decode("utf-8", "replace"))["sched"])
        except (OSError, ValueError):
            return None
        if any(k in sched for k in _REALTIME_KEYS):
            sched["realtime"] = True
        return sched

    def read(self) -> EngineSample:
        """One /metrics scrape -> EngineSample (phase left for the poller)."""
        try:
            status, body = http_get(self.url + "/metrics", self.timeout_s)
        except OSError as e:
            return EngineSample(kind=self.kind, up=False, error=failure_reason(e))
        if status == 404:
            return EngineSample(
                kind=self.kind, up=False, error="/metrics answered HTTP 404 (start SGLang with --enable-metrics)"
            )
        if status != 200:
            return EngineSample(kind=self.kind, up=False, error=f"/metrics answered HTTP {status}")
        try:
            m = parse_metrics(body.decode("utf-8", "replace"))
        except ValueError as e:
            return EngineSample(kind=self.kind, up=False, error=f"/metrics unreadable: {str(e)[:120]}")
        c, g = m["counters"], m["gauges"]
        return EngineSample(
            kind=self.kind,
            up=True,
            prompt_tokens_total=c["prompt_tokens_total"],
            generation_tokens_total=c["generation_tokens_total"],
            requests_running=g["requests_running"],
            requests_waiting=g["requests_waiting"],
            extra=_extra(m),
        )


def _extra(m: Mapping[str, Any]) -> dict[str, Any]:
    """``EngineSample.extra`` of one parsed scrape: histograms, the other gauges and counters, the live
    (realtime) token counters and the HiCache counters, each only where SGLang exported it."""
    c, g, sched = m["counters"], m["gauges"], m["sched"]
    extra: dict[str, Any] = {"hist": m["hist"]}
    for k in ("kv_cache_util", "kv_tokens_used", "gen_throughput_tps"):
        if g.get(k) is not None:
            extra[k] = g[k]
    for k in ("requests_finished_total", "cached_tokens_total"):
        if c.get(k) is not None:
            extra[k] = c[k]
    if m["dp_ranks"] is not None:
        extra["dp_ranks"] = m["dp_ranks"]
    extra.update(live_counters(sched))
    hicache = {k: sched[k] for k in HICACHE_KEYS if k in sched}
    if hicache:
        extra["hicache"] = hicache
    return extra


class SGLangEngine(Engine):
    name = "sglang"
    display = "SGLang"
    default_port = 30000
    tested = False
    not_exposed = frozenset({"prefill/decode time, preemptions"})  # no such histogram or counter in /metrics
    docs = DOCS
    probe_paths = ("/metrics", "/get_model_info")
    # time_to_first_token_seconds runs from the request's arrival at the tokenizer: queue time included.
    ttft_includes_queue = True
    # sglang:realtime_tokens_total counts tokens as batches run: where it is read, its rates are the
    # engine's, not a lower bound beside the request-end counters.
    live_tokens_exact = True
    layout_flags = {k: FLAGS[k] for k in (*_SIZES, "cpu_offload_gb", "enable_hierarchical_cache", "hicache_ratio")}

    def classify(self, argv: Sequence[str], proc_name: str) -> Role | None:
        return classify(argv, proc_name)

    def child_title(self, argv: Sequence[str], proc_name: str) -> str | None:
        t = argv[0] if argv and argv[0].startswith("sglang::") else proc_name
        return t.strip() if t.startswith("sglang::") else None

    def parse_layout(self, argv: Sequence[str], environ: Mapping[str, str]) -> dict[str, Any]:
        return parse_layout(argv)

    def version(self, argv: Sequence[str]) -> str | None:
        return version_from_venv(argv)

    def recognise(self, path: str, status: int, body: bytes) -> bool:
        if status != 200:
            return False
        if path == "/metrics":
            return b"sglang:" in body
        try:
            obj = json.loads(body)
        except ValueError:
            return False
        return path == "/get_model_info" and isinstance(obj, dict) and {"model_path", "is_generation"} <= obj.keys()

    def client(self, url: str, pid: int | None, info: dict[str, Any], log_path: str | None) -> EngineClient:
        return SGLangClient(url, pid=pid, info=info)

    def live_tokens(self, ticks: Sequence[tuple[float, EngineSample]], what: str) -> tuple[float, float, str] | None:
        key, src = _LIVE.get(what, ("", ""))
        got = extra_counter_total(ticks, key) if key else None
        return (got[0], got[1], src) if got is not None else None

    def sources(self, window: str) -> list[SourceRow]:
        src = "SGLang /metrics (--enable-metrics; written from its source, checked against real scrapes users pasted)"
        return [
            ("prompt, generation tok/s", f"{_LIVE['prompt'][1]}, {_LIVE['generation'][1]} (live); "
             "else sglang:prompt_tokens_total, sglang:generation_tokens_total (at request end)", "tok/s", src),
            ("running, waiting", "sglang:num_running_reqs, sglang:num_queue_reqs (sum over DP ranks)", "requests",
             "latest"),
            ("KV cache use", "sglang:token_usage (mean over DP ranks)", "%", "latest"),
            ("TTFT, ITL, e2e, queue", "sglang:*_seconds histograms (bucket-interpolated quantiles)", "s", window),
            ("HiCache host<->GPU", "sglang:load_back_*, sglang:evicted_tokens_total, sglang:hicache_backup_* "
             "(bytes where exported, else tokens)", "B or tokens", window),
            ("quantile above the top bucket", "n/a: SGLang's histograms end at a finite bucket (TTFT 30 s in older "
             "builds); a quantile above it reads as that bound, a floor", "s", window),
            ("prefill/decode time, preemptions", "not exposed by SGLang (no such histogram or counter)", "n/a", "-"),
        ]  # fmt: skip

    def facts(self, engine_info: dict[str, Any]) -> EngineFacts:
        layout: dict[str, Any] = typed(engine_info, "layout", dict, {})
        argv: list[Any] = typed(engine_info, "cmdline", list, [])
        if argv and not layout:
            layout = parse_layout([str(a) for a in argv])
        off = layout.get("cpu_offload_gb")
        off = off if isinstance(off, int | float) and not isinstance(off, bool) and off > 0 else None
        hicache = hicache_facts(layout, typed(engine_info, "hicache", dict, None), bool(argv or layout))
        kv = None
        if hicache[0].value:
            size, ratio = layout.get("hicache_size"), layout.get("hicache_ratio")
            how = f"--hicache-size {size} GB" if size else f"--hicache-ratio {ratio if ratio else 2.0} (x the GPU pool)"
            kv = f"HiCache: a host-memory KV pool ({how}) that pages move to and from over PCIe"
        sizes = [_pos_int(layout.get(k)) for k in _SIZES]
        return EngineFacts(
            kind=self.name,
            host_weights=f"{off} GB of weights in host memory (--cpu-offload-gb {off})" if off else None,
            kv_on_host=kv,
            tensor_parallel=sizes[0],
            layout=Layout(tensor_parallel=sizes[0], pipeline_parallel=sizes[1], data_parallel=sizes[2]),
            timing=self.timing(),
            flags={k: layout.get(k) for k in (*_NUMS[:3], "enable_hierarchical_cache")},
            runtime=(*hicache, token_source_fact(engine_info.get("realtime_tokens"))),
        )

    def advise(self, facts: EngineFacts, finding: FindingFacts) -> list[Advice]:
        bound, tp = finding.bound, facts.tensor_parallel or 1
        note = "SGLang support is written from its source and not tested against a real server"
        if bound in ("link", "transfer") and facts.host_weights:
            off = facts.flags.get("cpu_offload_gb")
            cause, short = f"{facts.host_weights} cross the link to the GPU while it computes", "CPU-offloaded weights"
            fix, ev = (
                "lower --cpu-offload-gb (or spread the model with --tp-size) if memory allows",
                f"--cpu-offload-gb {off}",
            )
        elif bound in ("link", "transfer") and facts.kv_on_host:
            moved, on = facts.fact("hicache_moved"), facts.fact("hicache")
            cause = f"{facts.kv_on_host}; {_said(moved)}" if moved is not None else facts.kv_on_host
            short, ev = "HiCache host KV pool", _said(on) if on is not None else facts.kv_on_host
            fix = "give the GPU KV pool more room (--mem-fraction-static) or turn HiCache off for this load"
        elif bound == "link" and tp > 1:
            cause = f"tensor parallelism over {tp} GPUs: all-reduces cross the GPU-to-GPU link"
            fix = "a faster GPU-to-GPU path (NVLink, both GPUs on CPU lanes at x16), or --pp-size for fewer transfers"
            short, ev = "TP all-reduce", f"--tp-size {tp}"
        else:
            return []
        return [Advice(cause=cause, fix=fix, evidence=(ev, note), short=short)]


_LIVE = {
    "prompt": ("live_prompt_tokens_total", 'sglang:realtime_tokens_total{mode="prefill_compute"+"prefill_cache"}'),
    "generation": ("live_generation_tokens_total", 'sglang:realtime_tokens_total{mode="decode"}'),
}


def _said(f: RuntimeFact) -> str:
    """A fact as the cause cites it: its value and where it was read ("unknown" where it was not)."""
    return f"{'unknown' if f.value is None else f.value} ({f.source})"


def _amount(counters: Mapping[str, Any], what: str) -> str | None:
    """How much HiCache moved one way by SGLang's counters: bytes where exported, else tokens."""
    b, t = counters.get(f"{what}_bytes_total"), counters.get(f"{what}_tokens_total")
    if isinstance(b, int | float):
        return f"{size(b)} (sglang:{_HICACHE_NAMES[what][0]})"
    if isinstance(t, int | float):
        return f"{t:.0f} tokens (sglang:{_HICACHE_NAMES[what][1]}; bytes not exported)"
    return None


_HICACHE_NAMES = {
    "load_back": ("load_back_bytes_total", "load_back_tokens_total"),
    "backup": ("hicache_backup_bytes_total", "hicache_backup_tokens_total"),
}


def hicache_facts(
    layout: Mapping[str, Any], counters: Mapping[str, Any] | None, have_flags: bool
) -> tuple[RuntimeFact, RuntimeFact]:
    """Whether HiCache is on (its flag, else its counters on /metrics: only HiRadixCache exports them) and
    what it had moved over the link when the tool attached (SGLang's counters since the server started)."""
    if layout.get("enable_hierarchical_cache") is True:
        on = RuntimeFact("hicache", True, "flag --enable-hierarchical-cache")
    elif counters:
        on = RuntimeFact("hicache", True, "/metrics: SGLang exports HiCache counters (sglang:load_back_*)")
    elif have_flags:
        on = RuntimeFact("hicache", False, "no --enable-hierarchical-cache")
    else:
        on = RuntimeFact("hicache", None, "unknown: no command line and no HiCache counter read")
    parts = [f"{w} {a}" for w, what in (("host->GPU", "load_back"), ("GPU->host", "backup"))
             if (a := _amount(counters or {}, what)) is not None]  # fmt: skip
    if not counters:
        evicted = None
    elif isinstance(counters.get("evicted_tokens_total"), int | float):
        evicted = f"{counters['evicted_tokens_total']:.0f} tokens evicted GPU->host (sglang:evicted_tokens_total)"
    else:
        evicted = None
    moved = "; ".join([*parts, *([evicted] if evicted else [])]) or None
    src = "SGLang's counters since it started, read when pcie-tui attached"
    return on, RuntimeFact("hicache_moved", moved, src if moved else "unknown: SGLang exported no HiCache counter")


def token_source_fact(realtime: Any) -> RuntimeFact:
    """Where the live token rates and phases come from (``realtime_tokens`` of the header)."""
    if realtime is True:
        return RuntimeFact("token_source", "live", "/metrics: sglang:realtime_tokens_total (per batch)")
    if realtime is False:
        return RuntimeFact(
            "token_source", "at request end", "/metrics has no sglang:realtime_tokens_total (older SGLang)"
        )
    return RuntimeFact("token_source", None, "unknown: /metrics not read at attach")


ENGINE = SGLangEngine()
