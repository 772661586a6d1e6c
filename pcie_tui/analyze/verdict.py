"""Which resource is saturated, per GPU and tick, with time hysteresis.

Pure functions over readings (one GPU, every sample of a chunk at once); no I/O. The hysteresis
state machine that turns them into events is :mod:`pcie_tui.analyze.tracker`.

Rules (defaults in :class:`Thresholds`, reasoning in docs/verdict.md):

* ``link``: PCIe or NVLink use, either direction, as a fraction of the link's
  ceiling (the calibrated counter reading if ``pcie-tui calibrate`` ran, else
  the theoretical rate of the link's current gen x width).
* ``memory``: GPM ``DRAM_BW_UTIL`` (true bandwidth); without GPM, NVML's
  memory-busy duty cycle with stricter thresholds, labelled as a proxy.
* ``compute``: SM utilisation.

A resource enters the saturated state only after its utilisation stayed at or
above ``*_enter`` for ``hold_s``; it leaves after staying below ``*_exit`` for
``hold_s``. When several are saturated at once the verdict is the first of
link > memory > compute: the link is the one a user can change by moving a
card, and a saturated link starves the others.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np

from pcie_tui.analyze.columns import KEYS, from_samples
from pcie_tui.core import vocab
from pcie_tui.core.ceiling import Ceiling, pinned_ceiling
from pcie_tui.core.model import GpuInfo, GpuSample, Sample, pcie_capacity_Bps

RESOURCES = ("link", "memory", "compute")
# Below saturation, a GPU is busy at these shares of its SMs or of DRAM bandwidth (what the attribution's
# one rule of what bound a tick cuts at: analyze/attribution.bound_codes).
GPU_BUSY_SM = 0.50
GPU_BUSY_DRAM = 0.40
VERDICTS = vocab.VERDICTS  # the saturation verdict names, in the one vocabulary


@dataclass(frozen=True, slots=True)
class Thresholds:
    """Verdict thresholds. Fractions 0..1 of the resource's ceiling; times in seconds."""

    # Saturating pinned copies read 0.87-0.92 of the theoretical Gen5 x16 rate
    # (NVML/GPM count protocol overhead); a link at half duty reads ~0.45.
    link_enter: float = 0.70
    link_exit: float = 0.55
    # GPM DRAM_BW_UTIL: a device-to-device copy reads 0.87, a bf16 matmul 0.16.
    memory_enter: float = 0.70
    memory_exit: float = 0.55
    # NVML memory-busy is a duty cycle: a D2D copy reads 1.00 but so can light
    # streaming; a matmul reads 0.22. Only a pegged duty cycle counts.
    proxy_memory_enter: float = 0.95
    proxy_memory_exit: float = 0.85
    # GPM SM_UTIL (or NVML gpu util): a large bf16 matmul reads 0.95.
    compute_enter: float = 0.85
    compute_exit: float = 0.70
    hold_s: float = 0.5

    def enter(self, resource: str, proxy: bool = False) -> float:
        if resource == "memory" and proxy:
            return self.proxy_memory_enter
        return float(getattr(self, f"{resource}_enter"))

    def exit(self, resource: str, proxy: bool = False) -> float:
        if resource == "memory" and proxy:
            return self.proxy_memory_exit
        return float(getattr(self, f"{resource}_exit"))


DEFAULT_THRESHOLDS = Thresholds()


@dataclass(frozen=True, slots=True)
class Utilisation:
    """One GPU's utilisation of each resource for one tick (None = unknown)."""

    link: float | None
    link_bus: str | None  # "pcie" | "nvlink"
    link_dir: str | None  # "tx" | "rx"
    link_Bps: float | None
    link_ceiling_Bps: float | None
    memory: float | None
    memory_proxy: bool
    compute: float | None


def tick_ceiling(info: GpuInfo | None, sample: GpuSample | None, observed: dict[tuple[float, float], float]) -> Ceiling:
    """The PCIe ceiling a tick's link share was taken against (:func:`pcie_tui.core.ceiling.pinned_ceiling`
    at the tick's gen x width, with the highest reading seen at that gen x width so far)."""
    gen = sample.link_gen if sample is not None else None
    width = sample.link_width if sample is not None else None
    key = (-1.0 if gen is None else float(gen), -1.0 if width is None else float(width))
    return pinned_ceiling(info, gen, width, observed.get(key))


def utilisation(info: GpuInfo | None, s: GpuSample) -> Utilisation:
    """Fractions of each resource's ceiling used in one tick (:func:`utilisation_columns` on one)."""
    return last_utilisation(utilisation_columns(info, from_samples([Sample(0.0, (s,))]).cols))


BUS = (None, "pcie", "pcie", "nvlink", "nvlink")  # by link-source code; 0 = no link reading
DIR = (None, "rx", "tx", "rx", "tx")


