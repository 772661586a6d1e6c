"""What held each phase back: attribution beyond saturation.

The saturation verdict (:mod:`pcie_tui.analyze.verdict`) says when a resource is full. A GPU
can also wait on a resource that is *not* full: copies out of pageable host memory run at a
sixth of the link's pinned rate while the GPU idles, and CPU-resident layers leave both the GPU
and the bus quiet while requests are in flight. Each tick of each GPU gets one of:

``link``      the link is saturated (the saturation verdict, unchanged);
``memory``    DRAM bandwidth is saturated, or the GPU is busy and DRAM is the busier side;
``compute``   SM is saturated, or the GPU is busy and SM is the busier side;
``transfer``  transfer-bound below link capacity: the GPU is idle while host<->GPU traffic runs
              near a lower ceiling than the link's (pageable copies, staging, small transfers);
``host``      host-bound: the GPU is idle and the bus quiet while requests are in flight
              (CPU layers, CPU attention, tokenizer, Python);
``idle``      nothing in flight (or no engine and nothing moving).

The ceilings each verdict is compared with are the calibrated ones where ``pcie-tui calibrate``
ran (pinned and pageable), else documented defaults, and every finding says which. Thresholds
and their reasoning: docs/attribution.md.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from pcie_tui.analyze.result import Finding
from pcie_tui.analyze.series import median_weighted, series_array, series_counts, series_means, series_weights
from pcie_tui.analyze.session import SessionAnalyzer
from pcie_tui.analyze.verdict import GPU_BUSY_DRAM, GPU_BUSY_SM, MISS_WORDS, VERDICTS
from pcie_tui.core.ceiling import Ceiling, DEFAULT_PAGEABLE_Bps, pageable_ceiling, pinned_ceiling
from pcie_tui.core.model import GpuInfo, SessionHeader
from pcie_tui.core.vocab import BOUND_SHORT as BOUND_SHORT
from pcie_tui.core.vocab import BOUND_WORDS as BOUND_WORDS
from pcie_tui.core.vocab import TICK_BOUNDS
from pcie_tui.engines import EngineFacts

# The per-tick bound codes (index = code) and their words: the one table, pcie_tui.core.vocab.
BOUNDS = TICK_BOUNDS
# The GPU counts as busy at verdict.GPU_BUSY_SM / GPU_BUSY_DRAM (GPM SM_UTIL / DRAM_BW_UTIL); batch-1
# decode of a fully offloaded model reads SM ~0.8, DRAM ~0.5 on the H200, a CPU-bound phase SM < 0.05.
# Traffic that makes a GPU-idle tick transfer-bound: a share of the ceiling of the host memory
# the engine really uses (pinned when its facts say so, else pageable), and never below 1 GB/s.
TRANSFER_OF_PAGEABLE = 0.35
TRANSFER_OF_PINNED = 0.25
TRANSFER_MIN_Bps = 1.0e9
QUIET_PHASES = (None, "idle", "down")
# A phase with fewer ticks than this has no bound: "too short to judge" (a one-tick phase is one reading).
MIN_TICKS_TO_JUDGE = 3


@dataclass(frozen=True)
class Ceilings:
    """A GPU's link ceilings for pinned and pageable copies (:mod:`pcie_tui.core.ceiling`), as a finding names them."""

    pinned: Ceiling
    pageable: Ceiling

    @property
    def theoretical_Bps(self) -> float | None:
        return self.pinned.theoretical_Bps

    @property
    def pinned_Bps(self) -> float | None:
        return self.pinned.Bps

    @property
    def pinned_source(self) -> str:
        return self.pinned.detail

    @property
    def pageable_Bps(self) -> float | None:
        return self.pageable.Bps

    @property
    def pageable_source(self) -> str:
        return self.pageable.detail

    def to_json(self) -> dict[str, Any]:
        return {
            "theoretical_Bps": self.theoretical_Bps,
            "pinned_Bps": self.pinned_Bps,
            "pinned_source": self.pinned_source,
            "pinned_basis": self.pinned.source,
            "pageable_Bps": self.pageable_Bps,
            "pageable_source": self.pageable_source,
            "pageable_basis": self.pageable.source,
        }


def ceilings(info: GpuInfo | None, observed_Bps: float | None = None) -> Ceilings:
    """The link's pinned and pageable ceilings (counter readings, per direction) and where they came
    from; ``observed_Bps``: the GPU's highest PCIe reading, which takes over above the pinned one."""
    pinned = pinned_ceiling(info, observed_Bps=observed_Bps)
    return Ceilings(pinned, pageable_ceiling(info, pinned))


