"""Phase classification per tick and the per-phase verdict lines."""

from __future__ import annotations

import pytest

from pcie_tui.core.model import EngineSample, GpuSample, Sample
from pcie_tui.engines.phases import PhaseTracker, counter_phase, engine_rx_Bps, tick_phase
from pcie_tui.recording.reader import read_recording


def e(p=None, g=None, up=True, running=0.0):
    return EngineSample(kind="vllm", up=up, prompt_tokens_total=p, generation_tokens_total=g, requests_running=running)


@pytest.mark.parametrize(
    "prev, cur, want",
    [
        (e(10, 5), e(50, 5), "prefill"),
        (e(10, 5), e(10, 9), "decode"),
        (e(10, 5), e(50, 9), "mixed"),
        (e(10, 5), e(10, 5), "idle"),
        (e(10, 5), e(10, 5, running=2.0), "prefill"),  # running but no counter moved: inside a long prefill
        (None, e(10, 5), None),
    ],
)
def test_counter_phase(prev, cur, want):
    assert counter_phase(prev, cur) == want


def test_first_tokens_are_prefill_not_decode():
    def with_ttft(p, g, n):
        x = e(p, g)
        return EngineSample(
            **{
                **{
                    f: getattr(x, f)
                    for f in ("kind", "up", "prompt_tokens_total", "generation_tokens_total", "requests_running")
                },
                "extra": {"hist": {"ttft_s": {"le": [1.0], "cum": [n], "count": n}}},
            }
        )

    # 4 one-token requests of 400 prompt tokens: 4 generated tokens, all first tokens.
    assert counter_phase(with_ttft(0, 0, 0), with_ttft(1600, 4, 4)) == "prefill"
    # Same, plus 10 decode tokens of running requests.
    assert counter_phase(with_ttft(0, 0, 0), with_ttft(1600, 14, 4)) == "mixed"
    assert counter_phase(with_ttft(0, 0, 0), with_ttft(0, 10, 0)) == "decode"


def test_tracker_ignores_the_delta_across_a_restart():
    tr = PhaseTracker()
    assert tr.update(e(100, 100)) is None
    assert tr.update(e(120, 100)) == "prefill"
    assert tr.would_reset(e(5, 3))
    assert tr.update(e(5, 3)) is None  # counters went down: no delta, not "idle"
    assert tr.update(e(5, 9)) == "decode"


def test_tick_phase_rules():
    down = e(up=False)
    assert tick_phase(down, None, alive=False, served=False, rx_Bps=None) == "down"
    assert tick_phase(down, None, alive=True, served=False, rx_Bps=None) == "loading"  # started, not serving yet
    assert tick_phase(down, None, alive=True, served=True, rx_Bps=None) == "down"  # served before, now hung
    assert tick_phase(down, None, alive=None, served=False, rx_Bps=20e9) == "loading"  # url-only, bulk upload
    assert tick_phase(down, None, alive=None, served=False, rx_Bps=1e6) == "down"
    up = e(1, 1)
    assert tick_phase(up, "idle", alive=True, served=True, rx_Bps=20e9) == "loading"  # idle engine, weights going up
    assert tick_phase(up, "idle", alive=True, served=True, rx_Bps=1e6) == "idle"
    assert tick_phase(up, "prefill", alive=True, served=True, rx_Bps=20e9) == "prefill"
    assert tick_phase(up, None, alive=True, served=True, rx_Bps=None) == "idle"
    # A request outstanding is never idle: waiting with nothing processed is the queue; an engine busy with its
    # own work between requests (its log says so) is housekeeping; whatever the log says it is doing wins.
    waiting = EngineSample(kind="vllm", up=True, prompt_tokens_total=1, generation_tokens_total=1, requests_waiting=2.0)
    assert tick_phase(waiting, "idle", alive=True, served=True, rx_Bps=1e6) == "queue"
    busy = EngineSample(kind="llamacpp", up=True, extra={"busy_with": "housekeeping", "server_state": "busy"})
    assert tick_phase(busy, "idle", alive=True, served=True, rx_Bps=2e9) == "housekeeping"  # not loading
    assert tick_phase(busy, None, alive=True, served=True, rx_Bps=None) == "housekeeping"
    # The loop did not answer while its log showed a slot in its setup (H100, b11434, 2026-12-07: the busy scrape
    # counted the open request as running, so the counters said "prefill" with SM 0 % for 1.3 s a request).
    setup = EngineSample(
        kind="llamacpp", up=True, requests_running=1.0, extra={"busy_with": "housekeeping", "server_state": "busy"}
    )
    assert tick_phase(setup, "prefill", alive=True, served=True, rx_Bps=3e5) == "housekeeping"
    started = EngineSample(kind="llamacpp", up=True, requests_running=1.0, extra={"busy_with": "prefill"})
    assert tick_phase(started, "decode", alive=True, served=True, rx_Bps=3e5) == "decode"
    odd = EngineSample(kind="llamacpp", up=True, extra={"busy_with": "nonsense"})
    assert tick_phase(odd, "idle", alive=True, served=True, rx_Bps=None) == "idle"
    # Several requests, some in prefill, some decoding: the bus says which one the tick's work was.
    assert tick_phase(up, "mixed", alive=True, served=True, rx_Bps=48e9) == "prefill"  # host weights streaming
    assert tick_phase(up, "mixed", alive=True, served=True, rx_Bps=2e6) == "mixed"
    assert tick_phase(up, "mixed", alive=True, served=True, rx_Bps=None) == "mixed"  # no GPU reading: not assumed