def utilisation_columns(
    info: GpuInfo | None,
    cols: np.ndarray,
    seen: dict[Any, Any] | None = None,
    observed: dict[tuple[float, float], float] | None = None,
) -> dict[str, np.ndarray]:
    """Utilisation of one GPU for every GPU-sample of ``cols`` (columns.KEYS x samples), at once.

    ``link``: the busier of PCIe RX/TX over the PCIe ceiling and NVLink RX/TX over the NVLink
    capacity (the first wins a tie, in that order), with its rate (``link_Bps``), ceiling and
    source (``src``, an index into :data:`BUS`/:data:`DIR`). ``memory``: GPM DRAM bandwidth, else
    the NVML busy duty cycle (``proxy``). ``compute``: SM use. NaN where unknown. ``seen``: the
    PCIe ceilings of this GPU already worked out, by link gen x width (kept by the caller).
    ``observed``: the highest PCIe reading so far by gen x width (kept and updated here): a reading
    above the ceiling makes it the ceiling from that tick on, so no share exceeds 1
    (:mod:`pcie_tui.core.ceiling`, "observed").
    """
    size = cols.shape[1]
    seen = {} if seen is None else seen
    if size == 1 and observed is not None:  # a live tick: the same rules in plain floats
        return _one_sample(info, cols[:, 0].tolist(), seen, observed)
    # PCIe RX, TX, NVLink RX, TX (the first four columns) over their ceilings; NaN where a rate
    # or its ceiling is unknown (a zero or missing ceiling counts as unknown).
    rates = cols[:4]
    pc = _pcie_ceilings(info, cols[_GEN], cols[_WIDTH], seen)
    if observed is not None:
        pc = _with_observed(info, pc, rates, cols[_GEN], cols[_WIDTH], observed, seen)
    nc = info.nvlink_capacity_Bps if info is not None else None
    caps = np.empty((4, size))
    caps[0] = caps[1] = np.where(pc == 0, np.nan, pc)
    caps[2:] = float(nc) if nc else np.nan
    r = rates / caps
    if observed is not None:  # a PCIe reading above the theoretical rate (a glitch) reads as 100 %
        np.minimum(r[:2], 1.0, out=r[:2])
    at = np.where(r != r, -np.inf, r).argmax(axis=0)  # the first of the busiest
    every = np.arange(size)
    link = r[at, every]
    none = link != link
    # A GPU with GPM never mixes in the duty-cycle proxy: a missing GPM window
    # stays unknown rather than switching meaning from tick to tick.
    dram, busy = cols[_DRAM], cols[_BUSY]
    if info is not None and info.metrics_source == "gpm":
        memory, proxy = dram, np.zeros(size, dtype=bool)
    else:
        use_dram = dram == dram
        memory, proxy = np.where(use_dram, dram, busy), ~use_dram & (busy == busy)
    return {
        "missing": _missing(cols, memory, info),
        "link": link,
        "link_Bps": np.where(none, np.nan, rates[at, every]),
        "ceiling": np.where(none, np.nan, caps[at, every]),
        "src": np.where(none, 0, at + 1).astype(np.int8),
        "memory": memory,
        "proxy": proxy,
        "compute": cols[_SM],
        "pcie_ceiling": caps[0],  # the one PCIe ceiling of each sample (pcie_tui.core.ceiling), NaN if unknown
    }


_NAN = float("nan")


def _missing(cols: np.ndarray, memory: np.ndarray, info: GpuInfo | None) -> np.ndarray:
    """The counters each GPU-sample lacks, as MISS_* bits (floats, for the series' arrays)."""
    gpm = info is not None and info.metrics_source == "gpm"
    return (
        np.isnan(cols[0]) * MISS_RX
        + np.isnan(cols[1]) * MISS_TX
        + np.isnan(cols[_SM]) * MISS_SM
        + (np.isnan(memory) & gpm) * MISS_DRAM
    ).astype(np.float64)


