"""``pcie-tui export --prometheus``: live or replayed readings as Prometheus metrics (docs/export.md).

A collection thread reads ticks from the source and feeds them to the SessionAnalyzer;
prometheus-client's HTTP thread renders the latest state at scrape time. Unavailable: no sample.
"""

from __future__ import annotations

import math
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

from pcie_tui.core import clocks, metrics
from pcie_tui.core.model import Sample, SessionHeader
from pcie_tui.core.vocab import TICK_BOUNDS, VERDICTS
from pcie_tui.engines import registry
from pcie_tui.engines.phases import PHASES as ENGINE_PHASES
from pcie_tui.engines.stats import REQUEST_IDENTITY

DEFAULT_PORT = 9842
# Label values of pcie_verdict and pcie_bound: the one vocabulary (pcie_tui.core.vocab).
VERDICT_NAMES = VERDICTS
BOUND_NAMES = TICK_BOUNDS
PHASES = ENGINE_PHASES  # every phase an engine tick can be in, one gauge each
# Engine histograms (engine.extra["hist"]), re-exposed with the engine's own buckets: key -> metric stem.
HIST_STEMS = {f"{k}_s": k for k in ("ttft", "itl", "prefill", "decode", "queue", "e2e")}
# An engine without histograms but with per-request timings (engine.extra["requests"], e.g. from its
# log, read by its Engine.request_timing): each finished request is observed once into these bounds
# (seconds). The counts are real; the bounds are ours.
_PROMPT_LE = (0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 25.0, 60.0, 120.0, 300.0)
REQUEST_LE = {
    "ttft": _PROMPT_LE,
    "prefill": _PROMPT_LE,
    "queue": _PROMPT_LE,
    "setup": _PROMPT_LE,
    "decode": (0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 20.0, 40.0, 80.0, 160.0, 320.0, 640.0),
    "request_itl_mean": (0.001, 0.0025, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.15, 0.2, 0.3, 0.5, 1.0),
}


def _num(v: Any) -> float | None:
    """A finite number, else None (bools, NaN and infinities are not readings)."""
    ok = isinstance(v, int | float) and not isinstance(v, bool) and math.isfinite(v)
    return float(v) if ok else None


def _valid_hist(h: Any) -> bool:
    """Cumulative buckets as the engine reported them: finite, ascending bounds, non-decreasing counts up to count."""
    try:
        le, cum, total = list(h["le"]), [*h["cum"], h["count"]], h.get("sum")
    except (KeyError, TypeError):
        return False
    if len(le) + 1 != len(cum) or None in [_num(x) for x in (*le, *cum)] or (total is not None and _num(total) is None):
        return False
    rising = all(a < b for a, b in zip(le, le[1:], strict=False))
    return rising and all(a <= b for a, b in zip(cum, cum[1:], strict=False))


