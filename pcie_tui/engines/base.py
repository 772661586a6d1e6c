"""The protocol every inference engine implements, and the types the engines share.

An engine is one :class:`Engine` subclass instance in :mod:`pcie_tui.engines.registry`.
The generic code (discovery, attach by pid or URL, the poller, the analysis, the
outputs) reaches an engine only through these attributes and methods; nothing
outside ``pcie_tui/engines/`` names one.

Two layers of what an engine offers:

* live (sources layer): recognise its processes (:meth:`Engine.classify`), read its
  launch layout (:meth:`Engine.parse_layout`), recognise it by URL
  (:attr:`Engine.probe_paths`, :meth:`Engine.recognise`), build an :class:`EngineClient`
  that scrapes it (:meth:`Engine.client`);
* recorded (what the analysis and outputs read back): the display name, per-request
  timing hooks, layout flags for ``doctor``'s fingerprint, the ``?`` sources lines, and
  :meth:`Engine.facts` / :meth:`Engine.advise` for the attribution.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, ClassVar, Literal, Protocol

from pcie_tui.core.model import EngineSample

Role = Literal["root", "child"]


class EngineClient(Protocol):
    """What every engine client offers to the engine poller.

    Clients also carry ``url`` (str), ``pid`` (int or None), ``info`` (the discovery facts,
    a dict the poller updates with ``gpus``), where they read a log, ``user_log_path`` (the
    file the user named with --log, handed to the new client when the engine restarts), and
    optionally ``poll_interval_s`` (how often the engine wants reading; default 0.5 s); the
    poller and the CLI read those with ``getattr``.
    """

    kind: str  # the engine's registry name, recorded as the header's engine.kind

    def describe(self) -> dict[str, Any]:
        """Static facts for the recording header's ``engine`` object.

        At least: kind, url, pid, cmdline (argv list), layout (parsed split/parallel
        flags), version, gpus (NVML indices the process tree holds, if known).
        """
        ...

    def read(self) -> EngineSample:
        """One scrape with short timeouts. Never raises: failures give up=False and error."""
        ...


@dataclass(frozen=True)
class Layout:
    """How the engine spreads the model over GPUs, as its flags say (None where they do not)."""

    tensor_parallel: int | None = None
    pipeline_parallel: int | None = None
    data_parallel: int | None = None
    # How llama.cpp splits the model over several GPUs (``-sm``: "layer", "row", "none"; None: not set).
    split_mode: str | None = None

    def to_json(self) -> dict[str, Any]:
        return {
            "tensor_parallel": self.tensor_parallel,
            "pipeline_parallel": self.pipeline_parallel,
            "data_parallel": self.data_parallel,
            "split_mode": self.split_mode,
        }


@dataclass(frozen=True)
class RuntimeFact:
    """One thing the engine did, with where the tool read it: its log (``log: '...'``), a flag
    (``flag -lm mlock``), a variable (``env LLAMA_ARG_LOAD_MODE=mlock``) or a default. ``value`` None:
    unknown, and ``source`` says why; never assumed."""

    name: str
    value: Any
    source: str

    def to_json(self) -> dict[str, Any]:
        return {"name": self.name, "value": self.value, "source": self.source}


@dataclass(frozen=True)
class WeightStream:
    """Weights an engine keeps in host memory and copies to the GPU once per prefill micro-batch, priced
    from the model's shape: the link budget's host term (docs/doctor.md "linkmodel").

    ``missing`` (shape fields the count needs and the caller lacks) or ``problem`` (a placement that is
    not priced, and why) set: no price. Else ``bytes_per_microbatch`` (0 when no weight crosses) per
    micro-batch of ``ubatch`` tokens, counted as ``arithmetic`` says from the shape fields in ``used``."""

    what: str | None  # the host weights in words, e.g. "FFN weights of 12 layers (--n-cpu-ffn 12)"; None: none
    bytes_per_microbatch: float = 0.0
    ubatch: int | None = None
    ubatch_source: str | None = None  # e.g. "flag -ub 128"
    arithmetic: str = ""  # e.g. "12 layers x 3 x 4096 x 11008 x 2 B (ffn_gate, ffn_up, ffn_down)"
    used: tuple[str, ...] = ()  # the shape fields the count rests on, e.g. ("n_embd", "n_ff", "dtype")
    missing: tuple[str, ...] = ()
    problem: str | None = None
    notes: tuple[str, ...] = ()  # traffic that crosses but is not priced (decode's activations, a host KV cache)

    @property
    def priced(self) -> bool:
        return not self.missing and self.problem is None

    def to_json(self) -> dict[str, Any]:
        """``report --json``'s ``linkmodel.host_weights`` (docs/report-json.md)."""
        per_token = self.bytes_per_microbatch / self.ubatch if self.priced and self.ubatch else None
        return {
            "what": self.what,
            "bytes_per_microbatch": self.bytes_per_microbatch if self.priced else None,
            "ubatch": self.ubatch,
            "ubatch_source": self.ubatch_source,
            "prefill_bytes_per_token": per_token if self.priced else None,
            "arithmetic": self.arithmetic or None,
            "used": list(self.used),
            "missing": list(self.missing),
            "problem": self.problem,
            "notes": list(self.notes),
        }


