"""What the screen shows, built off the UI thread.

The worker thread feeds every Sample into :class:`ViewModel` (which runs the
:class:`SessionAnalyzer`), and at most twice a second asks it for a
:class:`Frame` (:mod:`pcie_tui.tui.frame`): an immutable snapshot that the UI
thread only renders. No Textual here, so the model can be tested and timed on
its own.
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Sequence
from typing import Any

from pcie_tui.analyze.analysis import FACT_EVENTS, Analysis
from pcie_tui.analyze.answer import finding_lines
from pcie_tui.analyze.engine import EngineStats
from pcie_tui.analyze.result import Answer
from pcie_tui.analyze.session import SessionAnalyzer
from pcie_tui.analyze.verdict import DEFAULT_THRESHOLDS, Thresholds, tick_ceiling
from pcie_tui.core.model import GpuSample, Sample, SessionHeader
from pcie_tui.engines import registry
from pcie_tui.tui.frame import EventView, Frame, GpuView, ReplayView
from pcie_tui.tui.headline import headline_text
from pcie_tui.tui.seen import EngineFiguresSeen, FiguresSeen

# Ticks of history kept per GPU for the sparklines (30 s at 10 Hz).
HISTORY_TICKS = 300
# Events shown in the pane (newest); the analyzer keeps them all.
MAX_EVENTS_SHOWN = 200
# A tick whose GPM window came back empty shows the previous DRAM reading for this long, then n/a.
DRAM_HOLD_S = 0.5
# The engine's tokens/s history (the shared timeline) is the counters' rise over this much time before each tick.
TOKENS_WINDOW_S = 1.0
# The headline's answer is worked out over every tick so far (medians, as report does) once per this
# much of the session's own time (and at once after a seek, a phase change or when the source ended).
ANSWER_REFRESH_S = 1.0
ANSWER_TICKS_AT_1S = 36_000  # an hour at 10 Hz
# Ticks fed wait for the analysis until it is next read (a frame), at most this many (ViewModel.feed).
UNFED_MAX = 64


class _GpuHistory:
    __slots__ = (
        "tx",
        "rx",
        "nvl",
        "dram",
        "busy",
        "phase",
        "t",
        "peak_tx",
        "peak_rx",
        "sample",
        "nvlink_seen",
        "dram_seen",
        "last_dram",
        "last_dram_t",
        "t_now",
    )

    def __init__(self, n: int) -> None:
        self.tx: deque[float | None] = deque(maxlen=n)
        self.rx: deque[float | None] = deque(maxlen=n)
        self.nvl: deque[float | None] = deque(maxlen=n)
        self.dram: deque[float | None] = deque(maxlen=n)
        self.busy: deque[float | None] = deque(maxlen=n)
        self.phase: deque[str | None] = deque(maxlen=n)
        self.t: deque[float] = deque(maxlen=n)
        self.peak_tx: float | None = None
        self.peak_rx: float | None = None
        self.sample: GpuSample | None = None
        self.nvlink_seen = False
        self.dram_seen = False
        self.last_dram: float | None = None
        self.last_dram_t = 0.0
        self.t_now = 0.0


def _max(a: float | None, b: float | None) -> float | None:
    if a is None:
        return b
    return a if b is None or a >= b else b


class ViewModel:
    """Analysis state for the screen; fed in time order by one thread at a time."""

    def __init__(
        self,
        header: SessionHeader,
        thresholds: Thresholds | None = None,
        history_ticks: int = HISTORY_TICKS,
        events: Sequence[dict[str, Any]] = (),
    ) -> None:
        self.header = header
        # The recording's events (engine_ready completes the header's facts; a replay knows them all)
        # and the live ones noted since (note_events): a rebuild after a seek starts from all of them.
        self.events: list[dict[str, Any]] = [e for e in events if isinstance(e, dict)]
        self._source_events = len(events)  # a recording still being read adds to its events: noted here
        self.thresholds = thresholds or DEFAULT_THRESHOLDS
        self.history_ticks = history_ticks
        self.seq = 0
        self.generation = 0  # the replay generation this state belongs to
        # The figures the session has a reading of (the ? page): live the ticks fed, a replay its whole
        # recording (replay_view scans it), so a seek leaves them be.
        self.figures = FiguresSeen()
        self.engine_figures = EngineFiguresSeen()  # the engine panel's, from the statistics of each frame
        self.reset()

    def reset(self) -> None:
        # The one analysis (the same as report's and the exporter's); its answer is "so far".
        self._analysis = Analysis(self.header, self.events, self.thresholds)
        self._unfed: list[Sample] = []  # ticks fed, not yet analysed (ViewModel.feed)
        self._unremembered: list[tuple[int, Sample, float | None]] = []  # their history: (in _unfed, tick, tok/s)
        self._answer: tuple[float, Any, Answer] | None = None
        self._lines: tuple[Answer, tuple[str, ...]] | None = None
        self.hist: dict[int, _GpuHistory] = {}
        self.engine_running: deque[float | None] = deque(maxlen=self.history_ticks)
        self.engine_phase: deque[str | None] = deque(maxlen=self.history_ticks)
        self.engine_t: deque[float] = deque(maxlen=self.history_ticks)
        self.engine_tokens: deque[float | None] = deque(maxlen=self.history_ticks)  # prompt + generated tok/s
        self._token_counts: deque[tuple[float, float]] = deque()  # (t, tokens so far) within the window
        self._token_ticks: deque[tuple[float, Any]] = deque()  # (t, engine reading) within the window
        self._tok_rate: float | None = None  # the last tick's tokens/s
        self.n = 0  # ticks fed = replay index of the next tick
        self.last: Sample | None = None
        self.engine_stats = self._new_engine_stats()

    @property
    def analysis(self) -> Analysis:
        """The one analysis (the same as report's and the exporter's), every tick fed so far in it."""
        if self._unfed:
            self._flush()
        return self._analysis

    @property
    def analyzer(self) -> SessionAnalyzer:
        return self.analysis.session

    @property
    def engine_info(self) -> dict[str, Any] | None:
        return self.analysis.engine_info

    @property
    def phase(self) -> str | None:
        """The phase of the last tick fed, by the session's one phase rule (the analysis')."""
        return self.analysis.phase

    def _new_engine_stats(self) -> EngineStats:
        return EngineStats(window_s=10.0)

    def feed(self, s: Sample, *, history: bool = True) -> None:
        """One tick: verdicts and events, attribution, history, engine statistics. The analysis takes the
        ticks when it is next read (a frame, :attr:`analysis`), in one chunk: the same verdicts, events and
        phases as tick by tick (tests/test_chunks_equal_ticks.py), at a third of the cost with 8 GPUs
        (issue 22); the ticks' history, which holds their phases, is kept then."""
        self._unfed.append(s)
        self.n += 1
        self.last = s
        self.figures.note(s)
        if self.engine_stats is not None and s.engine is not None:
            self.engine_stats.feed(s)
            self.engine_figures.note(None, s.engine, None)  # its request counts, at every tick fed
        self._tok_rate = self._tokens_per_s(s.t, s.engine)
        if history:
            self._unremembered.append((len(self._unfed) - 1, s, self._tok_rate))
        if len(self._unfed) >= UNFED_MAX:
            self._flush()

    def _analyse(self, s: Sample) -> None:
        """Verdicts, events and the per-tick series of the one analysis (fed with the next chunk)."""
        self._unfed.append(s)
        if len(self._unfed) >= UNFED_MAX:
            self._flush()

    def _flush(self) -> None:
        """The ticks fed since the analysis was last read, analysed in one chunk, then their history kept."""
        if not self._unfed:
            return
        ticks, self._unfed = self._unfed, []
        phases = self._analysis.feed_chunk(ticks)
        remember, self._unremembered = self._unremembered, []
        for i, s, tok_rate in remember:
            self._remember(s, phases[i], tok_rate)

    def _analyse_many(self, samples: Sequence[Sample], a: int, b: int) -> None:
        """``_analyse`` of ``samples[a:b]``, the analysis fed in chunks (a seek over an hour of ticks)."""
        self.analysis.feed_all(samples[a:b])

    def _remember(self, s: Sample, phase: str | None, tok_rate: float | None) -> None:
        e = s.engine
        self.engine_running.append(e.requests_running if e is not None and e.up else None)
        self.engine_phase.append(phase)
        self.engine_t.append(s.t)
        self.engine_tokens.append(tok_rate)
        for g in s.gpus:
            h = self.hist.get(g.index)
            if h is None:
                h = self.hist[g.index] = _GpuHistory(self.history_ticks)
            nvl = _max(g.nvlink_tx_Bps, g.nvlink_rx_Bps)
            h.tx.append(g.pcie_tx_Bps)
            h.rx.append(g.pcie_rx_Bps)
            h.nvl.append(nvl)
            h.dram.append(g.dram_bw_util)
            h.busy.append(g.mem_busy)
            if g.dram_bw_util is not None:
                h.dram_seen = True
                h.last_dram, h.last_dram_t = g.dram_bw_util, s.t
            h.t_now = s.t
            h.phase.append(phase)
            h.t.append(s.t)
            h.peak_tx = _max(h.peak_tx, g.pcie_tx_Bps)
            h.peak_rx = _max(h.peak_rx, g.pcie_rx_Bps)
            h.sample = g
            h.nvlink_seen = h.nvlink_seen or nvl is not None

    def _tokens_per_s(self, t: float, e: Any) -> float | None:
        """Prompt + generated tokens a second over the last :data:`TOKENS_WINDOW_S`: the engine's live counts
        where it has them (llama-server's /slots: its counters move only when a request ends), else its
        counters (None without them, before two readings, or across a counter reset: an engine restart)."""
        counter_rate = self._counter_tokens_per_s(t, e)
        live = self._live_tokens_per_s(t, e)
        return live if live is not None else counter_rate

    def _live_tokens_per_s(self, t: float, e: Any) -> float | None:
        win = self._token_ticks
        if e is None or not e.up or (win and t - win[-1][0] > 2 * TOKENS_WINDOW_S):
            win.clear()
        if e is None or not e.up:
            return None
        win.append((t, e))
        while len(win) > 2 and win[1][0] <= t - TOKENS_WINDOW_S:
            win.popleft()
        engine = registry.get(e.kind)
        if engine is None or len(win) < 2:
            return None
        ticks = list(win)
        got = [engine.live_tokens(ticks, what) for what in ("prompt", "generation")]
        rates = [n / s for n, s, _src in (g for g in got if g is not None) if s > 0]
        return sum(rates) if rates else None

    def _counter_tokens_per_s(self, t: float, e: Any) -> float | None:
        counts = self._token_counts
        total = None
        if e is not None and e.up and (e.prompt_tokens_total is not None or e.generation_tokens_total is not None):
            total = (e.prompt_tokens_total or 0.0) + (e.generation_tokens_total or 0.0)
        if total is None or (counts and (total < counts[-1][1] or t - counts[-1][0] > 2 * TOKENS_WINDOW_S)):
            counts.clear()
            if total is None:
                return None
        counts.append((t, total))
        while len(counts) > 2 and counts[1][0] <= t - TOKENS_WINDOW_S:
            counts.popleft()
        t0, c0 = counts[0]
        return (total - c0) / (t - t0) if t > t0 else None

    def rebuild(self, samples: Sequence[Sample], upto: int) -> None:
        """State as if ``samples[0:upto]`` had been fed (after a seek backwards)."""
        self.reset()
        self.advance(samples, upto)

    def advance(self, samples: Sequence[Sample], upto: int) -> None:
        """Feed ``samples[self.n:upto]`` (a seek forwards analyses what it skips)."""
        upto = max(0, min(upto, len(samples)))
        if upto <= self.n:
            return
        hist_from = max(self.n, upto - self.history_ticks)
        stats_from = upto
        if self.engine_stats is not None:
            t_end = samples[upto - 1].t
            stats_from = upto - 1
            # Counters need the tick before the window too.
            while stats_from > self.n and samples[stats_from - 1].t >= t_end - self.engine_stats_window_s() - 1.0:
                stats_from -= 1
        tok_from = hist_from  # the tokens/s of the first tick of history need the counters before it
        while tok_from > self.n and samples[tok_from - 1].t >= samples[hist_from].t - 2 * TOKENS_WINDOW_S:
            tok_from -= 1
        quiet_to = min(hist_from, stats_from, tok_from)  # ticks before this are only analysed
        if quiet_to - self.n >= 64:
            self._analyse_many(samples, self.n, quiet_to)
            self.n = quiet_to
        feed = self._analyse
        for i in range(self.n, upto):
            s = samples[i]
            if i >= hist_from or i >= stats_from:
                self.n = i
                self.feed(s, history=i >= hist_from)
            else:
                feed(s)
                if i >= tok_from:
                    self._tok_rate = self._tokens_per_s(s.t, s.engine)
        self.n = upto
        self._flush()
        for h in self.hist.values():
            h.peak_tx = h.peak_rx = None

    def sync_replay(self, src: Any, s: Sample | None) -> bool:
        """Bring the model to a replay source's position; True if it jumped (seek or loop).

        ``s`` is the tick ``src.read()`` just returned (None when only resyncing).
        A seek may land before or after that read, so which one it was is told
        by whether ``s`` is the tick just before the new position.
        """
        samples = src.samples
        while True:
            gen = src.generation
            pos = src.position
            if src.generation == gen:
                break
        if gen == self.generation and s is not None and self.n < len(samples) and samples[self.n] is s:
            self.feed(s)
            return False
        if gen == self.generation and s is None and pos == self.n:
            return False
        fed = s is not None and 0 < pos <= len(samples) and samples[pos - 1] is s
        target = pos - 1 if fed else pos
        if target < self.n:
            self.rebuild(samples, target)
        else:
            self.advance(samples, target)
        self.generation = gen
        if fed:
            assert s is not None
            self.feed(s)
        return True

    def replay_view(self, src: Any) -> ReplayView:
        samples = src.samples
        rec_events = getattr(getattr(src, "recording", None), "events", None)
        if rec_events is not None and len(rec_events) > self._source_events:  # read since: their facts count
            new = list(rec_events[self._source_events :])
            self._source_events += len(new)
            self.note_events(new)
        loading = src.loading_text() if hasattr(src, "loading_text") else None
        self.figures.scan(samples, read_whole=loading is None)
        i = min(max(self.n - 1, 0), len(samples) - 1)
        return ReplayView(
            position=self.n,
            total=len(samples),
            speed=float(src.speed),
            paused=bool(src.paused),
            start_t=samples[0].t,
            end_t=samples[-1].t,
            current_t=samples[i].t,
            loading=loading,
        )

    def engine_stats_window_s(self) -> float:
        return float(getattr(self.engine_stats, "window_s", 10.0))

    # ---- frames -----------------------------------------------------------

    def answer(self) -> Answer:
        """The one analysis' answer so far, worked out again once :data:`ANSWER_REFRESH_S` of the
        session's own time has passed (at once after a seek, a phase change or new engine facts, and
        once the source ended): live that is once a second, whatever the frame rate."""
        key = (self.analysis.ended, self.phase, id(self.analysis.facts), self.generation)
        t = self.analysis.session.t_last or 0.0
        hit = self._answer
        # A long session's answer walks every tick so far: past ANSWER_TICKS_AT_1S ticks it is worked out
        # less often, in proportion (once a second for the first hour at 10 Hz, every 8 s after 8 hours).
        every = ANSWER_REFRESH_S * max(1.0, self.analysis.session.n / ANSWER_TICKS_AT_1S)
        if hit is None or hit[1] != key or not 0.0 <= t - hit[0] < every:
            hit = self._answer = (t, key, self.analysis.answer())
        return hit[2]

    def findings_lines(self) -> tuple[str, ...]:
        """The answer's "What held each phase back" lines (:func:`finding_lines`), kept with the answer."""
        ans = self.answer()
        hit = self._lines
        if hit is None or hit[0] is not ans:
            hit = self._lines = (ans, tuple(finding_lines(ans.to_json()["findings"])))
        return hit[1]

    def frame(self, replay: ReplayView | None = None, ended: bool = False) -> Frame:
        """Snapshot for the UI; resets the between-frames peaks. A source that ended (live, or a
        replay at its last tick) gives the final answer: exactly what ``report`` says."""
        self._flush()
        if ended or (replay is not None and replay.total and self.n >= replay.total):
            self.analysis.finish()
        self.seq += 1
        an = self.analyzer
        t0 = an.t0
        events = an.events[-MAX_EVENTS_SHOWN:]
        ev_views = tuple(EventView.of(e, t0) for e in events) if t0 is not None else ()
        gpus = []
        indices = sorted(set(self.hist) | {g.index for g in self.header.gpus})
        for idx in indices:
            gpus.append(self._gpu_view(idx, ev_views))
        health = an.health_events()  # throttled stretches and link-health events share the events box
        if health and t0 is not None:
            more = tuple(EventView.of_health(e, t0) for e in health[-MAX_EVENTS_SHOWN:])
            ev_views = tuple(sorted(ev_views + more, key=lambda v: v.start_s))[-MAX_EVENTS_SHOWN:]
        engine = self.last.engine if self.last is not None else None
        stats = None
        if self.engine_stats is not None and engine is not None:
            stats = self.engine_stats.snapshot()
            eng = registry.get(engine.kind)
            why = eng.timings_unavailable(self.engine_info or {}) if eng is not None else None
            if why is not None:  # not "from llama-server's log timings" when no log is read
                stats["quantile_method"] = why
        placement = self._placement()
        self.engine_figures.note(stats, engine, placement)
        return Frame(
            seq=self.seq,
            ticks=self.n,
            t=self.last.t if self.last is not None else None,
            t_rel=(self.last.t - t0) if self.last is not None and t0 is not None else None,
            phase=self.phase,
            gpus=tuple(gpus),
            events=ev_views,
            events_total=an.events_count(),
            engine=engine,
            engine_stats=stats,
            engine_stats_available=True,
            replay=replay,
            ended=ended,
            engine_hist_start=self.n - len(self.engine_running),
            engine_hist_running=tuple(self.engine_running),
            engine_hist_phase=tuple(self.engine_phase),
            engine_hist_tokens=tuple(self.engine_tokens),
            engine_hist_span_s=(self.engine_t[-1] - self.engine_t[0]) if len(self.engine_t) > 1 else 0.0,
            built_s=time.monotonic(),
            headline=headline_text(self),
            findings=self.findings_lines(),
            answer_final=self.analysis.ended,
            placement=placement,
            figures=self.figures.snapshot(),
            figures_whole=self.figures.whole,
            engine_figures=self.engine_figures.snapshot(),
        )

    def note_events(self, events: Sequence[dict[str, Any]]) -> None:
        """Live events of the source: an engine that became ready brings its complete facts."""
        if self.analysis.note_events(events):  # kept for a rebuild: the ones that bring facts, no others
            self.events += [e for e in events if isinstance(e, dict) and e.get("event") in FACT_EVENTS]

    def _placement(self) -> str | None:
        """The engine's facts in one line: what it keeps in host memory, and in what kind of memory."""
        fx = self.analysis.facts
        if fx is None or not fx.host_weights:
            return None
        return f"{fx.host_weights}" + (f" · {fx.host_memory_why}" if fx.host_memory_why else "")

    def _gpu_view(self, idx: int, events: tuple[EventView, ...]) -> GpuView:
        info = self.header.gpu(idx)
        h = self.hist.get(idx) or _GpuHistory(1)
        tracker = self.analyzer.trackers.get(idx)
        c = tick_ceiling(info, h.sample, tracker.observed if tracker is not None else {})
        ceiling, kind = c.Bps, c.source
        # Same rule as the verdict: a GPU with GPM never switches to the duty-cycle proxy.
        basis: str | None = None
        mem_util: float | None = None
        if h.dram_seen or (info is not None and info.metrics_source == "gpm"):
            basis = "gpm"
            if h.last_dram is not None and h.t_now - h.last_dram_t <= DRAM_HOLD_S:
                mem_util = h.last_dram
        elif any(v is not None for v in h.busy):
            basis = "proxy"
            mem_util = h.sample.mem_busy if h.sample is not None else None
        view = GpuView(
            index=idx,
            info=info,
            sample=h.sample,
            util=tracker.last_util if tracker is not None else None,
            verdict=tracker.verdict if tracker is not None else "none",
            ceiling_Bps=ceiling,
            ceiling_kind=kind,
            peak_tx_Bps=h.peak_tx,
            peak_rx_Bps=h.peak_rx,
            open_events=tuple(e for e in events if e.gpu == idx and e.end_s is None),
            has_nvlink=h.nvlink_seen or bool(info is not None and info.nvlink_capacity_Bps),
            hist_start=self.n - len(h.tx),
            hist_tx=tuple(h.tx),
            hist_rx=tuple(h.rx),
            hist_nvlink=tuple(h.nvl),
            hist_mem=tuple(h.busy if basis == "proxy" else h.dram),
            hist_phase=tuple(h.phase),
            hist_span_s=(h.t[-1] - h.t[0]) if len(h.t) > 1 else 0.0,
            memory_basis=basis,
            mem_util=mem_util,
            link_enter=self.thresholds.link_enter,
        )
        h.peak_tx = h.peak_rx = None
        return view