class ExportState:
    """The latest readings, the verdict per GPU and the engine histograms; fed by one thread, read by another."""

    def __init__(self) -> None:
        self.lock = threading.Lock()  # held by feed() and by a scrape while it builds the families
        self.header: SessionHeader | None = None
        self._events: list[dict[str, Any]] = []
        self.source_labels: dict[str, str] = {}
        self.ticks_total = 0
        self.last_wall: float | None = None
        self._reset()

    def start(self, header: SessionHeader, source: str, recording: str = "", events: Any = ()) -> None:
        with self.lock:
            self.header = header
            self._events = [e for e in events if isinstance(e, dict)]  # engine_ready completes the facts
            self.source_labels = {"source": source, "recording": recording}
            self._reset()

    def _reset(self) -> None:
        from pcie_tui.analyze.analysis import Analysis

        # The one analysis (the TUI's and report's): the answer gauges are its findings.
        self.analysis = Analysis(self.header, self._events) if self.header is not None else None
        self.sample: Sample | None = None
        self.verdicts: dict[int, str] = {}
        self.link_util: dict[int, float | None] = {}
        self.hist: dict[str, dict[str, Any]] = {}
        self.per_request: dict[str, dict[str, Any]] = {}  # name -> {"le", "cum", "count", "sum"}
        self._seen: dict[tuple[Any, ...], None] = {}

    def note_events(self, events: Any) -> None:
        """Live events: an engine that became ready brings its complete facts (the bounds and fixes)."""
        with self.lock:
            if self.analysis is not None and self.analysis.note_events(events):
                self._events += [e for e in events if isinstance(e, dict)]

    def finish(self) -> None:
        """The source ended: the answer gauges are final (what ``report`` says of the same recording)."""
        with self.lock:
            if self.analysis is not None:
                self.analysis.finish()

    def feed(self, s: Sample) -> None:
        with self.lock:
            if self.analysis is None:
                return
            if self.sample is not None and s.t < self.sample.t:
                self._reset()  # a replay started over: counters restart, as after an engine restart
            assert self.analysis is not None
            self.analysis.feed(s)
            trackers = self.analysis.session.trackers
            for g in s.gpus:
                tr = trackers.get(g.index)
                self.verdicts[g.index] = tr.verdict if tr is not None else "none"
                u = tr.last_util if tr is not None else None
                self.link_util[g.index] = u.link if u is not None else None
            if s.engine is not None:
                self._engine(s.engine.kind, s.engine.extra)
            self.sample = s
            self.ticks_total += 1
            self.last_wall = time.time()

    def _engine(self, kind: str, extra: dict[str, Any]) -> None:
        hist = extra.get("hist")
        if isinstance(hist, dict):  # absent when unchanged: the last one stays
            self.hist = {k: h for k, h in hist.items() if k in HIST_STEMS and _valid_hist(h)}
        eng = registry.get(kind)
        for r in extra.get("requests") or ():
            if not isinstance(r, dict):
                continue
            key = tuple(repr(r.get(k)) for k in REQUEST_IDENTITY)
            if key in self._seen:
                continue  # older recordings repeat a finished request on several ticks
            self._seen[key] = None
            if len(self._seen) > 10_000:
                self._seen.pop(next(iter(self._seen)))
            rt = eng.request_timing(r) if eng is not None else None  # the engine reads its own timings
            if rt is None:
                continue
            for name, v in (
                ("ttft", rt.ttft_s),
                ("prefill", rt.prefill_s),
                ("decode", rt.decode_s),
                ("request_itl_mean", rt.itl_mean_s),
                ("queue", rt.queue_s),
                ("setup", rt.setup_s),
            ):
                if v is not None:
                    self._observe(name, v)

    def _observe(self, name: str, v: float) -> None:
        """One real observation into fixed bounds (cumulative: every bucket at or above ``v``)."""
        le = REQUEST_LE[name]
        h = self.per_request.setdefault(name, {"le": list(le), "cum": [0] * len(le), "count": 0, "sum": 0.0})
        h["cum"] = [c + (v <= b) for c, b in zip(h["cum"], le, strict=True)]
        h["count"] += 1
        h["sum"] += v


HELP = {
    "pcie_export_ticks": "ticks read from the source since start",
    "pcie_export_last_tick_timestamp_seconds": "wall clock when the last tick was read",
    "pcie_export_sample_time_seconds": "the last tick's own time (recorded time on replay)",
    "pcie_gpu_info": "static facts of the GPU (value 1)",
    "pcie_gpu_side_available": "1 when GPU readings are collected; 0 in engine-only mode (label reason: why not)",
    "pcie_link_ceiling_bytes_per_second": "link ceiling per direction, bytes/s (basis: calibrated, default or observed; NVLink theoretical)",
    "pcie_link_util_ratio": "busiest link direction over its ceiling, 0..1 (what the verdict uses)",
    "pcie_memory_total_bytes": "GPU memory size",
    "pcie_verdict": "saturated resource now (1 for the verdict, 0 for the others)",
    "pcie_bound": "what bound the GPU this tick (1 for the bound, 0 for the others): docs/attribution.md",
    "pcie_phase_duration_seconds": "time in the phase so far (the answer's finding, as report --json's)",
    "pcie_phase_bound": "what held the phase back most (1 for the bound, 0 for the others), as report --json's",
    "pcie_phase_bound_share_ratio": "share of the phase each bound held, 0..1, as report --json's",
    "pcie_phase_link_bytes_per_second": "link rate of the phase's bound ticks (label stat: median), as report --json's",
    "pcie_phase_link_of_ceiling_ratio": "that rate over the pinned ceiling (label ceiling: its source), as report --json's",
    "pcie_headline_info": "the headline's phase, bound and GPU (value 1; final=1 once the source ended)",
    "pcie_headline_share_ratio": "the share of its phase the headline's bound held, 0..1",
    "pcie_engine_up": "1 when the engine answered its last scrape",
    "pcie_engine_phase": "engine phase now (1 for the phase, 0 for the others)",
    "pcie_engine_prompt_tokens": "prompt tokens processed (the engine's counter)",
    "pcie_engine_generation_tokens": "tokens generated (the engine's counter)",
    "pcie_engine_requests_running": "requests being processed",
    "pcie_engine_requests_waiting": "requests queued",
    "pcie_engine_kv_cache_util_ratio": "KV cache in use, 0..1 (where the engine reports it)",
    "pcie_engine_model_vram_ratio": "share of the loaded model's bytes in GPU memory, 0..1 (where the engine reports it)",
    "pcie_engine_model_host_bytes": "bytes of the loaded model not in GPU memory: weights, KV cache and buffers together (where the engine reports it)",
    "pcie_engine_ttft_seconds": "time to first token from arrival (histograms: the engine's; llama-server: slot wait + slot setup + batch wait + prompt eval from its log, prompt eval alone where the arrival was not seen)",
    "pcie_engine_itl_seconds": "gap between consecutive output tokens, one observation per gap (engines with histograms)",
    "pcie_engine_prefill_seconds": "prefill time per request",
    "pcie_engine_decode_seconds": "decode time per request",
    "pcie_engine_queue_seconds": "time a request waited in the queue before it was taken up (engine histograms; llama-server: arrival to its slot)",
    "pcie_engine_e2e_seconds": "end-to-end latency per request (engines with histograms)",
    "pcie_engine_setup_seconds": "the engine's own work before a request started (llama-server: slot setup, where its host prompt cache saves and loads)",
    "pcie_between_requests_stretches": "stretches of the engine's own work between requests (phase housekeeping) so far",
    "pcie_between_requests_bytes_per_stretch": "PCIe bytes (NVML) per housekeeping stretch by direction (d2h: GPU->host, h2d: host->GPU)",
    "pcie_between_requests_copy_bytes_per_second": "median PCIe rate of the ticks that carried a copy in those stretches, by direction",
    "pcie_engine_request_itl_mean_seconds": "mean inter-token gap of each request, one observation per request",
    "pcie_clock_event_reason": "NVML clock-event reason set now (1) or not (0); all but idle, app clocks and display "
    "clocks cut a busy GPU's clocks",
}