@dataclass(frozen=True)
class TimingBasis:
    """How the engine's latency figures are timed (what its TTFT, ITL, prefill and decode mean)."""

    # "histograms" (the engine's Prometheus histograms), "per-request" (each finished request's own
    # timings, e.g. from the log) or "none" (the engine exposes no latencies).
    source: Literal["histograms", "per-request", "none"]
    # "bucket-interpolated" (estimates bounded by bucket edges), "exact" (order statistics), None: no latencies.
    quantiles: Literal["bucket-interpolated", "exact"] | None
    # Whether the engine's TTFT includes the time a request waited in its queue (None: unknown or no TTFT).
    ttft_includes_queue: bool | None = None
    note: str | None = None  # the engine's own words on it (its ``quantile_method``)

    def to_json(self) -> dict[str, Any]:
        return {
            "source": self.source,
            "quantiles": self.quantiles,
            "ttft_includes_queue": self.ttft_includes_queue,
            "note": self.note,
        }


@dataclass(frozen=True)
class RequestTiming:
    """One finished request's latencies, in seconds, as the engine timed it (None: not timed)."""

    ttft_s: float | None = None
    prefill_s: float | None = None
    decode_s: float | None = None
    itl_mean_s: float | None = None  # the request's mean gap between output tokens
    queue_s: float | None = None  # arrival to being taken up (a slot given), where the engine's timeline shows it
    setup_s: float | None = None  # the engine's own work before the request started (llama-server: slot setup)


@dataclass(frozen=True)
class FindingFacts:
    """One attribution finding (one GPU in one phase), as an engine's :meth:`Engine.advise` reads it.

    Built by the analysis from its typed finding (``pcie_tui.analyze.result.Finding``); rates and
    use are the median of the bound's ticks, the ceilings are the ones the finding compared with.
    """

    bound: str  # link, transfer, host, memory, compute, idle
    phase: str | None = None
    gpu: int | None = None
    duration_s: float = 0.0
    bound_s: float = 0.0
    shares: Mapping[str, float] = field(default_factory=dict)
    link_Bps: float | None = None
    link_of_pinned: float | None = None  # link_Bps over the pinned ceiling
    sm_util: float | None = None
    dram_util: float | None = None
    pinned_ceiling_Bps: float | None = None
    pinned_ceiling_source: str | None = None  # e.g. "calibrated 2026-12-02", "default 0.90 x theoretical"
    pageable_ceiling_Bps: float | None = None
    pageable_ceiling_source: str | None = None
    vram_used_bytes: float | None = None
    vram_total_bytes: float | None = None
    transfer_Bps: float | None = None
    transfer_staged: bool = False  # the copies went through pageable memory (staged by the driver)
    # The what-if of pinned host memory for this phase (docs/whatif.md), where the data can price it.
    whatif_pinned: dict[str, Any] | None = None
    # The engine's own counters over this phase (all GPUs), None where it exposes none:
    # share of looked-up prompt tokens found in its prefix cache (their prefill moves nothing) ...
    prefix_cache_hit_rate: float | None = None
    # ... host<->device bytes/s its KV offloading says it moved, and NVML's PCIe RX + TX over the same intervals.
    engine_offload_Bps: float | None = None
    nvml_pcie_Bps: float | None = None
    # Finished requests over the session (pcie_tui.analyze.request_waits), where the engine times them:
    # medians of the client's TTFT and of the engine's own work before each started (slot setup), and the
    # prompt tokens it served from its cache (a cache hit saves a prefill).
    requests_timed: int = 0
    ttft_p50_s: float | None = None
    setup_p50_s: float | None = None
    cached_prompt_tokens: float | None = None
    # What crossed the link in the housekeeping stretches between requests (the engine's own copies:
    # pcie_tui.analyze.between_requests.Copies.to_json), None where the phase had none.
    between_copies: dict[str, Any] | None = None
    # The engine's own counters of its work over this phase, None where it exposes none: requests it
    # preempted, and per direction ("h2d", "d2h") the bytes its KV offloading says it copied, the seconds it
    # says the copies took and their rate (bytes over those seconds; None without the seconds).
    preemptions: float | None = None
    engine_copies: dict[str, dict[str, float | None]] | None = None