# Copies faster than this share over the pageable ceiling are not staged through pageable memory (the
# driver's staging caps them near it: 6.8-8.9 GB/s on the H200); with no engine fact, the pattern decides.
PAGEABLE_PATTERN = 1.5


def staged_by_pattern(transfer_Bps: float | None, c: Ceilings) -> bool:
    """Whether transfer-bound copies of unknown host memory look staged (pageable): at or below what pageable
    copies reach (:data:`PAGEABLE_PATTERN` x the pageable ceiling); no rate: assume staged (held by the host)."""
    if transfer_Bps is None or not c.pageable_Bps:
        return True
    return transfer_Bps <= PAGEABLE_PATTERN * c.pageable_Bps


def transfer_floor_Bps(c: Ceilings, facts: EngineFacts | None) -> float:
    """Host<->GPU rate above which a GPU-idle tick is transfer-bound."""
    return _transfer_floor(c, pinned=facts is not None and facts.host_pinned is True)


def transfer_floors_Bps(c: Ceilings) -> tuple[float, ...]:
    """Every rate :func:`transfer_floor_Bps` may cut at with these ceilings, whatever the engine's facts say."""
    return tuple(sorted({_transfer_floor(c, pinned=False), _transfer_floor(c, pinned=True)}))


def _transfer_floor(c: Ceilings, pinned: bool) -> float:
    if pinned and c.pinned_Bps:
        return max(TRANSFER_MIN_Bps, TRANSFER_OF_PINNED * c.pinned_Bps)
    return max(TRANSFER_MIN_Bps, TRANSFER_OF_PAGEABLE * (c.pageable_Bps or DEFAULT_PAGEABLE_Bps))


def gpu_ceilings(analyzer: SessionAnalyzer, index: int) -> Ceilings:
    """GPU ``index``'s ceilings with the highest PCIe reading the analyzer has seen so far."""
    tr = analyzer.trackers.get(index)
    return ceilings(analyzer.header.gpu(index), tr.observed_Bps if tr is not None else None)


def tick_bounds(analyzer: SessionAnalyzer, index: int, facts: EngineFacts | None = None) -> np.ndarray:
    """Per tick of one GPU, an index into :data:`BOUNDS`."""
    ser = analyzer.series.get(index)
    if ser is None or not ser.t:
        return np.zeros(0, dtype=np.int64)
    sat = analyzer._label_codes(index, ser.t)  # indices into VERDICTS
    rate = np.nan_to_num(series_array(ser, "link_Bps"))
    sm = np.nan_to_num(series_array(ser, "compute"))
    dram = series_array(ser, "memory")
    dram = np.where(np.isnan(dram), 0.0, dram) if not ser.memory_proxy else np.zeros(dram.size)
    busy_phase = ser.phase.mapped(lambda p: p not in QUIET_PHASES, bool)
    floor = transfer_floor_Bps(gpu_ceilings(analyzer, index), facts)
    return bound_codes(sat, rate, sm, dram, busy_phase, floor, series_array(ser, "missing"))


_SAT = {v: i for i, v in enumerate(VERDICTS)}  # the codes of SessionAnalyzer._label_codes


def bound_codes(
    sat: np.ndarray,
    rate: np.ndarray,
    sm: np.ndarray,
    dram: np.ndarray,
    busy_phase: np.ndarray,
    floor: float,
    missing: np.ndarray | None = None,
) -> np.ndarray:
    """The one rule of what bound a tick, for any number of ticks: an index into :data:`BOUNDS`.

    ``sat``: saturation verdict codes (indices into VERDICTS); ``rate`` link bytes/s,
    ``sm`` and ``dram`` use 0..1 (missing = 0; a DRAM proxy = 0); ``busy_phase`` whether the tick's
    phase is work; ``missing``: the counters each tick lacks (verdict.MISS_* bits, NaN = none known).
    A tick of work that lacks a counter the rule needs (either PCIe direction, SM, or GPM DRAM) is
    ``unknown``, unless a counter it has shows a resource saturated. The report (:func:`tick_bounds`)
    and the live answer (:func:`classify`) both ask it.
    """
    gpu_busy = (sm >= GPU_BUSY_SM) | (dram >= GPU_BUSY_DRAM)
    # Below saturation, DRAM streaming at 40 % or more of peak is what a busy GPU waits on (batch-1
    # decode streams every weight per token); else its SMs.
    mem_side = dram >= GPU_BUSY_DRAM
    out = np.where(busy_phase, BOUNDS.index("host"), BOUNDS.index("idle")).astype(np.int64)
    out[rate >= floor] = BOUNDS.index("transfer")
    out[gpu_busy & mem_side] = BOUNDS.index("memory")
    out[gpu_busy & ~mem_side] = BOUNDS.index("compute")
    if missing is not None and missing.size:
        out[busy_phase & (np.nan_to_num(missing) > 0)] = BOUNDS.index("unknown")
    out[sat == _SAT["compute"]] = BOUNDS.index("compute")
    out[sat == _SAT["memory"]] = BOUNDS.index("memory")
    out[sat == _SAT["link"]] = BOUNDS.index("link")
    return out