def test_engine_rx_uses_only_the_engines_gpus():
    gs = (GpuSample(index=0, pcie_rx_Bps=5e9), GpuSample(index=1, pcie_rx_Bps=9e9), GpuSample(index=2))
    assert engine_rx_Bps(gs, [0]) == 5e9
    assert engine_rx_Bps(gs, None) == 9e9
    assert engine_rx_Bps(gs, [2]) is None


def test_phase_findings_on_real_h200_readings(probe_recording_path):
    """The probe recording's phases are labels (h2d_pinned, d2d_copy...): the H2D copy must read
    link-saturated, the device copy memory-bound, each with its median rate."""
    from pcie_tui.analyze.analysis import Analysis

    rec = read_recording(probe_recording_path, warn=False)
    a = Analysis(rec.header, rec.events)
    a.feed_all(rec.samples)
    a.finish()
    found = {f.phase: f for f in a.answer().findings[0]}
    assert found["h2d_pinned"].bound == "link" and found["h2d_pinned"].stat == "median"
    assert found["h2d_pinned"].link_Bps > 40e9
    assert found["d2d_copy"].bound == "memory"
    assert found["idle"].bound == "idle"


def test_sample_phase_feeds_the_analyzer():
    # Engine phases (not labels) drive SessionAnalyzer.phase_summary.
    from pcie_tui.analyze.session import SessionAnalyzer

    rec = read_recording(__import__("pathlib").Path(__file__).parent / "fixtures" / "h200-probe.jsonl", warn=False)
    an = SessionAnalyzer(rec.header)
    for s in rec.samples[:50]:
        an.feed(Sample(t=s.t, gpus=s.gpus, engine=EngineSample(kind="vllm", up=True, phase="decode")))
    assert set(an.phase_summary(0)) == {"decode"}


def test_a_tick_is_idle_only_when_nothing_is_outstanding():
    """Property (issue 24): whatever the counters, slots and link say, a tick with a request waiting or the
    engine's log saying what it is busy with is never idle; with nothing outstanding and nothing moving it is."""
    from hypothesis import given
    from hypothesis import strategies as st

    from pcie_tui.engines.phases import PHASES

    @given(
        waiting=st.sampled_from([None, 0.0, 1.0, 5.0]),
        running=st.sampled_from([None, 0.0, 1.0]),
        busy_with=st.sampled_from([None, "housekeeping", "prefill", "decode", "mixed"]),
        counter=st.sampled_from([None, *PHASES]),
        rx=st.sampled_from([None, 0.0, 5e8, 4e10]),
    )
    def check(waiting, running, busy_with, counter, rx):
        extra = {"busy_with": busy_with} if busy_with else {}
        eng = EngineSample(kind="llamacpp", up=True, requests_waiting=waiting, requests_running=running, extra=extra)
        phase = tick_phase(eng, counter, alive=True, served=True, rx_Bps=rx)
        if phase == "idle":
            assert not waiting and busy_with is None
        if counter in (None, "idle") and not waiting and busy_with is None and not (rx and rx >= 1e9):
            assert phase == "idle"

    check()