@dataclass(frozen=True)
class EngineFacts:
    """What an engine adapter learns from its flags, environment, API and log: where it keeps its
    weights and caches, how it spreads the model, how it loads it, and how it times latencies."""

    kind: str
    # Weights kept in host memory and what put them there, e.g. "FFN weights of 12 layers (--n-cpu-ffn 12)".
    host_weights: str | None = None
    # Whether those host weights sit in pinned (page-locked, CUDA-registered) memory: True, False, or None if unknown.
    host_pinned: bool | None = None
    # Why pinned or not, in the engine's words, e.g. "load mode auto (mmap: pageable)".
    host_memory_why: str | None = None
    kv_on_host: str | None = None  # e.g. "-nkvo: KV cache in host memory"
    ubatch: int | None = None
    tensor_parallel: int | None = None
    # How the weights were loaded, in the engine's terms (llama.cpp ``-lm``: "auto", "mmap", "none"; vLLM
    # and SGLang ``--load-format``); None where the flags do not say.
    load_mode: str | None = None
    # Layers whose weights (all or part) stay in host memory, where the engine says how many (None: unknown).
    host_layers: int | None = None
    layout: Layout = field(default_factory=Layout)
    timing: TimingBasis | None = None  # how its latencies are timed (None: not known)
    flags: dict[str, Any] = field(default_factory=dict)  # the parsed flags, for evidence
    log_evidence: tuple[str, ...] = ()  # load-time log lines that bear on the bus
    log_warnings: tuple[str, ...] = ()  # the engine's load-time warnings, as it wrote them
    runtime: tuple[RuntimeFact, ...] = ()  # what it did at load, each with its source (llama.cpp)

    def fact(self, name: str) -> RuntimeFact | None:
        """The runtime fact of that name, if the engine reads one."""
        return next((f for f in self.runtime if f.name == name), None)

    def to_json(self) -> dict[str, Any]:
        """``report --json``'s ``attribution.engine_facts`` (docs/report-json.md)."""
        return {
            "kind": self.kind,
            "host_weights": self.host_weights,
            "host_pinned": self.host_pinned,
            "host_memory_why": self.host_memory_why,
            "host_layers": self.host_layers,
            "kv_on_host": self.kv_on_host,
            "ubatch": self.ubatch,
            "tensor_parallel": self.tensor_parallel,
            "load_mode": self.load_mode,
            "layout": self.layout.to_json(),
            "timing": self.timing.to_json() if self.timing is not None else None,
            "log_evidence": list(self.log_evidence),
            "log_warnings": list(self.log_warnings),
            "runtime": [f.to_json() for f in self.runtime],
        }


@dataclass(frozen=True)
class Advice:
    """The cause of a finding in the engine's terms and what to change (None when nothing the data supports)."""

    cause: str
    fix: str | None
    evidence: tuple[str, ...] = ()
    # The cause in a few words, for the headline.
    short: str | None = None
    # The change a fix is predicted to make, when the data can price it.
    predicted: dict[str, Any] | None = None

    def to_json(self) -> dict[str, Any]:
        return {
            "cause": self.cause,
            "short": self.short,
            "fix": self.fix,
            "evidence": list(self.evidence),
            "predicted": self.predicted,
        }