def _table_help() -> dict[str, str]:
    """The per-GPU gauges of the metrics table (pcie_tui.core.metrics): name -> help."""
    return {m.prom.name: m.prom.help for m in metrics.table() if m.prom is not None}


HELP.update(_table_help())
COUNTERS = frozenset({"pcie_export_ticks", "pcie_engine_prompt_tokens", "pcie_engine_generation_tokens"})
Add = Callable[[str, dict[str, str], Any], None]


class PrometheusCollector:
    """prometheus-client custom collector: builds every pcie_* family from a snapshot at scrape time."""

    def __init__(self, state: ExportState) -> None:
        self.state = state

    def describe(self) -> list[Any]:
        return []  # no collect() at registration, before any tick

    def collect(self) -> Iterator[Any]:
        from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

        fams: dict[str, Any] = {}

        def add(name: str, labels: dict[str, str], value: Any) -> None:
            v = _num(value)
            if v is None:
                return  # unavailable: no sample
            fam = fams.get(name)
            if fam is None:
                cls = CounterMetricFamily if name in COUNTERS else GaugeMetricFamily
                doc = HELP[name] if name in HELP else _table_help()[name]  # a row registered since import
                fam = fams[name] = cls(name, doc, labels=list(labels))
            fam.add_metric(list(labels.values()), v)

        st = self.state
        with st.lock:  # building takes well under a millisecond
            add("pcie_export_ticks", st.source_labels, st.ticks_total)
            add("pcie_export_last_tick_timestamp_seconds", {}, st.last_wall)
            s, header = st.sample, st.header
            if header is not None:
                why = header.extra.get("gpu_unavailable") or ("" if header.gpus else "no GPU in the source")
                add("pcie_gpu_side_available", {"reason": str(why)[:200]}, 0 if why else 1)
            if s is not None and header is not None:
                add("pcie_export_sample_time_seconds", {}, s.t)
                _gpu_metrics(add, header, s, st)
                _answer_metrics(add, st)
            hists = list(_histograms(s.engine.kind, st)) if s is not None and s.engine is not None else []
            _engine_metrics(add, s)
        yield from fams.values()
        yield from hists


def _gpu_metrics(add: Add, header: SessionHeader, s: Sample, st: ExportState) -> None:
    from pcie_tui.analyze.verdict import tick_ceiling

    for g in s.gpus:
        gpu = {"gpu": str(g.index)}
        info = header.gpu(g.index)
        if info is not None:
            facts = {"uuid": info.uuid, "name": info.name, "pci_bus_id": info.pci_bus_id}
            add("pcie_gpu_info", {**gpu, **facts, "metrics_source": info.metrics_source or ""}, 1)
        for m in metrics.table():  # the per-GPU readings
            if m.prom is not None:
                add(m.prom.name, {**gpu, **dict(m.prom.labels)}, g.get(m.name))
        tr = st.analysis.session.trackers.get(g.index) if st.analysis is not None else None
        c = tick_ceiling(info, g, tr.observed if tr is not None else {})
        add("pcie_link_ceiling_bytes_per_second", {**gpu, "bus": "pcie", "basis": c.source}, c.Bps)
        if info is not None:
            nvl = {**gpu, "bus": "nvlink", "basis": "theoretical"}
            add("pcie_link_ceiling_bytes_per_second", nvl, info.nvlink_capacity_Bps)
            add("pcie_memory_total_bytes", gpu, info.memory_total_bytes)
        add("pcie_link_util_ratio", gpu, st.link_util.get(g.index))
        verdict = st.verdicts.get(g.index)
        if verdict is not None:
            for name in VERDICT_NAMES:
                add("pcie_verdict", {**gpu, "verdict": name}, 1 if name == verdict else 0)
        if g.clock_events is not None:  # each clock-event reason NVML names, 1 while it is set
            for bit, (name, _) in clocks.REASONS.items():
                add("pcie_clock_event_reason", {**gpu, "reason": name}, 1 if g.clock_events & bit else 0)
        bound = st.analysis.bound_now(g.index) if st.analysis is not None else None
        if bound is not None:
            for name in BOUND_NAMES:
                add("pcie_bound", {**gpu, "bound": name}, 1 if name == bound else 0)


