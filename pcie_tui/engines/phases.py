"""Engine phase per tick, from the fields of EngineSample every engine fills.

Phases: ``loading`` (the engine process is up but not serving yet, or is
idle while bulk host->device traffic runs), ``prefill`` (prompt-token counter
rising), ``decode`` (generation counter rising), ``mixed`` (both in the same
scrape interval: continuous batching), ``idle`` (answering, nothing moving),
``down`` (not answering).

A tick with a request outstanding is never ``idle``: ``queue`` when requests wait and none is being
processed; ``housekeeping`` when the engine does its own work between requests (``extra``
``busy_with``, from the engine's log: llama-server saving a slot's KV to its host prompt cache or
loading one back before a request starts; or ``own_work``, from the engine's counters between two
scrapes: vLLM preempting a request to recompute it later, or its KV offloading loading blocks a request
waits on); a scrape the engine's loop could not answer (inside a batch) keeps what its log and last
answer say it is doing (``busy_with``: prefill, decode, ...). Requests running on the first scrape
(nothing to compare yet) are not idle either: ``prefill``, as with running requests whose counters did
not move (below).

A ``mixed`` tick is given to what the bus was doing: with bulk host->device traffic (the
engine's GPUs receiving at least ``loading_rx_Bps``) it is ``prefill``, since a batch that
carries prompt tokens is what streams host weights or KV to the GPU (decode steps of the other
requests ride in the same batch and move kB); so a link-saturated prefill among several
requests' decodes is still told as prefill. Without bulk traffic it stays ``mixed``.

The counters are read once per scrape (0.5 s by default), so a phase is a
statement about that interval, not about a single engine step.
"""

from __future__ import annotations

from collections.abc import Sequence

from pcie_tui.core.model import EngineSample, GpuSample

PHASES = ("loading", "queue", "housekeeping", "prefill", "decode", "mixed", "idle", "down")
# Host->device traffic per GPU above which an engine that produces no tokens
# is taken to be loading weights. Idle PCIe reads ~1 MB/s; decode of a fully
# offloaded model moves kB per token; weight uploads run at GB/s.
LOADING_RX_Bps = 1.0e9


def _first_tokens(e: EngineSample) -> float | None:
    """Requests that got their first token so far (the TTFT histogram's count), if the engine says."""
    h = e.extra.get("hist")
    t = h.get("ttft_s") if isinstance(h, dict) else None
    c = t.get("count") if isinstance(t, dict) else None
    return float(c) if isinstance(c, int | float) else None


def counter_phase(prev: EngineSample | None, cur: EngineSample) -> str | None:
    """prefill/decode/mixed/idle from the counter deltas between two answering scrapes.

    The first token of a request is sampled by its prefill step, so generated
    tokens minus first tokens (the TTFT histogram's count delta, where the
    engine exposes it) are the decode tokens: a burst of one-token requests is
    prefill, not mixed. With requests running but no counter moving, the engine
    is inside a long prefill: vLLM counts a prompt when its prefill completes,
    while decode adds tokens every step.
    """
    # An engine that counts generated tokens only when a request ends (its counters would call
    # a running decode "prefill") says per slot what it is doing: slots_prefill / slots_decode.
    sp, sd = cur.extra.get("slots_prefill"), cur.extra.get("slots_decode")
    if isinstance(sp, int) and isinstance(sd, int):
        return "mixed" if sp and sd else "prefill" if sp else "decode" if sd else "idle"
    if prev is None:
        return "prefill" if cur.requests_running else None
    live = live_phase(prev, cur)
    if live is not None:
        return live

    def delta(a: float | None, b: float | None) -> float:
        return b - a if a is not None and b is not None and b > a else 0.0

    p = delta(prev.prompt_tokens_total, cur.prompt_tokens_total) > 0
    decode_tokens = delta(prev.generation_tokens_total, cur.generation_tokens_total)
    f0, f1 = _first_tokens(prev), _first_tokens(cur)
    if f0 is not None and f1 is not None:
        decode_tokens -= delta(f0, f1)
    g = decode_tokens > 0
    if p and g:
        return "mixed"
    if p:
        return "prefill"
    if g:
        return "decode"
    if cur.requests_running:
        return "prefill"
    return "idle"