# One row of the TUI's ``?`` sources page: (figure, where it comes from, unit, over what span).
SourceRow = tuple[str, str, str, str]


def typed(d: Mapping[str, Any], key: str, typ: type, default: Any) -> Any:
    """``d[key]`` when it is a ``typ`` (recorded facts can be anything), else ``default``."""
    v = d.get(key)
    return v if isinstance(v, typ) and not (typ is int and isinstance(v, bool)) else default


def default_parallelism(layout: Mapping[str, Any]) -> tuple[int, int]:
    """(tp, pp) from a layout's ``tensor_parallel_size`` / ``pipeline_parallel_size`` (1 where absent)."""
    tp, pp = layout.get("tensor_parallel_size"), layout.get("pipeline_parallel_size")
    return (tp if isinstance(tp, int) else 1, pp if isinstance(pp, int) else 1)


class Engine(ABC):
    """One inference engine. Subclasses set the class attributes and implement the abstract methods."""

    name: ClassVar[str]  # the recorded kind, e.g. "vllm"; the registry key
    display: ClassVar[str]  # how people call it, e.g. "vLLM"
    default_port: ClassVar[int]  # where it listens when its command line does not say
    # False: written from the engine's documentation and never run against a real server here.
    tested: ClassVar[bool] = False
    docs: ClassVar[tuple[str, ...]] = ()  # the documentation (URLs or file paths) the module rests on
    # The figure labels of its :meth:`sources` rows that this engine never reports (the row's source says why):
    # the ``?`` page lists them as not collected by this engine, never as waiting for a first reading.
    not_exposed: ClassVar[frozenset[str]] = frozenset()
    # URL paths :func:`pcie_tui.engines.discover.probe_kind` GETs to recognise the engine, in order.
    probe_paths: ClassVar[tuple[str, ...]] = ()
    # True: latencies are exact per-request timings (``extra["requests"]``) instead of histograms.
    per_request_timing: ClassVar[bool] = False
    # How the latency quantiles are computed, for the snapshot's ``quantile_method`` (None: histogram buckets).
    quantile_method: ClassVar[str | None] = None
    # Whether the engine's TTFT counts the time a request waited in its queue (None: unknown or no TTFT).
    ttft_includes_queue: ClassVar[bool | None] = None
    # The parts of a histogram engine's TTFT it times itself, in order (keys of ``extra["hist"]``, each a
    # disjoint interval inside the TTFT's), and what the rest of its TTFT is, in the engine's terms: the
    # report's TTFT decomposition (pcie_tui.analyze.ttft_parts). Empty: the engine's TTFT is not decomposed.
    ttft_parts: ClassVar[tuple[str, ...]] = ()
    ttft_rest: ClassVar[str | None] = None
    # Parts of a request's wait the engine does not time, each with why (the report says them).
    unmeasured_waits: ClassVar[tuple[str, ...]] = ()
    # True: :meth:`live_tokens`, where it answers, counts every token as it is processed (SGLang's
    # realtime counters), so its rate is shown over the request-end counters'; False: both are lower
    # bounds (llama-server's /slots misses short requests) and the larger is shown.
    live_tokens_exact: ClassVar[bool] = False
    # Layout flags ``doctor`` fingerprints: canonical name -> every spelling on the command line.
    layout_flags: ClassVar[Mapping[str, tuple[str, ...]]] = {}
    layout_repeatable: ClassVar[frozenset[str]] = frozenset()  # canonical names whose values accumulate
    # What the layout's "model" path names: "hf" (a directory with config.json) or "gguf" (one GGUF file).
    model_format: ClassVar[str] = "hf"

    # ---- processes ----------------------------------------------------------------

    @abstractmethod
    def classify(self, argv: Sequence[str], proc_name: str) -> Role | None:
        """ "root" for the engine's server process, "child" for a helper process under one, else None."""

    def child_title(self, argv: Sequence[str], proc_name: str) -> str | None:
        """A child's process title worth recording (e.g. a worker's rank), or None."""
        return None

    def parse_layout(self, argv: Sequence[str], environ: Mapping[str, str]) -> dict[str, Any]:
        """Parallel/split/offload settings from the command line (and environment); may hold host and port."""
        return {}

    def version(self, argv: Sequence[str]) -> str | None:
        """The engine's version where it is cheap to know from the process alone, else None."""
        return None

    # ---- URL ----------------------------------------------------------------------

    def recognise(self, path: str, status: int, body: bytes) -> bool:
        """Whether an answer to ``GET path`` (one of :attr:`probe_paths`; body cut at 1 MiB) is this engine's."""
        return False

    # ---- client -------------------------------------------------------------------

    @abstractmethod
    def client(self, url: str, pid: int | None, info: dict[str, Any], log_path: str | None) -> EngineClient:
        """A client for the engine at ``url`` (``info``: discovery facts, see ``EngineCandidate.info``)."""

    # ---- recorded ticks (analysis) --------------------------------------------------

    def live_tokens(self, ticks: Sequence[tuple[float, EngineSample]], what: str) -> tuple[float, float, str] | None:
        """(tokens, seconds, source) of ``what`` ("prompt" or "generation") over ``ticks`` from a source
        better than the token counters (e.g. per-slot counts), or None to use the counters."""
        return None

    def request_latencies(self, requests: Sequence[dict[str, Any]]) -> dict[str, dict[str, float] | None]:
        """p50/p95/p99 per latency key (ttft_s, itl_s, ...) over per-request timings (``per_request_timing``)."""
        return {}

    def timings_unavailable(self, engine_info: dict[str, Any]) -> str | None:
        """Why this attached engine's per-request timings cannot come (from the recording header's
        ``engine`` object), or None when they can or it is not known."""
        return None

    def request_timing(self, request: Mapping[str, Any]) -> RequestTiming | None:
        """One finished request of ``extra["requests"]`` as typed latencies (``per_request_timing``
        engines), or None when it holds none the engine can read."""
        return None

    def timing(self) -> TimingBasis:
        """How this engine's latency figures are timed, for :attr:`EngineFacts.timing`."""
        if self.per_request_timing:
            return TimingBasis("per-request", "exact", self.ttft_includes_queue, self.quantile_method)
        return TimingBasis("histograms", "bucket-interpolated", self.ttft_includes_queue, self.quantile_method)

    def timing_basis(self, n_requests: int, n_client_timed: int | None = None) -> str | None:
        """The report's ``basis`` sentence for per-request timings, or None for histogram engines."""
        return None

    def parallelism(self, layout: Mapping[str, Any], n_gpus: int) -> tuple[int, int]:
        """(tensor-parallel, pipeline-parallel) sizes a recorded layout implies over ``n_gpus`` GPUs."""
        return default_parallelism(layout)

    def weight_stream(self, engine_info: dict[str, Any], shape: Mapping[str, Any]) -> WeightStream | None:
        """The weights this engine, as recorded (``engine_info``: the header's ``engine`` object), keeps in host
        memory and copies to the GPU per prefill micro-batch, priced from ``shape`` (``n_embd``, ``n_ff``,
        ``n_layer``, ``n_head``, ``n_head_kv``, ``n_vocab``, ``dtype``: those known). None: not modelled for
        this engine (the link budget then prices inter-GPU traffic only)."""
        return None

    # ---- outputs --------------------------------------------------------------------

    def sources(self, window: str) -> list[SourceRow]:
        """Rows of the ``?`` sources page for the engine panel; ``window`` names the statistics window."""
        return []

    # ---- attribution ----------------------------------------------------------------

    def facts(self, engine_info: dict[str, Any]) -> EngineFacts:
        """Facts from a recording header's ``engine`` object (command line, layout, load log)."""
        return EngineFacts(kind=self.name, timing=self.timing())

    def advise(self, facts: EngineFacts, finding: FindingFacts) -> list[Advice]:
        """Causes and fixes for one attribution finding, in the engine's own words."""
        return []
