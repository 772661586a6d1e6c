"""One analyzer, any chunking: feeding ticks one by one, or in chunks of any length, gives the same
series, events, verdicts, attribution and report; and both equal the per-tick analyzer the project
had before it took chunks (tests/analyzer_reference.py, verbatim) and its plain-Python summary
(``_reference_summary`` below).
"""

from __future__ import annotations

import dataclasses
import gzip
import json
import math
import random
from pathlib import Path
from typing import Any

import pytest
from analyzer_reference import ref_run
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from pcie_tui.analyze import session
from pcie_tui.analyze.answer import answer
from pcie_tui.analyze.session import SessionAnalyzer, analyze, analyze_rows
from pcie_tui.analyze.verdict import RESOURCES, VERDICTS, Thresholds
from pcie_tui.core.model import PCIE_LANE_Bps, Sample, SessionHeader
from pcie_tui.recording.reader import Recording, SampleList, read_recording, read_rows
from pcie_tui.report.text import build_report

REPO = Path(__file__).parent.parent
REAL = sorted((REPO / "pcie_tui" / "data").glob("*.jsonl.gz")) + [
    REPO / "tests" / "fixtures" / "h200-probe.jsonl",
    REPO / "tests" / "fixtures" / "vllm-cpu-session.jsonl",
]
DEFAULT = Thresholds()
SERIES = ("t", "verdict", "link", "link_Bps", "memory", "compute", "phase", "memory_proxy", "mem_used", "pcie_ceiling")
REF_SERIES = ("t", "verdict", "link", "link_Bps", "memory", "compute", "phase")


# ---- the pre-numpy summary, verbatim in logic, as the reference ------------------


def _ref_quantile(v: list[float], q: float) -> float:
    if len(v) == 1:
        return v[0]
    pos = q * (len(v) - 1)
    lo = int(pos)
    hi = min(lo + 1, len(v) - 1)
    return v[lo] + (v[hi] - v[lo]) * (pos - lo)


def _ref_stats(values: list[float | None]) -> dict[str, Any]:
    v = sorted(x for x in values if x is not None)
    if not v:
        return {"peak": None, "median": None, "p95": None, "mean": None, "n": 0}
    return {
        "peak": v[-1],
        "median": _ref_quantile(v, 0.5),
        "p95": _ref_quantile(v, 0.95),
        "mean": sum(v) / len(v),
        "n": len(v),
    }


def _ref_labels(an: SessionAnalyzer, index: int, times: list[float]) -> list[str]:
    last = times[-1]
    intervals: dict[str, list[tuple[float, float]]] = {r: [] for r in RESOURCES}
    for ev in an.events:
        if ev.gpu == index:
            intervals[ev.resource].append((ev.start, ev.end if ev.end is not None else last))
    for iv in intervals.values():
        iv.sort()
    pos = dict.fromkeys(RESOURCES, 0)
    labels = []
    for t in times:
        label = "none"
        for r in RESOURCES:
            iv, i = intervals[r], pos[r]
            while i < len(iv) and iv[i][1] < t:
                i += 1
            pos[r] = i
            if i < len(iv) and iv[i][0] <= t:
                label = r
                break
        labels.append(label)
    return labels


def _reference_summary(an: SessionAnalyzer) -> dict[str, Any]:
    gpus = []
    for index in sorted(an.series):
        ser = an.series[index]
        labels = _ref_labels(an, index, ser.t) if ser.t else []
        segs: list[dict[str, Any]] = []
        for t, label in zip(ser.t, labels, strict=True):
            if segs and segs[-1]["saturated"] == label:
                segs[-1]["end"] = t
            else:
                if segs:
                    segs[-1]["end"] = t
                segs.append({"start": t, "end": t, "saturated": label})
        time_in = {v: 0.0 for v in VERDICTS}
        for sg in segs:
            time_in[sg["saturated"]] += sg["end"] - sg["start"]
        phases: dict[str, Any] = {}
        by_phase: dict[str, list[int]] = {}
        for i, p in enumerate(ser.phase):
            if p is not None:
                by_phase.setdefault(p, []).append(i)
        for p, idx in by_phase.items():
            n = len(idx)
            share = {v: sum(1 for i in idx if labels[i] == v) / n for v in VERDICTS}
            phases[p] = {
                "ticks": n,
                "verdict_share": share,
                "dominant": max(share, key=share.__getitem__),
                "link_util": _ref_stats([ser.link[i] for i in idx]),
                "link_Bps": _ref_stats([ser.link_Bps[i] for i in idx]),
                "dram_util": _ref_stats([ser.memory[i] for i in idx]),
                "sm_util": _ref_stats([ser.compute[i] for i in idx]),
            }
        info = an.header.gpu(index)
        gpus.append(
            {
                "index": index,
                "name": info.name if info else None,
                "verdicts": segs,
                "time_in_verdict_s": time_in,
                "events": [e.to_json() for e in an.events if e.gpu == index],
                "link_util": _ref_stats(ser.link),
                "link_Bps": _ref_stats(ser.link_Bps),
                "dram_util": _ref_stats(ser.memory),
                "dram_basis": "proxy (NVML memory busy %, a duty cycle)" if ser.memory_proxy else "GPM DRAM_BW_UTIL",
                "sm_util": _ref_stats(ser.compute),
                "phases": phases,
            }
        )
    return {
        "start": an.t0,
        "end": an.t_last,
        "duration_s": (an.t_last - an.t0) if an.t0 is not None and an.t_last is not None else 0.0,
        "ticks": an.n,
        "gpus": gpus,
    }


