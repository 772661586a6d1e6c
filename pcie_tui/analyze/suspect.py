"""PCIe readings no link can produce, set aside before the analysis trusts them.

A reading above the link's theoretical rate by more than :data:`IMPOSSIBLE_OVER` (a counter that wrapped,
a driver glitch) or below zero is not a measurement: read as 100 % it would call the link saturated. A
reading repeated exactly, non-zero, for :data:`STUCK_TICKS` ticks in a row is a counter that stopped (real
rates vary from sample to sample). Either is treated as missing for that tick (NaN), and the tick's
``missing`` bits say which and why (:data:`pcie_tui.analyze.verdict.MISS_WORDS`), so a bound that needs it
is ``unknown`` with the reason. The state carries over chunks: a live tick and a report's chunk of 8192
ticks give the same result.
"""

from __future__ import annotations

import math

import numpy as np

from pcie_tui.core.model import GpuInfo, pcie_capacity_Bps

IMPOSSIBLE_OVER = 1.25  # x the theoretical per-direction rate (the counter reads up to ~1.0 of it: protocol overhead)
STUCK_TICKS = 20  # 2 s at 10 Hz
# Bits of the ``missing`` column (beside verdict.MISS_*): which direction, and why.
BAD_RX, BAD_TX, STUCK_RX, STUCK_TX = 16, 32, 64, 128


class SuspectFilter:
    """Per GPU: the last PCIe value of each direction and how many ticks in a row it has repeated."""

    def __init__(self) -> None:
        self._last = [float("nan"), float("nan")]
        self._run = [0, 0]

    def apply(self, info: GpuInfo | None, cols: np.ndarray, gen: int, width: int) -> tuple[np.ndarray, np.ndarray]:
        """``cols`` with impossible or stuck PCIe readings (rows 0 RX and 1 TX) set to NaN, and their bits per
        GPU-sample. ``gen``/``width``: the rows holding the link's generation and width."""
        if cols.shape[1] == 1:
            return self._apply_one(info, cols, gen, width)
        theo = _theoretical(info, cols[gen], cols[width])
        bits = np.zeros(cols.shape[1])
        out = cols
        for d, (bad_bit, stuck_bit) in enumerate(((BAD_RX, STUCK_RX), (BAD_TX, STUCK_TX))):
            x = cols[d]
            with np.errstate(invalid="ignore"):
                bad = (x < 0) | (x > IMPOSSIBLE_OVER * theo)
            stuck = self._stuck(d, x)
            if bad.any() or stuck.any():
                if out is cols:
                    out = cols.copy()
                out[d, bad | stuck] = np.nan
                bits += bad * bad_bit + stuck * stuck_bit
        return out, bits

    def _apply_one(self, info: GpuInfo | None, cols: np.ndarray, gen: int, width: int) -> tuple[np.ndarray, np.ndarray]:
        """:meth:`apply` of a single GPU-sample (a live or replayed tick), in plain floats: the same values,
        without a dozen numpy calls on arrays of one."""
        col = cols[:, 0].tolist()
        fallback = None if info is None else info.link.capacity_Bps or info.link.max_capacity_Bps
        theo = float(fallback) if fallback else math.inf
        g, w = col[gen], col[width]
        if not (math.isnan(g) or math.isnan(w)):
            theo = float(pcie_capacity_Bps(int(g), int(w)) or theo)
        bits = 0
        out = cols
        for d, (bad_bit, stuck_bit) in enumerate(((BAD_RX, STUCK_RX), (BAD_TX, STUCK_TX))):
            x = col[d]
            bad = x < 0 or x > IMPOSSIBLE_OVER * theo
            run = self._run[d] + 1 if x == self._last[d] and x != 0 else 0
            self._last[d], self._run[d] = x, run
            stuck = run >= STUCK_TICKS - 1
            if bad or stuck:
                if out is cols:
                    out = cols.copy()
                out[d, 0] = np.nan
                bits += bad * bad_bit + stuck * stuck_bit
        return out, np.array([float(bits)])

    def _stuck(self, d: int, x: np.ndarray) -> np.ndarray:
        """Samples that repeat the one before exactly (non-zero) for STUCK_TICKS in a row or more."""
        out = np.zeros(x.size, dtype=bool)
        last, run = self._last[d], self._run[d]
        if x.size and not (((x[1:] == x[:-1]) & (x[1:] != 0)).any() or (x[0] == last and last != 0)):
            self._last[d], self._run[d] = float(x[-1]), 0  # the usual case: nothing repeats
            return out
        for i, v in enumerate(x.tolist()):
            run = run + 1 if v == last and v != 0 else 0
            last = v
            out[i] = run >= STUCK_TICKS - 1
        self._last[d], self._run[d] = last, run
        return out


def _theoretical(info: GpuInfo | None, gen: np.ndarray, width: np.ndarray) -> np.ndarray:
    """The theoretical per-direction rate of each sample's link (inf where unknown: nothing is impossible)."""
    fallback = None
    if info is not None:
        fallback = info.link.capacity_Bps or info.link.max_capacity_Bps
    out = np.full(gen.size, float(fallback) if fallback else np.inf)
    ok = ~(np.isnan(gen) | np.isnan(width))
    if not ok.any():
        return out
    g_ok, w_ok = gen[ok], width[ok]
    if bool((g_ok == g_ok[0]).all() and (w_ok == w_ok[0]).all()):  # the usual case: one link shape
        pairs = {(int(g_ok[0]), int(w_ok[0]))}
    else:
        pairs = {(int(g), int(w)) for g, w in zip(g_ok.tolist(), w_ok.tolist(), strict=True)}
    for g, w in pairs:  # usually one link shape for the whole chunk
        cap = pcie_capacity_Bps(g, w)
        if cap:
            out[ok & (gen == g) & (width == w)] = cap
    return out


def merge_missing(missing: np.ndarray, bits: np.ndarray) -> np.ndarray:
    """The ``missing`` bits with a set-aside direction said once: its reason in place of "not reported"."""
    b = bits.astype(np.int64)
    m = np.nan_to_num(missing).astype(np.int64)
    m = np.where((b & (BAD_RX | STUCK_RX)) > 0, m & ~1, m)  # verdict.MISS_RX
    m = np.where((b & (BAD_TX | STUCK_TX)) > 0, m & ~2, m)  # verdict.MISS_TX
    return (m | b).astype(np.float64)
