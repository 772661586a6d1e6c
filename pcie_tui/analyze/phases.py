"""Engine phase per tick, and the verdict summarised per phase.

Phases: ``loading`` (the engine process is up but not serving yet, or is
idle while bulk host->device traffic runs), ``prefill`` (prompt-token counter
rising), ``decode`` (generation counter rising), ``mixed`` (both in the same
scrape interval: continuous batching), ``idle`` (answering, nothing moving),
``down`` (not answering).

The counters are read once per scrape (0.5 s by default), so a phase is a
statement about that interval, not about a single engine step.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from pcie_tui.model import EngineSample, GpuInfo, GpuSample

PHASES = ("loading", "prefill", "decode", "mixed", "idle", "down")
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
    # llama-server counts generated tokens only when a request ends, so its counters
    # would call a running decode "prefill"; its /slots say what each slot is doing.
    sp, sd = cur.extra.get("slots_prefill"), cur.extra.get("slots_decode")
    if isinstance(sp, int) and isinstance(sd, int):
        return "mixed" if sp and sd else "prefill" if sp else "decode" if sd else "idle"
    if prev is None:
        return None

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
    phase = counter_phase_ or "idle"
    if phase == "idle" and bulk_rx and not engine.requests_running:
        return "loading"
    return phase


# ---- per-phase verdict summary -------------------------------------------

_BOUND = {"link": "link-bound", "memory": "memory-bound", "compute": "compute-bound", "none": "nothing saturated"}


def fmt_rate(v: float | None) -> str:
    """A rate in bytes/s with a unit that keeps it readable: GB/s, MB/s or kB/s."""
    if v is None:
        return "n/a"
    for scale, unit in ((1e9, "GB/s"), (1e6, "MB/s"), (1e3, "kB/s")):
        if abs(v) >= scale or unit == "kB/s":
            x = v / scale
            return f"{x:.1f} {unit}" if x < 100 else f"{x:.0f} {unit}"
    return f"{v:.0f} B/s"


def phase_line(phase: str, entry: dict[str, Any], link_ceiling_Bps: float | None, dram_basis: str = "DRAM") -> str:
    """One line such as ``prefill: link-bound 84 % of the time (link 45.3 of 63.0 GB/s median), DRAM 5 %``.

    ``entry`` is one value of :meth:`SessionAnalyzer.phase_summary`. The line leads
    with the verdict that held most of the phase; a minority verdict is named after it.
    """
    share = entry.get("verdict_share") or {}
    dom = entry.get("dominant") or "none"
    link_med = (entry.get("link_Bps") or {}).get("median")
    link_util = (entry.get("link_util") or {}).get("median")
    dram = (entry.get("dram_util") or {}).get("median")
    ceiling = f" of {link_ceiling_Bps / 1e9:.1f} GB/s" if link_ceiling_Bps else ""
    link_txt = f"link {fmt_rate(link_med)}{ceiling} median"
    if link_util is not None and not link_ceiling_Bps:
        link_txt += f" ({link_util * 100:.0f} %)"
    dram_txt = f"{dram_basis} {dram * 100:.0f} %" if dram is not None else f"{dram_basis} n/a"
    head = f"{phase}: {_BOUND.get(dom, dom)}"
    if dom != "none":
        head += f" {share.get(dom, 0.0) * 100:.0f} % of the time"
    else:
        head += " most of the time"
    others = [f"{_BOUND[k]} {v * 100:.0f} %" for k, v in share.items() if k not in (dom, "none") and v >= 0.005]
    if others:
        head += " (" + ", ".join(others) + ")"
    ticks = entry.get("ticks", 0)
    return f"{head}; {link_txt}, {dram_txt} median, {ticks} tick{'s' if ticks != 1 else ''}"


def phase_verdicts(analyzer: Any) -> dict[int, dict[str, str]]:
    """Per GPU, per phase: a one-line verdict built from ``SessionAnalyzer.phase_summary``.

    Phases appear in the order loading, prefill, decode, mixed, idle, down,
    then any recording labels.
    """
    from pcie_tui.analyze.verdict import pcie_ceiling_Bps

    out: dict[int, dict[str, str]] = {}
    for index in sorted(analyzer.series):
        summary = analyzer.phase_summary(index)
        info: GpuInfo | None = analyzer.header.gpu(index)
        ceiling, _kind = pcie_ceiling_Bps(info)
        basis = "DRAM busy (proxy)" if analyzer.series[index].memory_proxy else "DRAM"
        order = [p for p in PHASES if p in summary] + sorted(p for p in summary if p not in PHASES)
        out[index] = {p: phase_line(p, summary[p], ceiling, basis) for p in order}
    return out