def missing_words(missing: np.ndarray, weights: np.ndarray) -> str | None:
    """Why ticks were unknown, in words: each counter they lacked with the share of them that lacked it."""
    bits = np.nan_to_num(missing).astype(np.int64)
    total = float(weights.sum())
    if total <= 0 or not bits.any():
        return None
    parts = []
    for bit, words in MISS_WORDS.items():
        share = float(weights[(bits & bit) > 0].sum()) / total
        if share > 0:
            parts.append(words + ("" if share > 0.995 else f" on {share:.0%} of them"))
    return ", ".join(parts)


# Phases the "pinned instead of pageable" what-if does not price. Loading: pinned host weights
# (llama.cpp -lm none) are read() into CUDA host buffers instead of mapped, and on the H200 every
# recorded pair loaded slower pinned than pageable (1.2 -> 1.7 s, MoE 0.7 -> 3.5 s, a rerun 1.4 ->
# 1.7 s), so a faster copy of the load's uploads is not what -lm none buys there.
UNPRICED_PINNED = frozenset({"loading"})
# The rate an engine's own pinned copies reach, as a share of the calibrated pinned ceiling (a
# 256 MiB cudaMemcpy): llama.cpp's uploads of host weights on the H200 ran at 79-84 % of it in all
# four pinned sessions (h200-pinned 50.1 and 50.4 of 60.0-60.2 GB/s, h200-moe-pinned 40-47.6 GB/s).
# The no-overlap end of the pinned what-if uses it; the at-best end keeps the ceiling itself.
ENGINE_COPY_SHARE = 0.80


def pinned_whatif(phase_s: float, rest_s: float, moved_bytes: float, c: Ceilings) -> dict[str, Any]:
    """The phase with its transfer-bound bytes moved from pinned memory. At best the copies run at
    the pinned ceiling and the rest of the phase hides them (the longer of the two); at worst they
    run at the share of it an engine's own copies reached (:data:`ENGINE_COPY_SHARE`) and nothing
    hides them (their sum)."""
    copy_s = moved_bytes / c.pinned_Bps if c.pinned_Bps else 0.0
    best, worst = max(rest_s, copy_s), rest_s + copy_s / ENGINE_COPY_SHARE
    return {
        "phase_s": phase_s,
        "phase_s_at_best": best,
        "phase_s_no_overlap": worst,
        "speedup_at_most": phase_s / best if best > 0 else None,
        "basis": f"bytes moved while transfer-bound: at best at the {c.pinned_source} ceiling and hidden behind "
        f"the rest of the phase; at worst at {ENGINE_COPY_SHARE:.0%} of it (what llama.cpp's own pinned copies "
        "reached on the H200) and not hidden",
    }


def phase_findings(
    header: SessionHeader, analyzer: SessionAnalyzer, facts: EngineFacts | None = None
) -> dict[int, list[Finding]]:
    """Per GPU, one finding per phase: the bound that held most of it, shares, evidence and ceilings.

    The rates and use are the median of the bound's ticks. Phases in order of first appearance
    (ticks without a phase are "unlabelled").
    """
    out: dict[int, list[Finding]] = {}
    for index in sorted(analyzer.series):
        ser = analyzer.series[index]
        if ser.t:
            out[index] = _gpu_findings(header, analyzer, index, facts)
    return out