def _one_sample(
    info: GpuInfo | None, v: list[float], seen: dict[Any, Any], observed: dict[tuple[float, float], float]
) -> dict[str, np.ndarray]:
    """:func:`utilisation_columns` of one GPU-sample (``v``: its column values), without numpy calls
    on one-element arrays: the live path, tick by tick. The chunked path gives the same numbers
    (tests/test_chunks_equal_ticks.py)."""
    g, w = v[_GEN], v[_WIDTH]
    key = (-1.0 if g != g else g, -1.0 if w != w else w)
    base = seen.get(key)
    if base is None:
        base = seen.setdefault(key, _pcie_ceiling(info, *key))
    rx, tx = v[0], v[1]
    r = tx if rx != rx or (tx == tx and tx > rx) else rx
    hi = observed.get(key)
    if r == r:
        cap = _theoretical_seen(info, key, seen)
        top = min(r, cap) if cap is not None else r
        if hi is None or top > hi:
            hi = observed[key] = top
    pc = base if hi is None or base != base or hi <= base else hi
    pc = _NAN if pc == 0 else pc
    nc = info.nvlink_capacity_Bps if info is not None else None
    caps = (pc, pc, float(nc) if nc else _NAN, float(nc) if nc else _NAN)
    at, best = 0, -np.inf
    shares = []
    for i in range(4):
        x = v[i] / caps[i]  # NaN where either is unknown
        if i < 2 and x > 1.0:
            x = 1.0  # a PCIe reading above the theoretical rate (a glitch) reads as 100 %
        shares.append(x)
        if x == x and x > best:
            at, best = i, x
    link = shares[at]
    known = link == link
    dram, busy = v[_DRAM], v[_BUSY]
    if info is not None and info.metrics_source == "gpm":
        memory, proxy = dram, False
    else:
        memory, proxy = (dram, False) if dram == dram else (busy, busy == busy)
    f = np.array([link, v[at] if known else _NAN, caps[at] if known else _NAN, memory, v[_SM], pc])
    miss = (
        (rx != rx) * MISS_RX
        + (tx != tx) * MISS_TX
        + (v[_SM] != v[_SM]) * MISS_SM
        + (memory != memory and info is not None and info.metrics_source == "gpm") * MISS_DRAM
    )
    return {
        "missing": np.array([float(miss)]),
        "link": f[0:1],
        "link_Bps": f[1:2],
        "ceiling": f[2:3],
        "src": np.array([at + 1 if known else 0], dtype=np.int8),
        "memory": f[3:4],
        "proxy": np.array([proxy]),
        "compute": f[4:5],
        "pcie_ceiling": f[5:6],
    }


# Which counters a GPU-sample lacks (the ``missing`` column, a bit mask): a bound that needs one is unknown.
MISS_RX, MISS_TX, MISS_SM, MISS_DRAM = 1, 2, 4, 8
# (pcie_tui.analyze.suspect adds 16-128: a PCIe reading set aside as impossible or stuck; its "not reported"
# bit is then cleared, so each tick says one reason per direction.)
MISS_PCIE = 1 | 2 | 16 | 32 | 64 | 128  # either PCIe direction missing or set aside
MISS_WORDS = {
    MISS_RX: "PCIe RX not reported",
    MISS_TX: "PCIe TX not reported",
    MISS_SM: "SM use not reported",
    MISS_DRAM: "DRAM bandwidth not reported",
    16: "PCIe RX above the link's theoretical rate (a wrapped or corrupt counter)",
    32: "PCIe TX above the link's theoretical rate (a wrapped or corrupt counter)",
    64: "PCIe RX stuck at one value",
    128: "PCIe TX stuck at one value",
}

_GEN, _WIDTH, _DRAM, _BUSY, _SM = (
    KEYS.index(k) for k in ("link_gen", "link_width", "dram_bw_util", "mem_busy", "sm_util")
)
assert KEYS[:4] == ("pcie_rx_Bps", "pcie_tx_Bps", "nvlink_rx_Bps", "nvlink_tx_Bps")


def _pcie_ceilings(info: GpuInfo | None, gen: np.ndarray, width: np.ndarray, seen: dict[Any, Any]) -> np.ndarray:
    """The rule ceiling (:func:`pcie_tui.core.ceiling.pinned_ceiling`) per GPU-sample (NaN where unknown),
    evaluated once per distinct gen x width."""
    if gen.size <= 16:  # a live tick: no numpy set operations
        out = []
        for g, w in zip(gen.tolist(), width.tolist(), strict=True):
            p = (-1.0 if g != g else g, -1.0 if w != w else w)
            c = seen.get(p)
            out.append(c if c is not None else seen.setdefault(p, _pcie_ceiling(info, *p)))
        return np.array(out)
    pair = np.stack((np.where(np.isnan(gen), -1.0, gen), np.where(np.isnan(width), -1.0, width)))
    first = pair[:, :1]
    if bool((pair == first).all()):
        return np.full(pair.shape[1], _pcie_ceiling(info, *first[:, 0].tolist()))
    uq, inv = np.unique(pair, axis=1, return_inverse=True)
    table = np.array([_pcie_ceiling(info, g, w) for g, w in uq.T.tolist()])
    return table[inv.reshape(-1)]


def _pcie_ceiling(info: GpuInfo | None, gen: float, width: float) -> float:
    def known(v: float) -> int | None:  # NaN (or the -1 standing for it) is unknown
        return None if v != v or v == -1.0 else int(v)

    c = pinned_ceiling(info, known(gen), known(width)).Bps
    return np.nan if c is None else float(c)


