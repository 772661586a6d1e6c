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

from pcie_tui.analyze.series import _series_array, tick_weights
from pcie_tui.analyze.session import SessionAnalyzer
from pcie_tui.analyze.verdict import VERDICTS
from pcie_tui.engines import EngineFacts
from pcie_tui.model import GpuInfo, SessionHeader

BOUNDS = ("link", "transfer", "host", "memory", "compute", "idle")
BOUND_WORDS = {
    "link": "link-saturated",
    "transfer": "transfer-bound below link capacity",
    "host": "host-bound",
    "memory": "memory-bound",
    "compute": "compute-bound",
    "idle": "idle",
}
# Short words for one screen row or table cell; the report and docs/attribution.md say them in full.
BOUND_SHORT = {**BOUND_WORDS, "transfer": "transfer-bound"}
# Counter reading at saturation as a share of the theoretical rate, when uncalibrated
# (H200 Gen5 x16: 56.7-59.4 of 63.0 GB/s, docs/whatif.md).
DEFAULT_PINNED_FRACTION = 0.90
# Pageable host->device copies on the project's H200 (pcie-tui calibrate, 2026-12-03: counter
# 6.8 GB/s, payload 6.1 GB/s). Staged copies are held by host memcpy more than by the link, so
# this is a fair guess on other machines too; calibrate to know.
DEFAULT_PAGEABLE_Bps = 6.8e9
# The GPU counts as busy at these (GPM SM_UTIL / DRAM_BW_UTIL); batch-1 decode of a fully
# offloaded model reads SM ~0.8, DRAM ~0.5 on the H200, a CPU-bound phase SM < 0.05.
GPU_BUSY_SM = 0.50
GPU_BUSY_DRAM = 0.40
# Traffic that makes a GPU-idle tick transfer-bound: a share of the ceiling of the host memory
# the engine really uses (pinned when its facts say so, else pageable), and never below 1 GB/s.
TRANSFER_OF_PAGEABLE = 0.35
TRANSFER_OF_PINNED = 0.25
TRANSFER_MIN_Bps = 1.0e9
QUIET_PHASES = (None, "idle", "down")


@dataclass(frozen=True)
class Ceilings:
    theoretical_Bps: float | None
    pinned_Bps: float | None
    pinned_source: str
    pageable_Bps: float | None
    pageable_source: str

    def to_json(self) -> dict[str, Any]:
        return {
            "theoretical_Bps": self.theoretical_Bps,
            "pinned_Bps": self.pinned_Bps,
            "pinned_source": self.pinned_source,
            "pageable_Bps": self.pageable_Bps,
            "pageable_source": self.pageable_source,
        }


def ceilings(info: GpuInfo | None) -> Ceilings:
    """The link's pinned and pageable ceilings (counter readings, per direction) and where they came from."""
    link = info.link if info is not None else None
    theo = (link.capacity_Bps or link.max_capacity_Bps) if link is not None else None
    gen_w = f"Gen{link.gen} x{link.width}" if link is not None and link.gen else "the link"
    if link is not None and link.measured_Bps:
        pinned, psrc = link.measured_Bps, "calibrated pinned"
    elif theo:
        pinned, psrc = theo * DEFAULT_PINNED_FRACTION, f"default: {DEFAULT_PINNED_FRACTION:.2f} x theoretical {gen_w}"
    else:
        pinned, psrc = None, "unknown link"
    if link is not None and link.measured_pageable_Bps:
        pageable, gsrc = link.measured_pageable_Bps, "calibrated pageable"
    else:
        pageable = min(DEFAULT_PAGEABLE_Bps, pinned) if pinned else DEFAULT_PAGEABLE_Bps
        gsrc = "default: pageable copies on the project's H200 (run pcie-tui calibrate)"
    return Ceilings(theo, pinned, psrc, pageable, gsrc)


def transfer_floor_Bps(c: Ceilings, facts: EngineFacts | None) -> float:
    """Host<->GPU rate above which a GPU-idle tick is transfer-bound."""
    if facts is not None and facts.host_pinned is True and c.pinned_Bps:
        return max(TRANSFER_MIN_Bps, TRANSFER_OF_PINNED * c.pinned_Bps)
    return max(TRANSFER_MIN_Bps, TRANSFER_OF_PAGEABLE * (c.pageable_Bps or DEFAULT_PAGEABLE_Bps))


def tick_bounds(analyzer: SessionAnalyzer, index: int, facts: EngineFacts | None = None) -> np.ndarray:
    """Per tick of one GPU, an index into :data:`BOUNDS`."""
    ser = analyzer.series.get(index)
    if ser is None or not ser.t:
        return np.zeros(0, dtype=np.int64)
    sat = analyzer._label_codes(index, ser.t)  # indices into VERDICTS
    rate = np.nan_to_num(_series_array(ser, "link_Bps"))
    sm = np.nan_to_num(_series_array(ser, "compute"))
    dram = _series_array(ser, "memory")
    dram = np.where(np.isnan(dram), 0.0, dram) if not ser.memory_proxy else np.zeros(dram.size)
    busy = {p: p not in QUIET_PHASES for p in dict.fromkeys(ser.phase)}
    busy_phase = np.fromiter(map(busy.__getitem__, ser.phase), dtype=bool, count=len(ser.phase))
    floor = transfer_floor_Bps(ceilings(analyzer.header.gpu(index)), facts)
    return bound_codes(sat, rate, sm, dram, busy_phase, floor)