def _answer_metrics(add: Add, st: ExportState) -> None:
    """The one analysis' answer: per GPU and phase the bound, its shares and evidence; the headline."""
    if st.analysis is None or st.analysis.session.n == 0:
        return
    ans = st.analysis.answer()
    final = {"final": "1" if st.analysis.ended else "0"}
    for index, fs in ans.findings.items():
        for f in fs:
            lab = {"gpu": str(index), "phase": f.phase}
            add("pcie_phase_duration_seconds", lab, f.duration_s)
            for name in BOUND_NAMES:
                add("pcie_phase_bound", {**lab, "bound": name}, 1 if name == f.bound else 0)
                add("pcie_phase_bound_share_ratio", {**lab, "bound": name}, f.shares.get(name))
            add("pcie_phase_link_bytes_per_second", {**lab, "stat": f.stat}, f.link_Bps)
            add("pcie_phase_link_of_ceiling_ratio", {**lab, "ceiling": f.ceilings.pinned_source}, f.link_of_pinned)
    _between_metrics(add, st.analysis.session)
    h = ans.headline
    if h.phase is not None:
        lab = {"phase": h.phase, "bound": h.bound, "gpu": "" if h.gpu is None else str(h.gpu), **final}
        add("pcie_headline_info", lab, 1)
        add("pcie_headline_share_ratio", lab, h.share)


def _between_metrics(add: Add, session: Any) -> None:
    """The engine's own copies in the housekeeping stretches between requests (the report's)."""
    c = session.between_requests.copies()
    if not c.stretches:
        return
    add("pcie_between_requests_stretches", {}, c.stretches)
    for d in ("d2h", "h2d"):
        add("pcie_between_requests_bytes_per_stretch", {"direction": d}, c.per_stretch(d))
        add(
            "pcie_between_requests_copy_bytes_per_second",
            {"direction": d, "stat": "p50"},
            (c.rate_p50_Bps or {}).get(d),
        )


def _engine_metrics(add: Add, s: Sample | None) -> None:
    e = s.engine if s is not None else None
    if e is None:
        return
    lab = {"engine": e.kind}
    add("pcie_engine_up", lab, 1 if e.up else 0)
    if e.phase:
        for p in (*PHASES, *((e.phase,) if e.phase not in PHASES else ())):
            add("pcie_engine_phase", {**lab, "phase": p}, 1 if p == e.phase else 0)
    add("pcie_engine_prompt_tokens", lab, e.prompt_tokens_total)
    add("pcie_engine_generation_tokens", lab, e.generation_tokens_total)
    add("pcie_engine_requests_running", lab, e.requests_running)
    add("pcie_engine_requests_waiting", lab, e.requests_waiting)
    add("pcie_engine_kv_cache_util_ratio", lab, e.extra.get("kv_cache_util"))
    frac = _num(e.extra.get("vram_frac"))
    add("pcie_engine_model_vram_ratio", lab, frac if frac is not None and 0.0 <= frac <= 1.0 else None)
    host = _num(e.extra.get("host_bytes"))
    add("pcie_engine_model_host_bytes", lab, host if host is not None and host >= 0 else None)


def _histograms(kind: str, st: ExportState) -> Iterator[Any]:
    from prometheus_client.core import HistogramMetricFamily
    from prometheus_client.utils import floatToGoString

    items = [(f"pcie_engine_{HIST_STEMS[k]}_seconds", h) for k, h in st.hist.items()]
    items += [(f"pcie_engine_{k}_seconds", h) for k, h in st.per_request.items()]
    for name, h in sorted(items, key=lambda x: x[0]):
        fam = HistogramMetricFamily(name, HELP[name], labels=["engine"])
        buckets = [(floatToGoString(le), float(c)) for le, c in zip(h["le"], h["cum"], strict=True)]
        buckets.append(("+Inf", float(h["count"])))
        fam.add_metric([kind], buckets, _num(h.get("sum")))
        yield fam