LIVE_KEYS = ("live_prompt_tokens_total", "live_generation_tokens_total")


def _live(e: EngineSample, key: str) -> float | None:
    v = e.extra.get(key)
    return float(v) if isinstance(v, int | float) and not isinstance(v, bool) else None


def live_phase(prev: EngineSample, cur: EngineSample) -> str | None:
    """prefill/decode/mixed/idle from counters that move as batches run (``extra`` ``LIVE_KEYS``: SGLang's
    ``realtime_tokens_total``, whose decode mode holds no first token), where both scrapes carry them;
    None otherwise. Requests running while neither moved: a prefill batch still in flight (decode
    steps are counted each step, a prefill when its batch runs)."""
    p0, g0 = (_live(prev, k) for k in LIVE_KEYS)
    p1, g1 = (_live(cur, k) for k in LIVE_KEYS)
    if p0 is None or g0 is None or p1 is None or g1 is None:
        return None
    p, g = p1 > p0, g1 > g0
    if p and g:
        return "mixed"
    if p or g:
        return "prefill" if p else "decode"
    return "prefill" if cur.requests_running else "idle"


class PhaseTracker:
    """Keeps the previous answering scrape and classifies each new one."""

    def __init__(self) -> None:
        self.prev: EngineSample | None = None

    def would_reset(self, cur: EngineSample) -> bool:
        """True when a counter went down since the previous scrape: the engine restarted."""
        p = self.prev
        if p is None:
            return False
        for a, b in (
            (p.prompt_tokens_total, cur.prompt_tokens_total),
            (p.generation_tokens_total, cur.generation_tokens_total),
            *((_live(p, k), _live(cur, k)) for k in LIVE_KEYS),
        ):
            if a is not None and b is not None and b < a:
                return True
        return False

    def update(self, cur: EngineSample) -> str | None:
        prev = None if self.would_reset(cur) else self.prev
        phase = counter_phase(prev, cur) if cur.up else None
        if cur.up:
            self.prev = cur
        return phase


def engine_rx_Bps(gpu_samples: Sequence[GpuSample], engine_gpus: Sequence[int] | None) -> float | None:
    """Highest host->device PCIe rate among the engine's GPUs (all GPUs when unknown)."""
    wanted = set(engine_gpus) if engine_gpus else None
    vals = [g.pcie_rx_Bps for g in gpu_samples if g.pcie_rx_Bps is not None and (wanted is None or g.index in wanted)]
    return max(vals) if vals else None


def tick_phase(
    engine: EngineSample,
    counter_phase_: str | None,
    *,
    alive: bool | None,
    served: bool,
    rx_Bps: float | None,
    loading_rx_Bps: float = LOADING_RX_Bps,
) -> str:
    """The phase of one tick from the latest scrape, process liveness and link traffic."""
    bulk_rx = rx_Bps is not None and rx_Bps >= loading_rx_Bps
    if not engine.up:
        if alive is False:
            return "down"
        # Process running (or unknown) and never answered: starting up, unless we
        # cannot see the process and see no upload either.
        if not served and (alive is True or bulk_rx):
            return "loading"
        return "down"
    if engine.extra.get("own_work") and (engine.requests_waiting or engine.requests_running):
        # The engine's own work held requests up in this scrape's interval and no token was counted meanwhile
        # (an engine sets own_work only then: where tokens moved, the batch made progress).
        return "housekeeping"
    phase = counter_phase_ or "idle"
    busy_with = engine.extra.get("busy_with")
    if busy_with in PHASES and (phase == "idle" or busy_with == "housekeeping"):
        # The log's word for a loop that did not answer. Its counters could not be read, so the counter phase
        # of such a scrape is at most "running, nothing moved" (prefill): the log knows a slot in its setup.
        return str(busy_with)
    if phase == "idle" and engine.requests_waiting:
        return "queue"
    if phase == "idle" and bulk_rx and not engine.requests_running:
        return "loading"
    if phase == "mixed" and bulk_rx:
        return "prefill"
    return phase