_SAT = {v: i for i, v in enumerate(VERDICTS)}  # the codes of SessionAnalyzer._label_codes


def bound_codes(
    sat: np.ndarray, rate: np.ndarray, sm: np.ndarray, dram: np.ndarray, busy_phase: np.ndarray, floor: float
) -> np.ndarray:
    """The one rule of what bound a tick, for any number of ticks: an index into :data:`BOUNDS`.

    ``sat``: saturation verdict codes (indices into VERDICTS); ``rate`` link bytes/s,
    ``sm`` and ``dram`` use 0..1 (missing = 0; a DRAM proxy = 0); ``busy_phase`` whether the tick's
    phase is work. The report (:func:`tick_bounds`) and the live answer (:func:`classify`) both ask it.
    """
    gpu_busy = (sm >= GPU_BUSY_SM) | (dram >= GPU_BUSY_DRAM)
    # Below saturation, DRAM streaming at 40 % or more of peak is what a busy GPU waits on (batch-1
    # decode streams every weight per token); else its SMs.
    mem_side = dram >= GPU_BUSY_DRAM
    out = np.where(busy_phase, BOUNDS.index("host"), BOUNDS.index("idle")).astype(np.int64)
    out[rate >= floor] = BOUNDS.index("transfer")
    out[gpu_busy & mem_side] = BOUNDS.index("memory")
    out[gpu_busy & ~mem_side] = BOUNDS.index("compute")
    out[sat == _SAT["compute"]] = BOUNDS.index("compute")
    out[sat == _SAT["memory"]] = BOUNDS.index("memory")
    out[sat == _SAT["link"]] = BOUNDS.index("link")
    return out


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


def _median(a: np.ndarray) -> float | None:
    a = a[~np.isnan(a)]
    return float(np.median(a)) if a.size else None


def phase_findings(
    header: SessionHeader, analyzer: SessionAnalyzer, facts: EngineFacts | None = None
) -> dict[int, list[dict[str, Any]]]:
    """Per GPU, one finding per phase: the bound that held most of it, shares, evidence and ceilings."""
    out: dict[int, list[dict[str, Any]]] = {}
    for index in sorted(analyzer.series):
        ser = analyzer.series[index]
        if not ser.t:
            continue
        info = header.gpu(index)
        c = ceilings(info)
        codes = tick_bounds(analyzer, index, facts)
        t = np.asarray(ser.t, dtype=np.float64)
        w = tick_weights(t)
        rate = _series_array(ser, "link_Bps")
        sm, dram = _series_array(ser, "compute"), _series_array(ser, "memory")
        used = _series_array(ser, "mem_used")
        # Phases as codes in order of first appearance (None counts as "unlabelled").
        names = list(dict.fromkeys(p if p is not None else "unlabelled" for p in dict.fromkeys(ser.phase)))
        code = {p: names.index(p if p is not None else "unlabelled") for p in dict.fromkeys(ser.phase)}
        pcode = np.fromiter(map(code.__getitem__, ser.phase), dtype=np.int64, count=len(ser.phase))
        found = []
        for k, phase in enumerate(names):
            m = pcode == k
            dur = float(w[m].sum())
            secs = {b: float(w[m & (codes == i)].sum()) for i, b in enumerate(BOUNDS)}
            bound = max(secs, key=secs.__getitem__)
            bm = m & (codes == BOUNDS.index(bound))
            link_Bps = _median(rate[bm])
            f: dict[str, Any] = {
                "gpu": index,
                "phase": phase,
                "duration_s": dur,
                "bound": bound,
                "bound_s": secs[bound],
                "shares": {b: (s / dur if dur > 0 else 0.0) for b, s in secs.items()},
                "link_Bps": link_Bps,
                "link_of_pinned": (link_Bps / c.pinned_Bps) if link_Bps is not None and c.pinned_Bps else None,
                "sm_util": _median(sm[bm]),
                "dram_util": _median(dram[bm]),
                "dram_basis": "proxy" if ser.memory_proxy else "gpm",
                "work_basis": "engine" if header.engine else "label",
                "ceilings": c.to_json(),
                "vram_used_bytes": float(np.nanmax(used[m])) if np.any(~np.isnan(used[m])) else None,
                "vram_total_bytes": float(info.memory_total_bytes) if info and info.memory_total_bytes else None,
            }
            tm = m & (codes == BOUNDS.index("transfer"))
            f["transfer_s"] = secs["transfer"]
            f["transfer_Bps"] = _median(rate[tm])
            # Staged (pageable or unknown) copies are held by the host, not by the link's speed.
            f["transfer_staged"] = facts is None or facts.host_pinned is not True
            if bound == "transfer" and c.pinned_Bps and f["transfer_staged"] and phase not in UNPRICED_PINNED:
                moved = float(np.nansum(rate[bm] * w[bm]))  # bytes the transfer-bound ticks moved (counter)
                f["whatif_pinned"] = pinned_whatif(dur, dur - secs[bound], moved, c)
            found.append(f)
        out[index] = found
    return out


