"""Throttled stretches: where a busy GPU ran with its clocks cut, and what that cost in tokens.

A GPU-tick is **throttled** when the GPU was busy (SM use at or above :data:`BUSY_SM`, or unknown) and
NVML's clock-event reasons (:mod:`pcie_tui.core.clocks`) hold a reason that cuts clocks (power cap,
thermal slowdown SW/HW, HW slowdown, power brake, sync boost), or any reason but idle is set while
the SM clock is under :data:`CLOCK_CUT` of its maximum. Throttled ticks of one GPU closer than
:data:`MERGE_S` form a **stretch**.

A tick of the session is throttled when any GPU was (the slowest GPU sets the pace of a tensor-parallel
step). Per phase, the engine's token rate and its inter-token latency are compared inside and outside
the throttled ticks of the same phase; what the throttled time would have taken at the unthrottled
rate gives the **time lost** (tokens where the engine counts them, else the SM clock ratio). Pure
bookkeeping over the analyzer's chunks (:mod:`pcie_tui.analyze.columns`); no I/O.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from pcie_tui.analyze.columns import COL, Chunk
from pcie_tui.analyze.series import Col, Labels
from pcie_tui.core import clocks
from pcie_tui.core.model import EngineSample, SessionHeader
from pcie_tui.engines.stats import REQUEST_IDENTITY

BUSY_SM = 0.10  # SM use at or above this: the GPU was working (an idle GPU's clocks drop by design)
CLOCK_CUT = 0.85  # an SM clock under this share of its maximum, with a reason set, counts as cut
MERGE_S = 1.0  # throttled ticks of one GPU closer than this are one stretch
MIN_SHARE = 0.05  # a phase throttled for less than this share is not called out beside its finding
UNLABELLED = "unlabelled"  # the phase of ticks that have none
MAX_DT_S = 5.0  # a tick further than this from the one before follows a gap: it carries no time
TOKEN_PHASE = {
    "decode": "generation_tokens_total",
    "prefill": "prompt_tokens_total",
    "mixed": "generation_tokens_total",
}


@dataclass
class _Gpu:
    """One GPU's ticks with a clock-event reading, as growable numpy columns (a few bytes a tick: a day-long
    live session must not keep an array object per tick)."""

    cols: dict[str, Col] = field(default_factory=dict)
    phase: Labels = field(default_factory=Labels)

    def add(self, name: str, a: np.ndarray) -> np.ndarray:
        """Append ``a`` to column ``name`` (its dtype set by the first); returns ``a``."""
        col = self.cols.get(name)
        if col is None:
            col = self.cols[name] = Col(a.dtype)
        col.extend(a)
        return a

    def col(self, name: str) -> np.ndarray:
        return self.cols[name].array()


@dataclass
class ThrottleEvent:
    """One throttled stretch as it grows tick by tick (what the TUI's events box lists)."""

    gpu: int
    start: float
    end: float
    mask: int = 0  # every throttling reason seen in it
    clock_min_MHz: float | None = None
    phases: dict[str, int] = field(default_factory=dict)
    open: bool = True
    kind: str = "throttled"

    @property
    def phase(self) -> str | None:
        return max(self.phases, key=self.phases.__getitem__) if self.phases else None

    def reason(self) -> str:
        """What cut the clocks, shortly: the first reason, '+' when there were more ("power cap+")."""
        names = clocks.names(clocks.throttling(self.mask))
        return (names[0] + ("+" if len(names) > 1 else "")) if names else "clock cut"

    def detail(self) -> str:
        """The lowest SM clock in it, e.g. "SM 1,290 MHz"."""
        return f"SM {self.clock_min_MHz:,.0f} MHz" if self.clock_min_MHz is not None else "SM clock n/a"


_GPU_COLS = {"clock": "sm_clock_MHz", "temp": "temp_C", "power": "power_W", "limit": "power_limit_W"}


@dataclass
class _PhaseStat:
    n: int = 0  # ticks with a clock-event reading
    k: int = 0  # of those, throttled
    masks: Counter[int] = field(default_factory=Counter)  # throttled ticks per reasons bitmask
    clocks: Counter[float] = field(default_factory=Counter)  # throttled ticks per SM clock (MHz steps)

    def clock_median(self) -> float | None:
        """The median SM clock of the throttled ticks, as numpy's median of the same values."""
        total = sum(self.clocks.values())
        if not total:
            return None
        keys = sorted(self.clocks)
        cum = np.cumsum([self.clocks[c] for c in keys])

        def at(i: int) -> float:
            return float(keys[int(np.searchsorted(cum, i, "right"))])

        return at(total // 2) if total % 2 else (at(total // 2 - 1) + at(total // 2)) / 2


@dataclass
class _Side:
    """One side (throttled or not) of one phase."""

    time_s: float = 0.0
    tokens: float = 0.0
    token_s: float = 0.0  # seconds of engine intervals with a token count on both ends
    itl_sum_s: float = 0.0
    itl_n: float = 0.0
    clocks: list[float] = field(default_factory=list)

    def rate(self) -> float | None:
        return self.tokens / self.token_s if self.token_s > 0 else None

    def itl(self) -> float | None:
        return self.itl_sum_s / self.itl_n if self.itl_n > 0 else None


def _num(v: Any) -> float | None:
    return float(v) if isinstance(v, int | float) and not isinstance(v, bool) else None


def _engine(e: Any) -> tuple[dict[str, Any], dict[str, Any]] | None:
    """(counters, raw extras) of an engine reading that is up, else None."""
    if isinstance(e, dict):
        return (e, e) if e.get("up") is True else None
    if isinstance(e, EngineSample) and e.up:
        return {
            "generation_tokens_total": e.generation_tokens_total,
            "prompt_tokens_total": e.prompt_tokens_total,
        }, e.extra
    return None


class Heat:
    """Fed the analyzer's chunks in order (after its phase rule); :meth:`report` says what it found."""

    def __init__(self, header: SessionHeader) -> None:
        self.header = header
        self.gpus: dict[int, _Gpu] = {}
        self.max_clock: dict[int, float] = {
            g.index: float(g.sm_clock_max_MHz) for g in header.gpus if g.sm_clock_max_MHz
        }
        self.seen = False  # any clock-event reading at all
        self._t_prev: float | None = None
        self._eng_prev: tuple[float, dict[str, Any]] | None = None
        self._itl_prev: tuple[float, float] | None = None
        self._sides: dict[tuple[str, bool], _Side] = {}
        self._requests: dict[tuple[Any, ...], dict[str, Any]] = {}
        self._tick_t = Col()
        self._tick_thr = Col(np.bool_)
        self._n = 0
        self._cache: tuple[int, dict[str, Any]] | None = None
        self._phase_stats: dict[tuple[int, str], _PhaseStat] = {}
        self.events: list[ThrottleEvent] = []  # the stretches so far, in order (live: the last may be open)
        self._open: dict[int, ThrottleEvent] = {}

    # ---- feeding ----------------------------------------------------------

    def feed_chunk(self, ch: Chunk) -> None:
        n = len(ch.t)
        cols = ch.cols
        mask_f = cols[COL["clock_events"]]
        known = ~np.isnan(mask_f)
        if not self.seen and not bool(known.any()):
            self._t_prev = ch.t[-1]  # no clock readings (an older recording): nothing to follow
            return
        self.seen = True
        self._n += n
        thr = self._throttled(ch, mask_f, known)
        tick_thr = np.zeros(n, dtype=bool)
        np.logical_or.at(tick_thr, ch.tick_of, thr)
        tick_known = np.zeros(n, dtype=bool)
        np.logical_or.at(tick_known, ch.tick_of, known)
        self._per_gpu(ch, thr, known)
        self._ticks(ch, tick_thr, tick_known)

    def _throttled(self, ch: Chunk, mask_f: np.ndarray, known: np.ndarray) -> np.ndarray:
        cols = ch.cols
        mask = np.where(known, mask_f, 0).astype(np.int64)
        sm = cols[COL["sm_util"]]
        busy = ~(sm < BUSY_SM)  # NaN (unknown use) counts as busy: the reasons say the rest
        cut_bits = (mask & clocks.THROTTLE_BITS) != 0
        maxc = np.array([self.max_clock.get(int(i), np.nan) for i in ch.index], dtype=np.float64)
        with np.errstate(invalid="ignore"):
            slow = cols[COL["sm_clock_MHz"]] < CLOCK_CUT * maxc
        other = (mask & ~0x1) != 0
        return known & busy & (cut_bits | (other & slow))

    def _per_gpu(self, ch: Chunk, thr: np.ndarray, known: np.ndarray) -> None:
        t_all = np.asarray(ch.t, dtype=np.float64)[ch.tick_of]
        for gi in dict.fromkeys(ch.index[known].tolist()):
            sel = known & (ch.index == gi)
            g = self.gpus.setdefault(int(gi), _Gpu())
            g.add("t", t_all[sel])
            g.add("thr", thr[sel])
            mask = g.add("mask", ch.cols[COL["clock_events"]][sel].astype(np.int64))
            for name, key in _GPU_COLS.items():
                g.add(name, ch.cols[COL[key]][sel])
            clock = ch.cols[COL["sm_clock_MHz"]][sel]
            # working: SM use at BUSY_SM or more, or unknown while the reasons do not say idle (0x1)
            g.add("busy", ~(ch.cols[COL["sm_util"]][sel] < BUSY_SM) & ((mask & 0x1) == 0))
            phases = [ch.phase[i] for i in ch.tick_of[sel].tolist()]
            g.phase.extend(phases)
            self._count(int(gi), phases, thr[sel], mask, clock)
            self._grow(int(gi), t_all[sel], thr[sel], mask, clock, phases)
        last = ch.t[-1]
        for ev in self._open.values():
            ev.open = last - ev.end <= MERGE_S

    def _count(self, gi: int, phases: list[Any], thr: np.ndarray, mask: np.ndarray, clock: np.ndarray) -> None:
        """Per GPU and phase: ticks, throttled ticks, and the reasons and SM clocks of those (what a finding
        asks live, once a second: counts, so the cost does not grow with the session)."""
        arr = np.array([str(p) for p in phases], dtype=object)
        for p in dict.fromkeys(phases):
            in_p = arr == str(p)
            st = self._phase_stats.setdefault((gi, str(p)), _PhaseStat())
            st.n += int(in_p.sum())
            cut = in_p & thr
            st.k += int(cut.sum())
            st.masks.update(mask[cut].tolist())
            st.clocks.update(c for c in clock[cut].tolist() if c == c)

    def _grow(
        self, gi: int, t: np.ndarray, thr: np.ndarray, mask: np.ndarray, clock: np.ndarray, phases: list[Any]
    ) -> None:
        """The live stretches: each throttled tick extends its GPU's open one or starts the next."""
        for j in np.flatnonzero(thr).tolist():
            tj = float(t[j])
            ev = self._open.get(gi)
            if ev is None or tj - ev.end > MERGE_S:
                if ev is not None:
                    ev.open = False
                ev = self._open[gi] = ThrottleEvent(gi, tj, tj)
                self.events.append(ev)
            ev.end = tj
            ev.mask |= clocks.throttling(int(mask[j]))
            c = float(clock[j])
            if c == c and (ev.clock_min_MHz is None or c < ev.clock_min_MHz):
                ev.clock_min_MHz = c
            if phases[j] is not None:
                ev.phases[str(phases[j])] = ev.phases.get(str(phases[j]), 0) + 1

    def _ticks(self, ch: Chunk, thr: np.ndarray, known: np.ndarray) -> None:
        """Each tick's time to its phase's side (throttled or not), then the engine's counters tick by tick."""
        t = np.asarray(ch.t, dtype=np.float64)
        dt = np.diff(t, prepend=self._t_prev if self._t_prev is not None else t[0])
        dt[(dt <= 0) | (dt > MAX_DT_S)] = 0.0
        self._t_prev = ch.t[-1]
        self._tick_t.extend(ch.t)
        self._tick_thr.extend(thr)
        # A session without phases (GPU only, no labels) is compared as one: "unlabelled", as the headline says.
        phs = [UNLABELLED if p is None else str(p) for p in ch.phase]
        arr = np.array(phs, dtype=object)
        for p in dict.fromkeys(phs):
            in_p = known & (arr == p)
            for side in (True, False):
                sel = in_p & (thr == side)
                if sel.any():
                    self._sides.setdefault((p, side), _Side()).time_s += float(dt[sel].sum())
        if ch.engine.count(None) == len(ch.engine):
            self._eng_prev = None
            return
        for i, e in enumerate(ch.engine):
            self._engine_tick(ch.t[i], phs[i], e, bool(thr[i]) if known[i] else None)

    def _engine_tick(self, t: float, phase: str, e: Any, thr: bool | None) -> None:
        eng = _engine(e)
        if eng is None:
            self._eng_prev = None
            return
        counters, extra = eng
        if thr is not None:
            side = self._sides.setdefault((phase, thr), _Side())
            self._tokens(side, t, phase, counters)
            self._itl(side, extra)
        self._eng_prev = (t, counters)
        for r in extra.get("requests") or ():
            if isinstance(r, dict):
                self._requests.setdefault(tuple(r.get(k) for k in REQUEST_IDENTITY), r)

    def _tokens(self, side: _Side, t: float, phase: str, counters: dict[str, Any]) -> None:
        key = TOKEN_PHASE.get(phase)
        if key is None or self._eng_prev is None:
            return
        t0, before = self._eng_prev
        a, b = _num(before.get(key)), _num(counters.get(key))
        if a is None or b is None or b < a or not 0 < t - t0 <= MAX_DT_S:
            return
        side.tokens += b - a
        side.token_s += t - t0

    def _itl(self, side: _Side, extra: dict[str, Any]) -> None:
        """vLLM's inter-token-latency histogram: its sum and count increase go to this tick's side."""
        hist = extra.get("hist")
        h = hist.get("itl_s") if isinstance(hist, dict) else None
        if not isinstance(h, dict):
            return
        s, c = _num(h.get("sum")), _num(h.get("count"))
        if s is None or c is None:
            return
        if self._itl_prev is not None and c >= self._itl_prev[1]:
            side.itl_sum_s += s - self._itl_prev[0]
            side.itl_n += c - self._itl_prev[1]
        self._itl_prev = (s, c)

    def finish(self) -> None:
        for ev in self.events:
            ev.open = False

    # ---- what it found ------------------------------------------------------

    def report(self) -> dict[str, Any] | None:
        """``heat`` of ``report --json``: stretches, per-phase comparison, time lost (None: no clock readings)."""
        if not self.seen:
            return None
        if self._cache is not None and self._cache[0] == self._n:
            return self._cache[1]
        stretches = [s for gi in sorted(self.gpus) for s in self._stretches(gi)]
        phases = self._phases()
        lost = sum(p["lost_s"] or 0.0 for p in phases.values())
        span = (self._tick_t[-1] - self._tick_t[0]) if len(self._tick_t) > 1 else 0.0
        out = {
            "gpus": {str(gi): self._gpu_summary(gi) for gi in sorted(self.gpus)},
            "stretches": stretches,
            "phases": phases,
            "lost_s": lost,
            "lost_share": lost / span if span > 0 else None,
            "rule": (
                f"busy (SM >= {BUSY_SM:.0%} or unknown) with a clock-cutting reason "
                f"({', '.join(clocks.REASONS[b][0] for b in clocks.REASONS if b & clocks.THROTTLE_BITS)}), or any "
                f"reason but idle with the SM clock under {CLOCK_CUT:.0%} of its maximum; stretches merge "
                f"across {MERGE_S:g} s"
            ),
        }
        self._cache = (self._n, out)
        return out

    def _gpu_summary(self, gi: int) -> dict[str, Any]:
        g = self.gpus[gi]
        temp, clock = _finite(g.col("temp")), _finite(g.col("clock")[g.col("thr")])
        masks, counts = np.unique(g.col("mask"), return_counts=True)
        reasons: dict[str, int] = {}
        for m, n in zip(masks.tolist(), counts.tolist(), strict=True):
            for name in clocks.names(m):
                reasons[name] = reasons.get(name, 0) + n
        return {
            "ticks": len(g.phase),
            "throttled_ticks": int(g.col("thr").sum()),
            "temp_max_C": float(temp.max()) if temp.size else None,
            "sm_clock_min_MHz": float(clock.min()) if clock.size else None,  # while throttled
            "sm_clock_max_MHz": self.max_clock.get(gi),
            "reason_ticks": reasons,
        }

    def _stretches(self, gi: int) -> list[dict[str, Any]]:
        g = self.gpus[gi]
        t = g.col("t")
        pos = np.flatnonzero(g.col("thr"))
        if not pos.size:
            return []
        cuts = np.flatnonzero(np.diff(t[pos]) > MERGE_S) + 1
        step = _step(t)
        return [self._stretch(gi, run, step) for run in np.split(pos, cuts)]

    def _stretch(self, gi: int, idx: np.ndarray, step: float) -> dict[str, Any]:
        g = self.gpus[gi]
        counts: dict[str, int] = {}
        masks, n_mask = np.unique(g.col("mask")[idx], return_counts=True)
        for m, n in zip(masks.tolist(), n_mask.tolist(), strict=True):
            for name in clocks.names(clocks.throttling(m)):
                counts[name] = counts.get(name, 0) + n
        phases: dict[str, int] = {}
        names = g.phase.names
        for c in g.phase.codes.array()[idx].tolist():
            p = str(names[c])
            phases[p] = phases.get(p, 0) + 1
        reasons = sorted(counts, key=lambda k: -counts[k])
        t = g.col("t")
        phase = max(phases, key=phases.__getitem__)
        clock, temp, power, limit = (_finite(g.col(k)[idx]) for k in ("clock", "temp", "power", "limit"))
        return {
            "gpu": gi,
            "start": float(t[idx[0]]),
            "end": float(t[idx[-1]]),
            "duration_s": float(t[idx[-1]] - t[idx[0]]) + step,
            "ticks": int(idx.size),
            "reasons": {k: counts[k] / idx.size for k in reasons},
            "reason": reasons[0] if reasons else "clock under its maximum",
            "phase": None if phase == "None" else phase,
            "sm_clock_MHz": float(np.median(clock)) if clock.size else None,
            "sm_clock_max_MHz": self.max_clock.get(gi),
            "temp_max_C": float(temp.max()) if temp.size else None,
            "power_W": float(np.median(power)) if power.size else None,
            "power_limit_W": float(np.median(limit)) if limit.size else None,
        }

    def _phases(self) -> dict[str, dict[str, Any]]:
        clocks_by = self._clocks_by_side()
        per_request = self._request_itl()
        out: dict[str, dict[str, Any]] = {}
        for phase in dict.fromkeys(p for p, _ in self._sides):
            inside = self._sides.get((phase, True), _Side())
            outside = self._sides.get((phase, False), _Side())
            total = inside.time_s + outside.time_s
            if inside.time_s <= 0 or total <= 0:
                continue
            c_in, c_out = clocks_by.get((phase, True)), clocks_by.get((phase, False))
            r_in, r_out = inside.rate(), outside.rate()
            lost, basis = _lost(inside.time_s, r_in, r_out, c_in, c_out, self._max_clock())
            out[phase] = {
                "throttled_s": inside.time_s,
                "time_s": total,
                "share": inside.time_s / total,
                "tokens_per_s": {"throttled": r_in, "unthrottled": r_out},
                "tokens": TOKEN_PHASE.get(phase),
                "itl_s": _itl(phase, inside, outside, per_request),
                "sm_clock_MHz": {"throttled": c_in, "unthrottled": c_out},
                "lost_s": lost,
                "lost_basis": basis,
            }
        return out

    def _max_clock(self) -> float | None:
        return max(self.max_clock.values()) if self.max_clock else None

    def _clocks_by_side(self) -> dict[tuple[str, bool], float]:
        vals: dict[tuple[str, bool], list[np.ndarray]] = {}
        for g in self.gpus.values():
            ph = g.phase.mapped(str, object)
            thr, clock, busy = g.col("thr"), g.col("clock"), g.col("busy")
            for p in g.phase.distinct():
                in_p = ph == str(p)
                for side in (True, False):
                    # the unthrottled side: busy ticks only (an idle GPU's clocks drop by design)
                    c = _finite(clock[in_p & (thr == side) & busy])
                    if c.size:
                        vals.setdefault((UNLABELLED if p is None else str(p), side), []).append(c)
        return {k: float(np.median(np.concatenate(v))) for k, v in vals.items()}

    def _request_itl(self) -> dict[bool, float]:
        """llama-server's per-request timings: each request's mean gap between tokens, averaged per side
        (throttled or not) that held most of its decode (its last ``predicted_ms`` before it finished)."""
        if not self._requests or not self._tick_t:
            return {}
        t = self._tick_t.array()
        thr = self._tick_thr.array()
        sums = {True: [0.0, 0.0], False: [0.0, 0.0]}
        for r in self._requests.values():
            end, n, ms = _num(r.get("t")), _num(r.get("predicted_n")), _num(r.get("predicted_ms"))
            if end is None or n is None or ms is None or n < 2 or ms <= 0:
                continue
            a, b = np.searchsorted(t, end - ms / 1e3, "left"), np.searchsorted(t, end, "right")
            if b > a:
                acc = sums[bool(thr[a:b].mean() > 0.5)]
                acc[0] += ms / 1e3
                acc[1] += n - 1
        return {k: v[0] / v[1] for k, v in sums.items() if v[1] > 0}


def _finite(a: np.ndarray) -> np.ndarray:
    return a[np.isfinite(a)]


def _step(t: np.ndarray) -> float:
    """A tick's span: the median spacing of the readings (a reading covers the interval before it)."""
    if t.size < 2:
        return 0.0
    d = np.diff(t[-2000:])
    d = d[d > 0]
    return float(np.median(d)) if d.size else 0.0


def _itl(phase: str, inside: _Side, outside: _Side, per_request: dict[bool, float]) -> dict[str, Any]:
    """Mean inter-token latency inside and outside: the engine's histogram, else its per-request timings."""
    if inside.itl_n or outside.itl_n:
        return {"throttled": inside.itl(), "unthrottled": outside.itl(), "basis": "engine ITL histogram"}
    if phase == "decode" and per_request:
        basis = "per-request decode timings (mean gap), each request on the side that held most of its decode"
        return {"throttled": per_request.get(True), "unthrottled": per_request.get(False), "basis": basis}
    return {"throttled": None, "unthrottled": None, "basis": None}


def _lost(
    thr_s: float,
    r_in: float | None,
    r_out: float | None,
    c_in: float | None,
    c_out: float | None,
    c_max: float | None,
) -> tuple[float | None, str | None]:
    """Seconds the throttled time would have been shorter at the unthrottled rate, and what says so: tokens/s
    inside vs outside; else the SM clock inside vs busy ticks outside; else vs the GPU's highest clock (no
    busy tick ran unthrottled: what the work would gain if it scales with the clock, an upper bound)."""
    if r_in is not None and r_out:
        return max(0.0, thr_s * (1.0 - r_in / r_out)), "tokens/s inside vs outside"
    if c_in is not None and c_out:
        return max(0.0, thr_s * (1.0 - c_in / c_out)), "SM clock inside vs busy ticks outside (no token counts)"
    if c_in is not None and c_max:
        return max(0.0, thr_s * (1.0 - c_in / c_max)), (
            f"SM clock inside vs the GPU's highest, {c_max:,.0f} MHz: no busy tick ran unthrottled and no token "
            "counts; at most this, if the work scales with the clock"
        )
    return None, None


def cut_share(heat: Heat | None, gpu: int, phase: str) -> dict[str, Any] | None:
    """How much of one GPU's phase ran with its clocks cut (None: no clock readings there, or under MIN_SHARE)."""
    st = heat._phase_stats.get((gpu, phase)) if heat is not None else None
    if st is None or not st.n or st.k / st.n < MIN_SHARE:
        return None
    names: Counter[str] = Counter()
    for m, c in st.masks.items():
        for name in clocks.names(clocks.throttling(m)):
            names[name] += c
    return {
        "share": st.k / st.n,
        "reasons": [n for n, _ in names.most_common()],
        "sm_clock_MHz": st.clock_median(),
        "sm_clock_max_MHz": heat.max_clock.get(gpu) if heat is not None else None,
    }