def _close(a: Any, b: Any, path: str = "") -> None:
    """Equal, floats to 1e-12 relative."""
    if isinstance(a, float) or isinstance(b, float):
        assert isinstance(a, int | float) and isinstance(b, int | float), path
        assert math.isclose(a, b, rel_tol=1e-12, abs_tol=0.0) or a == b, f"{path}: {a!r} != {b!r}"
    elif isinstance(a, dict):
        assert isinstance(b, dict) and list(a) == list(b), f"{path}: keys {list(a)} != {list(b)}"
        for k in a:
            _close(a[k], b[k], f"{path}.{k}")
    elif isinstance(a, list):
        assert isinstance(b, list) and len(a) == len(b), f"{path}: lengths"
        for i, (x, y) in enumerate(zip(a, b, strict=True)):
            _close(x, y, f"{path}[{i}]")
    else:
        assert a == b, f"{path}: {a!r} != {b!r}"


def _event_state(e: Any) -> dict[str, Any]:
    d = dataclasses.asdict(e) if dataclasses.is_dataclass(e) else dict(vars(e))
    d["phases"] = list(d["phases"].items())  # insertion order decides Event.phase on ties
    return d


def _state(an: SessionAnalyzer) -> dict[str, Any]:
    """Everything an analyzer holds that a caller can see, for exact comparison."""
    return {
        "span": (an.t0, an.t_last, an.n),
        "series": {i: {k: getattr(sr, k) for k in SERIES} for i, sr in an.series.items()},
        "events": [_event_state(e) for e in an.events],
        "trackers": {i: (tr.verdict, tr.last_util) for i, tr in an.trackers.items()},
        "summary": an.summary(),
        "timeline": {i: an.timeline(i) for i in an.series},
        "phases": {i: an.phase_summary(i) for i in an.series},
        "answer": answer(an.header, an),
    }


def tick_by_tick(header: SessionHeader, rows: list[dict[str, Any]], th: Thresholds = DEFAULT) -> SessionAnalyzer:
    """The live path: one Sample at a time through feed(); checks what each feed() returns."""
    an = SessionAnalyzer(header, th)
    for d in rows:
        opened = an.feed(Sample.from_json(d))
        assert all(e in an.events for e in opened)
    an.finish()
    return an