def classify(sat: str, u: Any, busy_phase: bool, floor_Bps: float, th: Any) -> str:
    """One tick's bound from its saturation verdict and utilisation (:func:`bound_codes` on one tick)."""
    code = bound_codes(
        np.array([_SAT.get(sat, _SAT["none"])]),
        np.array([u.link_Bps or 0.0]),
        np.array([u.compute or 0.0]),
        np.array([0.0 if u.memory_proxy or u.memory is None else u.memory]),
        np.array([busy_phase]),
        floor_Bps,
    )
    return BOUNDS[int(code[0])]


class LiveAttribution:
    """:func:`phase_findings` kept tick by tick, for the live and replay headline (no series kept).

    Per GPU and phase: seconds in each bound and running sums of the evidence of each bound
    (rates and use are means here, medians in the report).
    """

    def __init__(self, header: SessionHeader, facts: EngineFacts | None, thresholds: Any) -> None:
        self.header, self.facts, self.th = header, facts, thresholds
        self._ceil: dict[int, Ceilings] = {}
        self._floor: dict[int, float] = {}
        self._last_t: dict[int, float] = {}
        # (gpu, phase) -> {"secs": {bound: s}, "sums": {bound: [n, rate, sm, dram]}, "vram": max}
        self.acc: dict[tuple[int, str], dict[str, Any]] = {}

    def set_facts(self, facts: EngineFacts | None) -> None:
        """Facts that arrived later (the engine finished loading): the floors follow them from now on."""
        self.facts = facts
        for index, c in self._ceil.items():
            self._floor[index] = transfer_floor_Bps(c, facts)

    def feed(self, t: float, index: int, sat: str, u: Any, phase: str | None, mem_used: float | None) -> str:
        if index not in self._ceil:
            self._ceil[index] = c = ceilings(self.header.gpu(index))
            self._floor[index] = transfer_floor_Bps(c, self.facts)
        prev = self._last_t.get(index)
        self._last_t[index] = t
        iv = self.header.interval_s or 0.1
        dt = iv if prev is None or not 0 < t - prev <= 5 * iv else t - prev
        b = classify(sat, u, phase not in QUIET_PHASES, self._floor[index], self.th)
        a = self.acc.setdefault(
            (index, phase or "unlabelled"), {"secs": dict.fromkeys(BOUNDS, 0.0), "sums": {}, "vram": None}
        )
        a["secs"][b] += dt
        s = a["sums"].setdefault(b, [0, 0.0, 0.0, 0.0, 0, 0, 0])
        for k, v in ((1, u.link_Bps), (2, u.compute), (3, None if u.memory_proxy else u.memory)):
            if v is not None:
                s[k] += v
                s[k + 3] += 1
        s[0] += 1
        if mem_used is not None:
            a["vram"] = max(a["vram"] or 0.0, float(mem_used))
        return b

    def finding(self, index: int, phase: str) -> dict[str, Any] | None:
        a = self.acc.get((index, phase))
        if a is None:
            return None
        c = self._ceil[index]
        dur = sum(a["secs"].values())
        bound = max(a["secs"], key=a["secs"].__getitem__)
        s = a["sums"].get(bound, [0, 0.0, 0.0, 0.0, 0, 0, 0])

        def mean(k: int) -> float | None:
            return s[k] / s[k + 3] if s[k + 3] else None

        info = self.header.gpu(index)
        rate = mean(1)
        extra: dict[str, Any] = {}
        staged = self.facts is None or self.facts.host_pinned is not True
        if bound == "transfer" and rate and c.pinned_Bps and staged and phase not in UNPRICED_PINNED:
            extra["whatif_pinned"] = pinned_whatif(dur, dur - a["secs"][bound], rate * a["secs"][bound], c)
        return extra | {
            "gpu": index,
            "phase": phase,
            "duration_s": dur,
            "bound": bound,
            "bound_s": a["secs"][bound],
            "shares": {b: (v / dur if dur > 0 else 0.0) for b, v in a["secs"].items()},
            "link_Bps": rate,
            "link_of_pinned": rate / c.pinned_Bps if rate is not None and c.pinned_Bps else None,
            "sm_util": mean(2),
            "dram_util": mean(3),
            "dram_basis": "gpm",
            "work_basis": "engine" if self.header.engine else "label",
            "stat": "mean",
            "ceilings": c.to_json(),
            "vram_used_bytes": a["vram"],
            "vram_total_bytes": float(info.memory_total_bytes) if info and info.memory_total_bytes else None,
        }

    def findings(self) -> dict[int, list[dict[str, Any]]]:
        out: dict[int, list[dict[str, Any]]] = {}
        for index, phase in self.acc:
            f = self.finding(index, phase)
            if f is not None:
                out.setdefault(index, []).append(f)
        return out
