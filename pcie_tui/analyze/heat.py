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

from collections import Counter, deque
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from pcie_tui.analyze import retire
from pcie_tui.analyze.columns import COL, Chunk
from pcie_tui.analyze.fold import Tally, split_old
from pcie_tui.analyze.series import Col
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


STEP_TICKS = 2000  # a tick's span is the median spacing of a GPU's last this many readings (_step)
REQUEST_TICKS = 36_000  # the newest session ticks kept to place a finished request's decode (an hour at 10 Hz)
REQUEST_IDS = 8192  # the newest request identities kept to drop a request a later scrape repeats
EVENTS_KEPT = 200  # the newest throttled stretches kept as events (what the events box shows at most)


def counter_median(c: Counter[float]) -> float | None:
    """The median of the values a Counter counts, as numpy's median of the same values (None: none)."""
    total = sum(c.values())
    if not total:
        return None
    keys = sorted(c)
    cum = np.cumsum([c[k] for k in keys])

    def at(i: int) -> float:
        return float(keys[int(np.searchsorted(cum, i, "right"))])

    return at(total // 2) if total % 2 else (at(total // 2 - 1) + at(total // 2)) / 2


def count_into(c: Counter[Any], a: np.ndarray) -> None:
    """Add each value of ``a`` (finite ones, for floats) to ``c``, at numpy speed."""
    if a.dtype.kind == "f":
        a = a[np.isfinite(a)]
    if a.size:
        vals, n = np.unique(a, return_counts=True)
        c.update(dict(zip(vals.tolist(), n.tolist(), strict=True)))


def _max(cur: float | None, a: np.ndarray, fn: Any = np.max) -> float | None:
    a = a[np.isfinite(a)]
    if not a.size:
        return cur
    v = float(fn(a))
    return v if cur is None else (max(cur, v) if fn is np.max else min(cur, v))


@dataclass(slots=True)
class _Stretch:
    """What a throttled stretch's line in the report needs, summed tick by tick (no per-tick columns)."""

    start: float
    end: float
    ticks: int = 0
    masks: Counter[int] = field(default_factory=Counter)
    phases: dict[str, int] = field(default_factory=dict)  # str(phase) ("None" for none), in first-seen order
    clock: Counter[float] = field(default_factory=Counter)
    power: Counter[float] = field(default_factory=Counter)
    limit: Counter[float] = field(default_factory=Counter)
    temp_max: float | None = None
    medians: tuple[float | None, ...] | None = None  # once closed: clock, power and limit medians (_seal)

    def median(self, k: int) -> float | None:
        """The median of the clock (0), power (1) or limit (2) readings of its ticks."""
        if self.medians is not None:
            return self.medians[k]
        return counter_median((self.clock, self.power, self.limit)[k])


_SEALED: Counter[float] = Counter()  # a closed stretch's (empty, never written) counters


@dataclass
class _Gpu:
    """One GPU's ticks with a clock-event reading, as counts and sums: a day-long live session keeps no
    per-tick columns here (medians come from counts of the values, exact: clocks step in MHz, power in mW)."""

    ticks: int = 0
    throttled: int = 0
    temp_max: float | None = None
    clock_min: float | None = None  # the lowest SM clock of a throttled tick
    masks: Counter[int] = field(default_factory=Counter)  # ticks per clock-event reasons bitmask
    busy_clocks: dict[tuple[str, bool], Counter[float]] = field(default_factory=dict)  # (phase, throttled)
    recent_t: np.ndarray = field(default_factory=lambda: np.zeros(0))  # the last STEP_TICKS reading times
    stretches: list[_Stretch] = field(default_factory=list)


@dataclass(slots=True)
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
        return counter_median(self.clocks)


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
        # Finished requests (llama-server's per-request timings), each placed on the side (throttled or not)
        # that held most of its decode once a tick past its end has come: (end, ms, n) waiting, sums placed.
        self._req_ids: dict[tuple[Any, ...], None] = {}
        self._req_pending: deque[tuple[float, float, float]] = deque()
        self._req_sums = {True: [0.0, 0.0], False: [0.0, 0.0]}
        self._recent_t = Col()  # the newest REQUEST_TICKS session ticks (to place a request's decode)
        self._recent_thr = Col(np.bool_)
        self._span: tuple[float, float] | None = None  # the first and last tick with a clock reading
        self._n = 0
        self._cache: tuple[int, dict[str, Any]] | None = None
        self._phase_stats: dict[tuple[int, str], _PhaseStat] = {}
        self.events: list[ThrottleEvent] = []  # the newest stretches, in order (live: the last may be open)
        self._events_dropped = 0  # older ones, no longer listed (the report has them: stretches, folded)
        self._open: dict[int, ThrottleEvent] = {}
        # A long session's old stretches beyond the longest, per GPU, reason and phase (analyze/fold.py)
        self._folded: dict[int, dict[tuple[str, str | None], Tally]] = {}
        self._fold_r = 0  # the session's ticks folded up to: this many times RETIRE_TICKS

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
        self._fold_old()

    def events_count(self) -> int:
        """Throttled stretches so far (:attr:`events` holds the newest :data:`EVENTS_KEPT` or more)."""
        return len(self.events) + self._events_dropped

    def _fold_old(self) -> None:
        """As a GPU's series retires its ticks (analyze/retire.py), stretches that ended before the session's
        tick ``EXACT_TICKS`` back (counted in ``RETIRE_TICKS``) are folded, a GPU's longest kept whole; and
        the events box's oldest stretches beyond :data:`EVENTS_KEPT` are no longer listed."""
        if len(self.events) > EVENTS_KEPT + EVENTS_KEPT // 4:  # a fifth at a time: amortised
            drop = len(self.events) - EVENTS_KEPT
            self._events_dropped += drop
            del self.events[:drop]
        r = (self._n - retire.EXACT_TICKS) // retire.RETIRE_TICKS
        if r <= self._fold_r:
            return
        self._fold_r = r
        cutoff = float(self._recent_t.array()[r * retire.RETIRE_TICKS - (self._n - len(self._recent_t))])
        for gi, g in self.gpus.items():
            g.stretches, gone = split_old(
                g.stretches, lambda st: st.end < cutoff, lambda st: (st.start - st.end, st.start)
            )
            tallies = self._folded.setdefault(gi, {})
            for st in gone:
                phase = max(st.phases, key=st.phases.__getitem__)
                names = _reasons(st)[0]
                key = (names[0] if names else "clock under its maximum", None if phase == "None" else phase)
                tallies.setdefault(key, Tally()).add(st.start, st.end, st.ticks, peak=st.temp_max)

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
            val = {name: ch.cols[COL[key]][sel] for name, key in _GPU_COLS.items()}
            mask = ch.cols[COL["clock_events"]][sel].astype(np.int64)
            thr_g = thr[sel]
            # working: SM use at BUSY_SM or more, or unknown while the reasons do not say idle (0x1)
            busy = ~(ch.cols[COL["sm_util"]][sel] < BUSY_SM) & ((mask & 0x1) == 0)
            phases = [ch.phase[i] for i in ch.tick_of[sel].tolist()]
            self._sum_gpu(g, t_all[sel], thr_g, mask, val, busy, phases)
            self._count(int(gi), phases, thr_g, mask, val["clock"])
            self._grow(int(gi), t_all[sel], thr_g, mask, val, phases)
        last = ch.t[-1]
        for ev in self._open.values():
            ev.open = last - ev.end <= MERGE_S

    @staticmethod
    def _sum_gpu(
        g: _Gpu,
        t: np.ndarray,
        thr: np.ndarray,
        mask: np.ndarray,
        val: dict[str, np.ndarray],
        busy: np.ndarray,
        phases: list[Any],
    ) -> None:
        """A GPU's counts and extremes, and per phase and side the SM clocks of its busy ticks."""
        g.ticks += int(t.size)
        g.throttled += int(thr.sum())
        g.temp_max = _max(g.temp_max, val["temp"])
        g.clock_min = _max(g.clock_min, val["clock"][thr], np.min)
        count_into(g.masks, mask)
        g.recent_t = np.concatenate([g.recent_t, t])[-STEP_TICKS:]
        ph = np.array([str(p) for p in phases], dtype=object)
        for p in dict.fromkeys(phases):
            in_p = (ph == str(p)) & busy
            for side in (True, False):
                key = (UNLABELLED if p is None else str(p), side)
                count_into(g.busy_clocks.setdefault(key, Counter()), val["clock"][in_p & (thr == side)])

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
        self, gi: int, t: np.ndarray, thr: np.ndarray, mask: np.ndarray, val: dict[str, np.ndarray], phases: list[Any]
    ) -> None:
        """The stretches: each throttled tick extends its GPU's open one or starts the next."""
        clock = val["clock"]
        for j in np.flatnonzero(thr).tolist():
            tj = float(t[j])
            ev = self._open.get(gi)
            if ev is None or tj - ev.end > MERGE_S:
                if ev is not None:
                    ev.open = False
                ev = self._open[gi] = ThrottleEvent(gi, tj, tj)
                self.events.append(ev)
                if self.gpus[gi].stretches and self.gpus[gi].stretches[-1].medians is None:
                    _seal(self.gpus[gi].stretches[-1])
                self.gpus[gi].stretches.append(_Stretch(tj, tj))
            ev.end = tj
            ev.mask |= clocks.throttling(int(mask[j]))
            c = float(clock[j])
            if c == c and (ev.clock_min_MHz is None or c < ev.clock_min_MHz):
                ev.clock_min_MHz = c
            if phases[j] is not None:
                ev.phases[str(phases[j])] = ev.phases.get(str(phases[j]), 0) + 1
            _add_tick(self.gpus[gi].stretches[-1], tj, int(mask[j]), str(phases[j]), val, j)

    def _ticks(self, ch: Chunk, thr: np.ndarray, known: np.ndarray) -> None:
        """Each tick's time to its phase's side (throttled or not), then the engine's counters tick by tick."""
        t = np.asarray(ch.t, dtype=np.float64)
        dt = np.diff(t, prepend=self._t_prev if self._t_prev is not None else t[0])
        dt[(dt <= 0) | (dt > MAX_DT_S)] = 0.0
        self._t_prev = ch.t[-1]
        self._span = (self._span[0] if self._span else ch.t[0], ch.t[-1])
        had = len(self._recent_t)
        self._recent_t.extend(ch.t)
        self._recent_thr.extend(thr)
        if had < retire.RETIRE_TICKS <= len(self._recent_t):  # the room its bound needs, at once (as a series')
            self._recent_t.reserve(REQUEST_TICKS + REQUEST_TICKS // 8 + 1)
            self._recent_thr.reserve(REQUEST_TICKS + REQUEST_TICKS // 8 + 1)
        if len(self._recent_t) > REQUEST_TICKS + REQUEST_TICKS // 8:  # an eighth at a time: amortised, bounded
            self._recent_t.drop_first(len(self._recent_t) - REQUEST_TICKS)
            self._recent_thr.drop_first(len(self._recent_thr) - REQUEST_TICKS)
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
        self._place_requests(False)

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
                self._new_request(r)

    def _new_request(self, r: dict[str, Any]) -> None:
        """A finished request seen for the first time waits (in order) for a tick past its end."""
        key = tuple(r.get(k) for k in REQUEST_IDENTITY)
        if key in self._req_ids:
            return
        self._req_ids[key] = None
        if len(self._req_ids) > REQUEST_IDS:
            del self._req_ids[next(iter(self._req_ids))]
        end, n, ms = _num(r.get("t")), _num(r.get("predicted_n")), _num(r.get("predicted_ms"))
        if end is None or n is None or ms is None or n < 2 or ms <= 0:
            return
        self._req_pending.append((end, ms, n))

    def _place_requests(self, all_now: bool) -> dict[bool, list[float]]:
        """Place the waiting requests whose decode the ticks now cover (first come, first placed: the sums'
        order is the requests'); ``all_now``: also the rest, against the ticks so far, without keeping them."""
        t, thr = self._recent_t.array(), self._recent_thr.array()
        pending = self._req_pending
        while pending and t.size and pending[0][0] < t[-1]:
            _place(self._req_sums, t, thr, *pending.popleft())
        sums = {k: list(v) for k, v in self._req_sums.items()}
        if all_now and t.size:
            for p in pending:
                _place(sums, t, thr, *p)
        return sums

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
        # "upper": some phase's loss is the clock ratio against the GPU's highest clock (an upper bound);
        # "partial": some phase that ran throttled has no loss figure at all (not counted in the sum)
        bound = "upper" if any((p["lost_basis"] or "").startswith("SM clock inside vs the GPU's highest") for p in
                               phases.values()) else None  # fmt: skip
        unknown = [ph for ph, p in phases.items() if p["lost_s"] is None]
        span = (self._span[1] - self._span[0]) if self._span else 0.0
        out = {
            "gpus": {str(gi): self._gpu_summary(gi) for gi in sorted(self.gpus)},
            "stretches": stretches,
            **({"stretches_folded": self._folded_json()} if any(self._folded.values()) else {}),
            "phases": phases,
            "lost_s": lost,
            "lost_share": lost / span if span > 0 else None,
            "lost_is_upper_bound": bound == "upper",
            "lost_unknown_phases": unknown,
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
        reasons: dict[str, int] = {}
        for m in sorted(g.masks):
            for name in clocks.names(m):
                reasons[name] = reasons.get(name, 0) + g.masks[m]
        return {
            "ticks": g.ticks,
            "throttled_ticks": g.throttled,
            "temp_max_C": g.temp_max,
            "sm_clock_min_MHz": g.clock_min,  # while throttled
            "sm_clock_max_MHz": self.max_clock.get(gi),
            "reason_ticks": reasons,
        }

    def _stretches(self, gi: int) -> list[dict[str, Any]]:
        g = self.gpus[gi]
        step = _step(g.recent_t)
        return [self._stretch(gi, st, step) for st in g.stretches]

    def _folded_json(self) -> list[dict[str, Any]]:
        """A long session's folded stretches (analyze/fold.py), per GPU, reason and phase: how many, their ticks
        and seconds (each ``end - start`` plus a tick's span, as a listed stretch's), when, the hottest."""
        out = []
        for gi in sorted(self._folded):
            step = _step(self.gpus[gi].recent_t)
            for (reason, phase), t in sorted(self._folded[gi].items(), key=lambda kv: (kv[0][0], kv[0][1] or "")):
                out.append({"gpu": gi, "reason": reason, "phase": phase, "stretches": t.count, "ticks": t.ticks,
                            "duration_s": float(t.seconds) + t.count * step, "first_start": t.first,
                            "last_end": t.last, "temp_max_C": t.peak})  # fmt: skip
        return out

    def _stretch(self, gi: int, st: _Stretch, step: float) -> dict[str, Any]:
        reasons, counts = _reasons(st)
        phase = max(st.phases, key=st.phases.__getitem__)
        return {
            "gpu": gi,
            "start": st.start,
            "end": st.end,
            "duration_s": st.end - st.start + step,
            "ticks": st.ticks,
            "reasons": {k: counts[k] / st.ticks for k in reasons},
            "reason": reasons[0] if reasons else "clock under its maximum",
            "phase": None if phase == "None" else phase,
            "sm_clock_MHz": st.median(0),
            "sm_clock_max_MHz": self.max_clock.get(gi),
            "temp_max_C": st.temp_max,
            "power_W": st.median(1),
            "power_limit_W": st.median(2),
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
        merged: dict[tuple[str, bool], Counter[float]] = {}
        for g in self.gpus.values():
            for key, c in g.busy_clocks.items():
                if c:
                    merged.setdefault(key, Counter()).update(c)
        return {k: m for k, c in merged.items() if (m := counter_median(c)) is not None}

    def _request_itl(self) -> dict[bool, float]:
        """llama-server's per-request timings: each request's mean gap between tokens, averaged per side
        (throttled or not) that held most of its decode (its last ``predicted_ms`` before it finished)."""
        sums = self._place_requests(True)
        return {k: v[0] / v[1] for k, v in sums.items() if v[1] > 0}


def _place(sums: dict[bool, list[float]], t: np.ndarray, thr: np.ndarray, end: float, ms: float, n: float) -> None:
    """One finished request's decode (``ms`` before ``end``, ``n`` tokens) to the side most of its ticks were on."""
    a, b = np.searchsorted(t, end - ms / 1e3, "left"), np.searchsorted(t, end, "right")
    if b > a:
        acc = sums[bool(thr[a:b].mean() > 0.5)]
        acc[0] += ms / 1e3
        acc[1] += n - 1


def _reasons(st: _Stretch) -> tuple[list[str], dict[str, int]]:
    """A stretch's clock-cutting reasons, most ticks first, and their ticks; the first, what its line names
    ("clock under its maximum" where none is set)."""
    counts: dict[str, int] = {}
    for m in sorted(st.masks):
        for name in clocks.names(clocks.throttling(m)):
            counts[name] = counts.get(name, 0) + st.masks[m]
    return sorted(counts, key=lambda k: -counts[k]), counts


def _seal(st: _Stretch) -> None:
    """A stretch that has closed keeps of its clocks and power only their medians (what its line shows): a
    day-long session's stretches stay a few hundred bytes each."""
    st.medians = (st.median(0), st.median(1), st.median(2))
    st.clock = st.power = st.limit = _SEALED


def _add_tick(st: _Stretch, t: float, mask: int, phase: str, val: dict[str, np.ndarray], j: int) -> None:
    """One throttled tick into its stretch."""
    st.end = t
    st.ticks += 1
    st.masks[mask] += 1
    st.phases[phase] = st.phases.get(phase, 0) + 1
    for name, c in (("clock", st.clock), ("power", st.power), ("limit", st.limit)):
        v = float(val[name][j])
        if np.isfinite(v):
            c[v] += 1
    temp = float(val["temp"][j])
    if np.isfinite(temp) and (st.temp_max is None or temp > st.temp_max):
        st.temp_max = temp


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