def assert_same(header: SessionHeader, rows: list[dict[str, Any]], th: Thresholds = DEFAULT) -> SessionAnalyzer:
    samples = [Sample.from_json(d) for d in rows]
    one = tick_by_tick(header, rows, th)
    ref = ref_run(header, samples, th)
    # The per-tick reference: same series, events (in order), verdicts and last utilisation.
    assert list(one.series) == list(ref["series"])
    for i, sr in ref["series"].items():
        for k in REF_SERIES:
            assert getattr(one.series[i], k) == sr[k], f"gpu {i} series {k}"
    assert [_event_state(e) for e in one.events] == [_event_state(e) for e in ref["events"]]
    for i, tr in ref["trackers"].items():
        assert (one.trackers[i].verdict, one.trackers[i].last_util) == (tr.verdict, tr.last_util)
    _close(one.summary(), _reference_summary(one))
    want = _state(one)
    n = len(rows)
    for k in sorted({1, 2, 3, 7, max(1, n // 2), max(1, n)}):
        got = SessionAnalyzer(header, th).feed_rows(rows, chunk=k)
        got.finish()
        assert _state(got) == want, f"rows in chunks of {k}"
    assert _state(analyze_rows(header, rows, th)) == want, "analyze_rows (what report runs)"
    got = SessionAnalyzer(header, th).feed_all(samples, chunk=5)
    got.finish()
    assert _state(got) == want, "Samples in chunks of 5"
    return one


# ---- random recordings -------------------------------------------------------------

LEVELS = [None, 0.0, 0.3, 0.54, 0.55, 0.56, 0.69, 0.7, 0.71, 0.84, 0.85, 0.86, 0.9, 0.94, 0.95, 0.96, 1.0]
GAPS = [0.0, 0.05, 0.1, 0.1, 0.1, 0.25, 0.3, 0.5, 0.7]
LINKS = [(None, None), (5, 16), (5, 16), (4, 16), (5, 8), (3, 4), (7, 16), (5, 0)]
PHASES = [None, "", "prefill", "decode", "mixed"]
G5X16 = PCIE_LANE_Bps[5] * 16


def _segments(rnd: random.Random, n: int, choices: list[Any]) -> list[Any]:
    """n values made of runs (bursts) with occasional single-tick holes and flips."""
    if n <= 0:
        return []
    out: list[Any] = []
    while len(out) < n:
        out += [rnd.choice(choices)] * rnd.randint(1, 12)
    out = out[:n]
    for _ in range(rnd.randint(0, n // 4 + 1)):
        out[rnd.randrange(n)] = rnd.choice(choices)
    return out


@st.composite
def recordings(draw: Any) -> tuple[SessionHeader, list[dict[str, Any]], Thresholds]:
    n_gpu = draw(st.integers(1, 3))
    infos = []
    for gi in range(n_gpu):
        gen, width = draw(st.sampled_from([(5, 16), (4, 16), (None, None), (5, 8)]))
        cap = PCIE_LANE_Bps[gen] * width if gen else None
        infos.append(
            {
                "index": gi,
                "name": f"GPU{gi}",
                "link": {
                    "gen": gen,
                    "width": width,
                    "capacity_Bps": cap,
                    "measured_Bps": draw(st.sampled_from([None, None, 50e9, 0.7 * G5X16, 80e9])),
                },
                "nvlink_capacity_Bps": draw(st.sampled_from([None, 0.0, 450e9, 450e9])),
                "metrics_source": draw(st.sampled_from(["gpm", "nvml", None])),
            }
        )
    if draw(st.booleans()) and n_gpu > 1:
        infos.pop()  # a GPU that ticks but is not in the header
    n = draw(st.integers(1, 90))
    # Bulk values from a seeded generator: hypothesis-drawn per value was most of the run time.
    rnd = random.Random(draw(st.integers(0, 2**32)))
    t = [1.7e9 + rnd.uniform(0, 1000)]
    for gap in _segments(rnd, n - 1, GAPS):
        t.append(t[-1] + gap)
    phases = _segments(rnd, n, PHASES)
    use_engine = draw(st.booleans())
    per_gpu = []
    proxy_only = [draw(st.booleans()) for _ in range(n_gpu)]  # NVML duty cycle only, no GPM at all
    for gi, info in enumerate(infos):
        if proxy_only[gi]:
            info["metrics_source"] = "nvml"
    header = SessionHeader.from_json({"created": "x", "host": "h", "tool_version": "t", "gpus": infos})
    for _gi in range(n_gpu):
        fields = {
            k: _segments(rnd, n, LEVELS)
            for k in ("pcie_rx", "pcie_tx", "nvlink_rx", "nvlink_tx", "dram_bw_util", "mem_busy", "sm_util")
        }
        fields["link"] = _segments(rnd, n, LINKS)
        fields["present"] = _segments(rnd, n, [True, True, True, False])
        per_gpu.append(fields)
    rows: list[dict[str, Any]] = []
    for i in range(n):
        gpus = []
        for gi, f in enumerate(per_gpu):
            if not f["present"][i]:
                continue
            gen, width = f["link"][i]
            g: dict[str, Any] = {"index": gi}
            for k in ("pcie_rx", "pcie_tx"):
                lv = f[k][i]
                g[f"{k}_Bps"] = None if lv is None else lv * G5X16
            for k in ("nvlink_rx", "nvlink_tx"):
                lv = f[k][i]
                g[f"{k}_Bps"] = None if lv is None else lv * 460e9  # a hair above PCIe's share: NVLink wins ties
            for k in ("dram_bw_util", "mem_busy", "sm_util"):
                g[k] = f[k][i]
            if proxy_only[gi]:
                g["dram_bw_util"] = None
            if gen is not None:
                g["link_gen"], g["link_width"] = gen, width
            gpus.append(g)
        row: dict[str, Any] = {"t": t[i], "gpus": gpus}
        if use_engine:
            row["engine"] = {"kind": "vllm", "up": True, "phase": phases[i]}
        elif phases[i] is not None:
            row["label"] = phases[i]
        rows.append(row)
    th = draw(
        st.sampled_from(
            [
                Thresholds(),
                Thresholds(hold_s=0.0),
                Thresholds(hold_s=0.3),
                Thresholds(hold_s=1.0),
                Thresholds(link_enter=0.55, link_exit=0.7),
            ]
        )
    )
    return header, rows, th


@settings(max_examples=120, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(recordings())
def test_chunks_equal_ticks_on_random_recordings(
    rec: tuple[SessionHeader, list[dict[str, Any]], Thresholds],
) -> None:
    header, rows, th = rec
    assert_same(header, rows, th)


def test_generator_reaches_events() -> None:
    """The random recordings do exercise the automaton: events open, close, stay open."""
    seen = {"closed": 0, "to_end": 0, "proxy": 0, "nvlink": 0}

    @settings(
        max_examples=120,
        derandomize=True,
        database=None,
        deadline=None,
        suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
    )
    @given(recordings())
    def collect(rec: tuple[SessionHeader, list[dict[str, Any]], Thresholds]) -> None:
        an = assert_same(*rec)
        for e in an.events:
            seen["to_end" if e.end == an.t_last else "closed"] += 1
            seen["proxy"] += e.proxy
            seen["nvlink"] += e.bus == "nvlink"

    collect()
    assert all(v > 0 for v in seen.values()), seen


def _one_gpu(link_levels: list[float | None], dt: float = 0.1) -> tuple[SessionHeader, list[dict[str, Any]]]:
    header = SessionHeader.from_json(
        {"gpus": [{"index": 0, "link": {"gen": 5, "width": 16, "capacity_Bps": G5X16}, "metrics_source": "gpm"}]}
    )
    rows = [
        {"t": 1000.0 + i * dt, "gpus": [{"index": 0, "pcie_rx_Bps": None if lv is None else lv * G5X16}]}
        for i, lv in enumerate(link_levels)
    ]
    return header, rows


@pytest.mark.parametrize(
    "levels",
    [
        [0.6] * 30,  # >= enter but < exit: opens, then closes from the very next tick
        [0.6] * 8 + [0.8] * 3 + [0.6] * 12 + [0.8] * 2 + [0.6] * 3,
        [0.8] * 6 + [0.6] * 4 + [None] * 3 + [0.6] * 10 + [0.5] * 3 + [0.6] * 9,
        [0.6] * 4 + [0.5] + [0.6] * 20,
    ],
)
def test_enter_below_exit_thresholds(levels: list[float | None]) -> None:
    """Odd thresholds (enter < exit) make runs that began before a state change; mirrored too."""
    header, rows = _one_gpu(levels)
    an = assert_same(header, rows, Thresholds(link_enter=0.55, link_exit=0.7))
    assert an.events


def test_equal_timestamps_and_hold_boundaries() -> None:
    """Ticks sharing a time, and gaps that land exactly on (or a float hair off) hold_s."""
    levels = [0.9] * 5 + [0.1] * 5 + [0.9] * 7 + [None, 0.9, 0.3, 0.3, 0.3, 0.9, 0.9, 0.9]
    header, rows = _one_gpu(levels)
    for i, d in enumerate(rows):
        d["t"] = 1000.0 + (i // 2) * 0.25  # pairs share a time; 0.25 + 0.25 == hold_s
    assert_same(header, rows)
    for i, d in enumerate(rows):
        d["t"] = 0.1 * i  # 0.1 * 6 - 0.1 * 1 is 0.5000000000000001, 0.1 * 8 - 0.1 * 3 is 0.5
    assert_same(header, rows)


def test_out_of_order_ticks() -> None:
    """Ticks out of time order (a recording the reader was told not to check) chunk the same too."""
    header, rows, _e, _w = read_rows(REPO / "tests" / "fixtures" / "h200-probe.jsonl")
    # The reader's own dicts, reordered: validate.cached_columns must not hand back its columns.
    rows = rows[:40] + rows[60:70] + rows[40:60] + rows[70:]
    assert_same(header, rows)


# ---- real recordings ----------------------------------------------------------------


@pytest.mark.parametrize("path", REAL, ids=lambda p: p.name)
def test_chunks_equal_ticks_on_real_recordings(path: Path) -> None:
    header, rows, _events, _warnings = read_rows(path)
    assert_same(header, rows)


def test_real_recording_repeated_with_hour_like_length() -> None:
    """The H200 reference, ticks repeated 20 times in order (events recur, the open one at the end)."""
    header, rows, _e, _w = read_rows(REPO / "pcie_tui" / "data" / "h200-reference.jsonl.gz")
    span = rows[-1]["t"] - rows[0]["t"] + 0.1
    rep = [dict(d, t=d["t"] + k * span) for k in range(20) for d in rows]
    an = assert_same(header, rep)
    assert len(an.events) >= 20


def _report_json(rec: Recording) -> str:
    return json.dumps(build_report(rec)[0], sort_keys=True)


def _as_samples(path: Path) -> Recording:
    again = read_recording(path, warn=False)
    rec = Recording(again.path, again.header, list(again.samples), again.events, again.warnings)
    rec.segments, rec.gaps = again.segments, again.gaps
    return rec


def assert_report_same(path: Path, monkeypatch: pytest.MonkeyPatch) -> dict[str, Any]:
    """``report`` (raw rows in chunks) == the same from Samples == fed one tick at a time."""
    rec = read_recording(path, warn=False)
    fast = _report_json(rec)
    assert isinstance(rec.samples, SampleList) and not rec.samples.built  # no Samples were needed
    assert _report_json(_as_samples(path)) == fast
    for k in (1, 7):
        monkeypatch.setattr(session, "CHUNK_TICKS", k)
        assert _report_json(read_recording(path, warn=False)) == fast, f"rows in chunks of {k}"
        assert _report_json(_as_samples(path)) == fast, f"Samples in chunks of {k}"
    return json.loads(fast)  # type: ignore[no-any-return]


@pytest.mark.parametrize("path", REAL, ids=lambda p: p.name)
def test_report_is_the_same_in_any_chunking(path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    assert_report_same(path, monkeypatch)


def test_synthetic_recording_with_gaps_restarts_and_missing_readings(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A recording with a hole, a restart (second header), GPUs missing from ticks, readings missing,
    a link that retrains, and engine phases: every chunking gives the same analysis and report."""
    src = REPO / "pcie_tui" / "data" / "h200-reference.jsonl.gz"
    lines = gzip.decompress(src.read_bytes()).decode().splitlines()
    hdr = json.loads(lines[0])
    g0 = hdr["gpus"][0]
    hdr["gpus"] = [g0, dict(g0, index=1, uuid=g0["uuid"] + "-1", metrics_source="nvml")]
    ticks = [json.loads(x) for x in lines[1:] if x.strip()]
    rnd = random.Random(11)
    out = [json.dumps(hdr)]
    t = 1.8e9
    for k, d in enumerate(ticks * 2):
        t += 0.1
        if k in (150, 700):
            t += 30.0  # a hole of many intervals: a gap
        if k == 500:
            out.append(json.dumps(dict(hdr, created="restart")))  # the recorder restarted: a new segment
        g = dict(d["gpus"][0])
        for key in ("pcie_rx_Bps", "pcie_tx_Bps", "dram_bw_util", "sm_util", "mem_busy"):
            if rnd.random() < 0.05:
                g[key] = None  # a reading missing this tick
        if 300 <= k < 340:
            g["link_gen"], g["link_width"] = 4, 8  # retrained narrower
        dram = g["dram_bw_util"]
        busy = None if dram is None else 1.0 if dram >= 0.5 else dram  # NVML only: the duty-cycle proxy
        g1 = dict(g, index=1, dram_bw_util=None, mem_busy=busy)
        gpus = [g] + ([g1] if k % 9 else [])  # GPU 1 missing from every ninth tick
        phase = ("prefill", "decode", "idle", None)[(k // 37) % 4]
        tick = {"t": t, "gpus": gpus, "engine": {"kind": "vllm", "up": True, "phase": phase, "requests_running": 1}}
        out.append(json.dumps(tick))
    path = tmp_path / "synthetic.jsonl"
    path.write_text("\n".join(out) + "\n")
    rec = read_recording(path, warn=False)
    assert rec.gaps and len(rec.segments) > 1
    an = assert_same(rec.header, rec.rows or [])
    assert {e.gpu for e in an.events} == {0, 1} and any(e.proxy for e in an.events)
    report = assert_report_same(path, monkeypatch)
    assert report["gaps_s"] > 50 and report["ticks"] == len(ticks) * 2


# ---- reader ---------------------------------------------------------------------------


def test_reader_rows_and_lazy_samples_match_eager_parse(tmp_path: Path) -> None:
    src = REPO / "pcie_tui" / "data" / "h200-reference.jsonl.gz"
    lines = gzip.decompress(src.read_bytes()).decode().splitlines()
    ticks = [json.loads(x) for x in lines[1:] if x.strip()]
    bad = [
        '{"t": "soon", "gpus": []}',
        '{"t": 1.0, "gpus": [{"pcie_tx_Bps": 1.0}]}',
        '{"t": 2.0, "gpus": ["gpu0"]}',
        '{"t": 3.0, "gpus": 5}',
    ]
    nan_tick = dict(ticks[3], t=ticks[3]["t"] + 0.01)
    nan_tick["gpus"] = [dict(nan_tick["gpus"][0], power_W=float("nan"))]
    body = [lines[0], *lines[1:4], *bad, json.dumps(nan_tick), '{"event": "engine_gap", "t": 5.0}', *lines[4:]]
    path = tmp_path / "r.jsonl"
    path.write_text("\n".join(body) + "\n")
    rec = read_recording(path, warn=False)
    assert isinstance(rec.samples, SampleList) and not rec.samples.built
    # The bad ticks' t=1..3 and ticks[3] (earlier than the NaN tick before it) go back in time: set aside.
    assert len(rec.samples) == len(ticks) and rec.samples  # len and truth without building
    assert not rec.samples.built
    assert rec.events == [{"event": "engine_gap", "t": 5.0}]
    w = "\n".join(rec.warnings)
    assert "tick without a usable time t (first: 'soon')" in w and "line 5" in w
    assert "GPU entry without a usable integer index" in w
    assert "time goes back" in w and "4 times; ticks set aside, not merged" in w
    assert "power_W not finite (NaN, infinite or beyond float range) (1 time" in w and f"line {4 + len(bad) + 1}" in w
    clean = dict(nan_tick, gpus=[dict(nan_tick["gpus"][0], power_W=None)])
    expected = [Sample.from_json(d) for d in ticks[:3]] + [Sample.from_json(clean)]
    expected += [Sample.from_json(d) for d in ticks[4:]]
    assert [s.t for s in rec.samples[:5]] == [s.t for s in expected[:5]]
    assert rec.samples[3].gpus[0].power_W is None  # NaN is "unavailable", never a number
    eq = [s.to_json() for s in rec.samples]
    assert json.dumps(eq, default=str) == json.dumps([s.to_json() for s in expected], default=str)
    assert rec.samples.built and rec.rows is not None and len(rec.rows) == len(rec.samples)


def test_phase_summary_cache_follows_new_ticks_and_closed_events() -> None:
    rec = read_recording(REPO / "pcie_tui" / "data" / "h200-reference.jsonl.gz", warn=False)
    live = SessionAnalyzer(rec.header)
    half = len(rec.samples) // 2
    live.feed_all(rec.samples[:half])
    first = live.phase_summary(0)
    first.clear()  # a caller's copy; the cache must not see it
    assert live.phase_summary(0) == SessionAnalyzer(rec.header).feed_all(rec.samples[:half]).phase_summary(0)
    live.feed_all(rec.samples[half:])
    live.finish()
    assert live.phase_summary(0) == analyze(rec.header, rec.samples).phase_summary(0)
    assert live.summary()["gpus"][0]["phases"] == live.phase_summary(0)


@pytest.mark.parametrize("path", REAL, ids=lambda p: p.name)
def test_lazy_samples_equal_from_json(path: Path) -> None:
    from pcie_tui.recording import reader

    assert reader._sample is reader._sample_fast  # the positional fast path is live, not the fallback
    _h, rows, _e, _w = read_rows(path)
    trimmed = [dict(d, gpus=[{k: v for k, v in g.items() if k != "power_W"} for g in d["gpus"]]) for d in rows[:50]]
    for batch in (rows, trimmed):
        assert SampleList(batch).as_list() == [Sample.from_json(d) for d in batch]
