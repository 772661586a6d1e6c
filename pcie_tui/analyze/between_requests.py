"""The engine's own copies between requests: what crossed the link while requests waited on its housekeeping.

llama-server's host prompt cache saves a slot's KV state from the GPU into host memory (and loads a cached
one back) between a slot being given a request and the request starting: the ticks the engine's phase
calls ``housekeeping`` (:mod:`pcie_tui.engines.phases`). Here each stretch of such ticks is integrated
per direction (NVML's PCIe TX leaves the GPU: GPU->host; RX: host->GPU; rate x interval, every GPU),
and the copy's rate is taken over the ticks that carried it.

A reading covers the interval before its tick (GPM averages between two samples), while the phase is the
engine's state at the tick, so a copy that ends as the request starts shows in the next one or two ticks
of the next phase: a stretch's copy runs on into those ticks while the same direction still dominates
(at least :data:`SPILL_MIN_Bps` and :data:`SPILL_DOMINANCE` times the other direction), for at most
:data:`SPILL_MAX_S`. Pure bookkeeping over the analyzer's chunks; no I/O.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import numpy as np

from pcie_tui.analyze.columns import COL, Chunk
from pcie_tui.analyze.quantiles import quantile

PHASE = "housekeeping"
COPY_MIN_Bps = 0.5e9  # a tick moving at least this much in one direction is a copy tick (idle: kB/s)
SPILL_MIN_Bps = 1e9
SPILL_DOMINANCE = 4.0
SPILL_MAX_S = 0.5
MAX_DT_S = 1.0  # a longer hole between ticks is not integrated (the recording has a gap there)
DIRS = ("d2h", "h2d")


@dataclass(frozen=True)
class Copies:
    """Stretches of housekeeping and what crossed the link in them (bytes None: no PCIe reading at all)."""

    stretches: int = 0
    seconds: float = 0.0  # time in housekeeping ticks
    d2h_bytes: float | None = None
    h2d_bytes: float | None = None
    copy_s: dict[str, float] | None = None  # per direction: seconds of ticks carrying a copy
    rate_p50_Bps: dict[str, float] | None = None  # per direction: median rate over those ticks
    spill_s: float = 0.0  # seconds of next-phase ticks counted as the copy's tail

    def per_stretch(self, direction: str) -> float | None:
        b = self.d2h_bytes if direction == "d2h" else self.h2d_bytes
        return b / self.stretches if b is not None and self.stretches else None

    def to_json(self) -> dict[str, Any]:
        return {
            "stretches": self.stretches,
            "seconds": self.seconds,
            "bytes": {"d2h": self.d2h_bytes, "h2d": self.h2d_bytes},
            "bytes_per_stretch": {d: self.per_stretch(d) for d in DIRS},
            "copy_s": self.copy_s,
            "rate_p50_Bps": self.rate_p50_Bps,
            "spill_s": self.spill_s,
        }


class BetweenRequests:
    """Fed the analyzer's chunks in order; :meth:`copies` sums what it has seen."""

    def __init__(self) -> None:
        self._t_prev: float | None = None
        self._in = False  # the previous tick was housekeeping
        self._spill: str | None = None  # the direction whose copy may run on into the next phase
        self._spill_s = 0.0
        self._stretches = 0
        self._seconds = 0.0
        self._bytes: dict[str, float] = {d: 0.0 for d in DIRS}
        self._measured = False
        self._copy_s: dict[str, float] = {d: 0.0 for d in DIRS}
        self._rates: dict[str, list[float]] = {d: [] for d in DIRS}
        self._spilled = 0.0

    def feed_chunk(self, ch: Chunk) -> None:
        if not len(ch.t):
            return
        if self._spill is None and PHASE not in ch.phase:  # no stretch and none spilling into this chunk
            self._in, self._t_prev = False, ch.t[-1]
            return
        tx = np.bincount(ch.tick_of, weights=np.nan_to_num(ch.cols[COL["pcie_tx_Bps"]]), minlength=len(ch.t))
        rx = np.bincount(ch.tick_of, weights=np.nan_to_num(ch.cols[COL["pcie_rx_Bps"]]), minlength=len(ch.t))
        seen = np.bincount(
            ch.tick_of,
            weights=(~np.isnan(ch.cols[COL["pcie_tx_Bps"]]) | ~np.isnan(ch.cols[COL["pcie_rx_Bps"]])).astype(float),
            minlength=len(ch.t),
        )
        for i, t in enumerate(ch.t):
            dt = t - self._t_prev if self._t_prev is not None else None
            self._t_prev = t
            rates = {"d2h": float(tx[i]), "h2d": float(rx[i])} if seen[i] > 0 else None
            self._tick(ch.phase[i] == PHASE, dt if dt is not None and 0 < dt <= MAX_DT_S else None, rates)

    def _tick(self, house: bool, dt: float | None, rates: dict[str, float] | None) -> None:
        if house:
            if not self._in:
                self._stretches += 1
            self._in, self._spill, self._spill_s = True, None, 0.0
            if dt is not None:
                self._seconds += dt
            self._count(dt, rates)
            self._spill = _dominant(rates)
            return
        self._in = False
        if self._spill is None or rates is None or dt is None:
            self._spill = None
            return
        other = "h2d" if self._spill == "d2h" else "d2h"
        r = rates[self._spill]
        if r < SPILL_MIN_Bps or r < SPILL_DOMINANCE * rates[other] or self._spill_s + dt > SPILL_MAX_S + 1e-9:
            self._spill = None
            return
        self._spill_s += dt
        self._spilled += dt
        self._count(dt, {self._spill: r, other: 0.0})

    def _count(self, dt: float | None, rates: dict[str, float] | None) -> None:
        if rates is None:
            return
        self._measured = True
        if dt is None:
            return
        for d in DIRS:
            self._bytes[d] += rates[d] * dt
            if rates[d] >= COPY_MIN_Bps:
                self._copy_s[d] += dt
                self._rates[d].append(rates[d])

    def copies(self) -> Copies:
        if not self._stretches:
            return Copies()
        m = self._measured
        return Copies(
            stretches=self._stretches,
            seconds=self._seconds,
            d2h_bytes=self._bytes["d2h"] if m else None,
            h2d_bytes=self._bytes["h2d"] if m else None,
            copy_s=dict(self._copy_s) if m else None,
            rate_p50_Bps={d: quantile(sorted(v), 0.5) for d, v in self._rates.items() if v} if m else None,
            spill_s=self._spilled,
        )


def _dominant(rates: dict[str, float] | None) -> str | None:
    """The direction a copy tick carries (None: no copy in it)."""
    if rates is None:
        return None
    d = max(DIRS, key=lambda k: rates[k])
    other = rates["h2d" if d == "d2h" else "d2h"]
    ok = rates[d] >= SPILL_MIN_Bps and rates[d] >= SPILL_DOMINANCE * other and math.isfinite(rates[d])
    return d if ok else None