def _gpu_findings(
    header: SessionHeader, analyzer: SessionAnalyzer, index: int, facts: EngineFacts | None
) -> list[Finding]:
    ser = analyzer.series[index]
    info = header.gpu(index)
    c = gpu_ceilings(analyzer, index)
    codes = tick_bounds(analyzer, index, facts)
    w = series_weights(ser)
    cols = {k: series_array(ser, k) for k in ("link_Bps", "compute", "memory", "mem_used", "missing")}
    cols["link_Bps_mean"] = series_means(ser, "link_Bps")
    counts = series_counts(ser)  # None: every row one tick
    names = list(dict.fromkeys(p if p is not None else "unlabelled" for p in ser.phase.distinct()))
    pcode = ser.phase.mapped(lambda p: names.index(p if p is not None else "unlabelled"), np.int64)
    vram_total = float(info.memory_total_bytes) if info and info.memory_total_bytes else None
    # Pageable (staged by the driver) where the engine's facts say so; pinned where they say so; unknown:
    # by the copies' own pattern (a stream faster than pageable copies reach is not staged).
    staged = None if facts is None or facts.host_pinned is None else facts.host_pinned is False
    work = "engine" if header.engine else "label"
    found = []
    by_bound = [codes == i for i in range(len(BOUNDS))]  # each bound's ticks, once for every phase
    for k, phase in enumerate(names):
        m = pcode == k
        f = _finding(index, phase, m, by_bound, (w, counts), cols, c, staged)
        f.dram_basis = "proxy" if ser.memory_proxy else "gpm"
        f.work_basis = work
        f.vram_total_bytes = vram_total
        found.append(f)
    return found


def _sel(counts: np.ndarray | None, m: np.ndarray) -> np.ndarray | None:
    """The tick counts of rows ``m`` (None: every row one tick)."""
    return counts[m] if counts is not None else None


def _finding(
    index: int,
    phase: str,
    m: np.ndarray,
    by_bound: list[np.ndarray],
    weights: tuple[np.ndarray, np.ndarray | None],
    cols: dict[str, np.ndarray],
    c: Ceilings,
    staged: bool | None,
) -> Finding:
    """One phase's finding (``m``: its ticks) from the ticks of each bound (``by_bound[i]``: BOUNDS[i]) and readings;
    ``weights``: the seconds each row stands for, and how many ticks (None: one each; see analyze/retire.py)."""
    w, counts = weights
    dur = float(w[m].sum())
    secs = {b: float(w[m & by_bound[i]].sum()) for i, b in enumerate(BOUNDS)}
    bound = max(secs, key=secs.__getitem__)
    bm = m & by_bound[BOUNDS.index(bound)]
    rate = cols["link_Bps"]
    link_Bps = median_weighted(rate[bm], _sel(counts, bm))
    used = cols["mem_used"][m]
    tm = m & by_bound[BOUNDS.index("transfer")]
    transfer_Bps = link_Bps if bound == "transfer" else median_weighted(rate[tm], _sel(counts, tm))
    if staged is None:
        staged = staged_by_pattern(transfer_Bps, c)
    f = Finding(
        gpu=index,
        phase=phase,
        duration_s=dur,
        ticks=int(m.sum()) if counts is None else int(np.rint(counts[m].sum())),
        bound=bound,
        bound_s=secs[bound],
        shares={b: (s / dur if dur > 0 else 0.0) for b, s in secs.items()},
        link_Bps=link_Bps,
        link_of_pinned=(link_Bps / c.pinned_Bps) if link_Bps is not None and c.pinned_Bps else None,
        sm_util=median_weighted(cols["compute"][bm], _sel(counts, bm)),
        dram_util=median_weighted(cols["memory"][bm], _sel(counts, bm)),
        dram_basis="gpm",
        work_basis="engine",
        ceilings=c,
        vram_used_bytes=float(np.nanmax(used)) if np.any(~np.isnan(used)) else None,
        vram_total_bytes=None,
        transfer_s=secs["transfer"],
        transfer_Bps=transfer_Bps,
        transfer_staged=staged,
    )
    um = m & by_bound[BOUNDS.index("unknown")]
    if um.any():
        f.unknown_why = missing_words(cols["missing"][um], w[um])
    if f.ticks < MIN_TICKS_TO_JUDGE and bound not in ("idle", "unknown"):
        # A phase of a tick or two: a reading, not a finding (its shares stay in the JSON).
        f.bound, f.bound_s, f.too_short = "unknown", dur, True
        f.unknown_why = f"too short to judge: {f.ticks} tick{'s' if f.ticks != 1 else ''} ({dur:.1f} s)"
        return f
    if bound == "transfer" and c.pinned_Bps and staged and phase not in UNPRICED_PINNED:
        # bytes the transfer-bound ticks moved (counter; a summarised row: its ticks' mean rate)
        moved = float(np.nansum(cols["link_Bps_mean"][bm] * w[bm]))
        f.whatif_pinned = pinned_whatif(dur, dur - secs[bound], moved, c)
    return f