def _with_observed(
    info: GpuInfo | None,
    pc: np.ndarray,
    rates: np.ndarray,
    gen: np.ndarray,
    width: np.ndarray,
    observed: dict[tuple[float, float], float],
    seen: dict[Any, Any],
) -> np.ndarray:
    """The ceilings ``pc`` raised to the highest PCIe reading (``rates``' RX and TX rows) so far at each
    sample's gen x width (that sample included), carrying the running highest in ``observed`` from
    chunk to chunk (a chunk of one takes :func:`_one_sample` instead).

    A reading above the link's theoretical rate is a counter glitch (98.8 GB/s on a 63.0 GB/s link,
    once, in an H200 recording), not the link's ceiling: the running highest stops at the
    theoretical rate.
    """
    g = np.where(np.isnan(gen), -1.0, gen)
    w = np.where(np.isnan(width), -1.0, width)
    rate = np.fmax(rates[0], rates[1])
    out = pc.copy()
    if bool((g == g[0]).all()) and bool((w == w[0]).all()):  # one link state the whole chunk (the usual)
        groups: list[tuple[tuple[float, float], np.ndarray]] = [((float(g[0]), float(w[0])), np.arange(g.size))]
    else:
        uq, inv = np.unique(np.stack((g, w)), axis=1, return_inverse=True)
        inv = inv.reshape(-1)
        groups = [((float(a), float(b)), np.flatnonzero(inv == k)) for k, (a, b) in enumerate(uq.T.tolist())]
    for key, idx in groups:
        cap = _theoretical_seen(info, key, seen)
        rs = np.minimum(rate[idx], cap) if cap is not None else rate[idx]  # NaN (no reading) stays NaN
        run = np.fmax.accumulate(np.concatenate(([observed.get(key, np.nan)], rs)))[1:]
        if run.size and run[-1] == run[-1]:
            observed[key] = float(run[-1])
        out[idx] = np.where(np.isnan(pc[idx]), np.nan, np.fmax(pc[idx], run))  # an unknown link stays unknown
    return out


def _theoretical_seen(info: GpuInfo | None, key: tuple[float, float], seen: dict[Any, Any]) -> float | None:
    """:func:`_theoretical`, kept in the caller's cache of this GPU's ceilings (one lookup per tick)."""
    k = ("theoretical", *key)
    if k not in seen:
        seen[k] = _theoretical(info, *key)
    return seen[k]  # type: ignore[no-any-return]


def _theoretical(info: GpuInfo | None, gen: float, width: float) -> float | None:
    """The theoretical rate of the link at ``gen`` x ``width`` (-1: unknown, then the header's)."""
    theo = pcie_capacity_Bps(int(gen), int(width)) if gen > 0 and width > 0 else None
    if theo is None and info is not None:
        theo = info.link.capacity_Bps or info.link.max_capacity_Bps
    return theo


def last_utilisation(u: dict[str, np.ndarray]) -> Utilisation:
    """The last GPU-sample of :func:`utilisation_columns` as a :class:`Utilisation` (NaN -> None)."""

    def f(a: np.ndarray) -> float | None:
        x = float(a[-1])
        return None if x != x else x

    s = int(u["src"][-1])
    return Utilisation(
        f(u["link"]),
        BUS[s],
        DIR[s],
        f(u["link_Bps"]),
        f(u["ceiling"]),
        f(u["memory"]),
        bool(u["proxy"][-1]),
        f(u["compute"]),
    )


@dataclass(slots=True)
class Event:
    """A period during which one resource of one GPU was saturated."""

    gpu: int
    resource: str
    start: float
    end: float | None = None  # None while still open
    peak_util: float = 0.0
    sum_util: float = 0.0
    n: int = 0
    proxy: bool = False
    # Link only: which bus and direction carried the peak, and its rate.
    bus: str | None = None
    direction: str | None = None
    peak_Bps: float | None = None
    directions: set[str] = field(default_factory=set)
    phases: dict[str, int] = field(default_factory=dict)

    @property
    def mean_util(self) -> float:
        return self.sum_util / self.n if self.n else 0.0

    @property
    def phase(self) -> str | None:
        """The engine phase (or recording label) that dominated the event."""
        return max(self.phases, key=self.phases.__getitem__) if self.phases else None

    @property
    def direction_label(self) -> str | None:
        if not self.directions:
            return None
        return "both" if len(self.directions) > 1 else next(iter(self.directions))

    def to_json(self) -> dict[str, Any]:
        return {
            "gpu": self.gpu,
            "resource": self.resource,
            "start": self.start,
            "end": self.end,
            "peak_util": self.peak_util,
            "mean_util": self.mean_util,
            "basis": "proxy" if self.proxy else "measured",
            "bus": self.bus,
            "direction": self.direction_label,
            "peak_Bps": self.peak_Bps,
            "phase": self.phase,
        }
