"""A long session's oldest ticks are summarised (analyze/retire.py) so a day-long live session's memory stays
flat (issue 25): what the report says must stay what the exact analysis says. Counts, seconds, peaks, means,
bounds, verdict times and the what-if stay exact; medians and p95 stay within a stratum's rank of the exact
ones; and where the chunks fall does not matter."""

from __future__ import annotations

import gzip
import json
import math
from fractions import Fraction
from pathlib import Path
from typing import Any

import numpy as np
import orjson
import pytest

from pcie_tui.analyze import fold, retire
from pcie_tui.analyze.health_lines import heat_lines
from pcie_tui.analyze.series import GpuSeries, series_array, series_counts, series_weights, tick_weights
from pcie_tui.analyze.verdict import DEFAULT_THRESHOLDS, VERDICTS
from pcie_tui.recording.reader import read_recording
from pcie_tui.recording.validate import finite_json
from pcie_tui.report.text import ReportFeed, report_file, with_stored_calibration

SOURCE = Path(__file__).parent.parent / "pcie_tui" / "data" / "h200-pageable.jsonl.gz"
N_TICKS = 45_000  # 75 min at 10 Hz: six blocks retired


@pytest.fixture(scope="module")
def long_recording(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The real H200 session h200-pageable repeated (times shifted, finished requests dropped)."""
    return _repeated(SOURCE, N_TICKS, tmp_path_factory.mktemp("long") / "long.jsonl")


def _repeated(source: Path, n_ticks: int, path: Path) -> Path:
    """``source``'s ticks repeated (times shifted, finished requests dropped) to ``n_ticks`` or a little more."""
    with gzip.open(source) as f:
        lines = [orjson.loads(raw) for raw in f]
    header, ticks = lines[0], [d for d in lines[1:] if "t" in d and "gpus" in d]
    span = ticks[-1]["t"] - ticks[0]["t"] + 0.1
    with path.open("wb") as out:
        out.write(orjson.dumps(header) + b"\n")
        k = n = 0
        while n < n_ticks:
            for d in ticks:
                e = dict(d, t=d["t"] + k * span)
                if isinstance(e.get("engine"), dict):
                    e["engine"] = {key: v for key, v in e["engine"].items() if key != "requests"}
                out.write(orjson.dumps(e) + b"\n")
                n += 1
            k += 1
    return path


@pytest.fixture(scope="module")
def both(long_recording: Path) -> tuple[dict[str, Any], Any, dict[str, Any], Any]:
    """(report, analyzer) with the oldest ticks retired, and the same without retiring any."""
    summarised, an, _, _ = report_file(long_recording)
    mp = pytest.MonkeyPatch()
    mp.setattr(retire, "EXACT_TICKS", 10**9)
    try:
        exact, an_exact, _, _ = report_file(long_recording)
    finally:
        mp.undo()
    return finite_json(summarised), an, finite_json(exact), an_exact


def _merging() -> pytest.MonkeyPatch:
    """Bounds low enough that summary rows merge and old events fold, often, in 45,000 ticks."""
    mp = pytest.MonkeyPatch()
    mp.setattr(retire, "MAX_REPS", 400)
    mp.setattr(fold, "KEEP_LONGEST", 4)
    return mp


@pytest.fixture(scope="module")
def merged(long_recording: Path) -> tuple[dict[str, Any], Any]:
    """(report, analyzer) with the summary rows merged as they age and old events folded (:func:`_merging`)."""
    mp = _merging()
    try:
        out, an, _, _ = report_file(long_recording)
    finally:
        mp.undo()
    return finite_json(out), an


def _close(a: Any, b: Any, rel: float = 1e-5) -> bool:
    return math.isclose(a, b, rel_tol=rel, abs_tol=1e-9)


def test_memory_is_bounded(both) -> None:
    _, an, _, an_exact = both
    ser, exact = an.series[0], an_exact.series[0]
    assert len(exact.t) >= N_TICKS
    assert ser.reps > 0
    retired = int(series_counts(ser)[: ser.reps].sum())
    assert len(ser.t) - ser.reps < retire.EXACT_TICKS + retire.RETIRE_TICKS  # the newest ticks, exact
    assert ser.reps <= retired / 16  # the rest: a summary row for 16 ticks or more
    assert retired + len(ser.t) - ser.reps == len(exact.t)  # every tick counted once
    # seconds: each summarised row's seconds are those of its ticks
    assert _close(float(series_weights(ser).sum()), float(series_weights(exact).sum()))
    assert np.array_equal(series_array(ser, "t")[ser.reps :], series_array(exact, "t")[-(len(ser.t) - ser.reps) :])


def _stats_exact(a: dict[str, Any], b: dict[str, Any]) -> None:
    assert a["n"] == b["n"]
    for k in ("peak", "mean"):
        assert (a[k] is None) == (b[k] is None)
        if a[k] is not None:
            assert _close(a[k], b[k], 1e-6), (k, a[k], b[k])


def _rank_ok(value: float, exact: np.ndarray, q: float, slack: float = 0.02) -> bool:
    """``value`` sits where the exact ``q`` quantile does, within ``slack`` of the ticks' rank."""
    v = np.sort(exact[~np.isnan(exact)])
    lo = np.searchsorted(v, value, "left") / v.size
    hi = np.searchsorted(v, value, "right") / v.size
    return lo - slack <= q <= hi + slack


def test_the_summary_says_what_the_exact_one_says(both) -> None:
    s, _, e, an_exact = both
    _says_what_the_exact_one_says(s, e, an_exact)


def test_merged_rows_say_what_the_exact_one_says(both, merged) -> None:
    _, an_plain, e, an_exact = both
    s, an = merged
    ser = an.series[0]
    assert ser.reps < an_plain.series[0].reps  # merged: fewer rows ...
    assert ser.reps <= 400 + 400  # ... held near the bound (400 here), past it by at most a block's rows
    assert int(series_counts(ser).sum()) == len(an_exact.series[0].t)  # every tick counted once
    assert _close(float(series_weights(ser).sum()), float(series_weights(an_exact.series[0]).sum()))
    _says_what_the_exact_one_says(s, e, an_exact)
    test_findings_headline_and_whatif_stay((s, None, e, None))


def _says_what_the_exact_one_says(s: dict[str, Any], e: dict[str, Any], an_exact: Any) -> None:
    assert s["ticks"] == e["ticks"] and _close(s["duration_s"], e["duration_s"])
    g, ge = s["gpus"][0], e["gpus"][0]
    assert len(g["verdicts"]) == len(ge["verdicts"])
    for a, b in zip(g["verdicts"], ge["verdicts"], strict=True):
        assert a["saturated"] == b["saturated"] and _close(a["start"], b["start"]) and _close(a["end"], b["end"])
    for v, secs in ge["time_in_verdict_s"].items():
        assert _close(g["time_in_verdict_s"][v], secs)
    ser = an_exact.series[0]
    phase_of = np.array(ser.phase.mapped(lambda p: p or "unlabelled", object))
    cols = {"link_util": "link", "link_Bps": "link_Bps", "dram_util": "memory", "sm_util": "compute"}
    for key, col in cols.items():
        _stats_exact(g[key], ge[key])
        exact = series_array(ser, col)
        assert _rank_ok(g[key]["median"], exact, 0.5) and _rank_ok(g[key]["p95"], exact, 0.95)
    assert g["phases"].keys() == ge["phases"].keys()
    for phase, p in g["phases"].items():
        pe = ge["phases"][phase]
        assert p["ticks"] == pe["ticks"] and p["dominant"] == pe["dominant"]
        assert all(_close(p["verdict_share"][v], x) for v, x in pe["verdict_share"].items())
        for key, col in cols.items():
            _stats_exact(p[key], pe[key])
            exact = series_array(ser, col)[phase_of == phase]
            assert _rank_ok(p[key]["median"], exact, 0.5), (phase, key)
            assert _rank_ok(p[key]["p95"], exact, 0.95), (phase, key)


def test_findings_headline_and_whatif_stay(both) -> None:
    s, _, e, _ = both
    assert s["headline"]["text"] == e["headline"]["text"]
    fs, fe = s["attribution"]["findings"]["0"], e["attribution"]["findings"]["0"]
    assert [(f["phase"], f["bound"], f["ticks"]) for f in fs] == [(f["phase"], f["bound"], f["ticks"]) for f in fe]
    for a, b in zip(fs, fe, strict=True):
        assert _close(a["duration_s"], b["duration_s"]) and _close(a["bound_s"], b["bound_s"])
        assert all(_close(a["shares"][k], v) for k, v in b["shares"].items())
        for k in ("link_Bps", "sm_util", "dram_util", "transfer_Bps"):  # medians of the bound's ticks
            assert (a[k] is None) == (b[k] is None)
            if a[k] is not None:
                assert math.isclose(a[k], b[k], rel_tol=0.05, abs_tol=1e-3 if k != "link_Bps" else 1e6), k
    _numbers_close(s["whatif"], e["whatif"], 1e-2)


def _numbers_close(a: Any, b: Any, rel: float) -> None:
    if isinstance(a, dict):
        assert a.keys() == b.keys()
        for k in a:
            _numbers_close(a[k], b[k], rel)
    elif isinstance(a, list):
        assert len(a) == len(b)
        for x, y in zip(a, b, strict=True):
            _numbers_close(x, y, rel)
    elif isinstance(a, float) and isinstance(b, float):
        assert math.isclose(a, b, rel_tol=rel, abs_tol=1e-3), (a, b)
    else:
        assert a == b


@pytest.mark.parametrize(("chunk", "merging"), [(1_000, False), (7_777, False), (1_000, True), (7_777, True)])
def test_where_the_chunks_fall_does_not_matter(long_recording: Path, both, merged, chunk: int, merging: bool) -> None:
    s = merged[0] if merging else both[0]
    mp = _merging() if merging else pytest.MonkeyPatch()
    try:
        out = _fed_in_chunks(long_recording, chunk)
    finally:
        mp.undo()
    assert json.dumps(finite_json(out), sort_keys=True) == json.dumps(s, sort_keys=True)


def _fed_in_chunks(path: Path, chunk: int) -> dict[str, Any]:
    rec = read_recording(path, warn=False)
    rows = [orjson.loads(raw) for raw in path.read_bytes().splitlines()[1:]]
    with_stored_calibration(rec)  # as report_file does
    feed = ReportFeed(rec.header, DEFAULT_THRESHOLDS)
    for i in range(0, len(rows), chunk):
        feed.rows(rows[i : i + chunk])
    out, _ = feed.finish(rec)
    return out  # type: ignore[no-any-return]


def test_retired_rows_keep_counts_seconds_peaks_and_means() -> None:
    rng = np.random.default_rng(7)
    n = retire.EXACT_TICKS + retire.RETIRE_TICKS
    ser = GpuSeries()
    t = np.cumsum(rng.uniform(0.09, 0.11, n))
    link = rng.lognormal(-3, 1.5, n)
    ser.t.extend(t)
    for name, v in (("link", link), ("link_Bps", link * 6e10), ("memory", rng.uniform(0, 1, n))):
        getattr(ser, name).extend(v)
    for name in ("compute", "mem_used", "pcie_ceiling"):
        getattr(ser, name).extend(np.full(n, 0.5))
    ser.missing.extend(np.full(n, np.nan))
    ser.phase.extend(["prefill" if (i // 500) % 2 else "decode" for i in range(n)])
    codes = np.where(link > 0.9, VERDICTS.index("link"), VERDICTS.index("none"))
    ser.verdict.extend([VERDICTS[c] for c in codes])
    assert retire.due(ser)
    retire.retire(ser, codes[: retire.RETIRE_TICKS], (1e9,))  # the codes of the ticks it retires (none retired yet)
    assert not retire.due(ser)
    counts = series_counts(ser)
    assert counts is not None and int(counts.sum()) == n
    assert len(ser.t) - ser.reps == n - retire.RETIRE_TICKS
    block = slice(0, retire.RETIRE_TICKS)
    assert _close(float(ser.rep_w.array().sum()), float(tick_weights(t[block]).sum()))
    assert float(np.nanmax(series_array(ser, "link")[: ser.reps])) == float(link[block].max())
    means = ser.rep_means["link"].array()
    assert _close(float((means * ser.rep_n.array()).sum()), float(link[block].sum()), 1e-9)
    assert float(np.diff(series_array(ser, "t")).min()) >= 0  # still in time order
    kept = retire.retired_segments(ser)
    assert kept and kept[0]["start"] == t[0] and kept[-1]["end"] <= t[retire.RETIRE_TICKS]
    assert sum(s["end"] - s["start"] for s in kept) == pytest.approx(t[retire.RETIRE_TICKS - 1] - t[0])


def test_a_plot_of_a_long_session_draws_every_tick_and_the_report_is_the_same(
    long_recording: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    from pcie_tui.cli.main import main
    from pcie_tui.plot import figure

    drawn = []
    monkeypatch.setattr(figure, "_phase_colours", _spy(figure._phase_colours, drawn))
    assert main(["report", str(long_recording), "--json"]) == 0
    alone = capsys.readouterr().out
    assert main(["report", str(long_recording), "--json", "--plot", str(tmp_path / "t.svg")]) == 0
    assert capsys.readouterr().out == alone  # the numbers are the report's
    assert (tmp_path / "t.svg").stat().st_size > 0
    (an,) = drawn
    assert an.series[0].reps == 0 and len(an.series[0].t) >= N_TICKS  # the drawing's analysis: every tick


def _spy(fn: Any, seen: list[Any]) -> Any:
    def wrapped(an: Any, rows: Any) -> Any:
        seen.append(an)
        return fn(an, rows)

    return wrapped


def _tallies(events: Any, folded: dict[Any, Any]) -> dict[Any, list[Any]]:
    """Per resource and phase: how many events, their ticks, exact seconds and use, the highest peak."""
    out: dict[Any, list[Any]] = {}
    for e in events:
        t = out.setdefault((e.resource, e.phase), [0, 0, Fraction(0), Fraction(0), None])
        t[0] += 1
        t[1] += e.n
        t[2] += Fraction(e.end) - Fraction(e.start)
        t[3] += Fraction(e.sum_util)
        t[4] = e.peak_util if t[4] is None else max(t[4], e.peak_util)
    for key, f in folded.items():
        t = out.setdefault(key, [0, 0, Fraction(0), Fraction(0), None])
        t[:4] = [t[0] + f.count, t[1] + f.ticks, t[2] + f.seconds, t[3] + f.util]
        t[4] = f.peak if t[4] is None else max(t[4], f.peak)
    return out


HEAT_SOURCE = SOURCE.parent / "h100-heat.jsonl.gz"  # the H100 under sustained load: a stretch, an event a run
HEAT_TICKS = 30_000  # three blocks retired


@pytest.fixture(scope="module")
def heat_recording(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The H100 heat capture repeated (times shifted)."""
    with gzip.open(HEAT_SOURCE) as f:
        lines = [orjson.loads(raw) for raw in f]
    header, ticks = lines[0], [d for d in lines[1:] if "t" in d and "gpus" in d]
    span = ticks[-1]["t"] - ticks[0]["t"] + 0.1
    path = tmp_path_factory.mktemp("heat") / "heat.jsonl"
    with path.open("wb") as out:
        out.write(orjson.dumps(header) + b"\n")
        for n in range(HEAT_TICKS):
            k, d = divmod(n, len(ticks))
            out.write(orjson.dumps(dict(ticks[d], t=ticks[d]["t"] + k * span)) + b"\n")
    return path


@pytest.fixture(scope="module")
def heat_both(heat_recording: Path) -> tuple[dict[str, Any], Any, dict[str, Any], Any]:
    """(report, analyzer) with old events and stretches folded (a GPU keeps its 3 longest old ones whole),
    and the same with nothing retired or folded."""
    path = heat_recording
    mp = pytest.MonkeyPatch()
    mp.setattr(fold, "KEEP_LONGEST", 3)
    try:
        folded, an, _, _ = report_file(path)
        mp.setattr(retire, "EXACT_TICKS", 10**9)
        exact, an_exact, _, _ = report_file(path)
    finally:
        mp.undo()
    return finite_json(folded), an, finite_json(exact), an_exact


def test_old_events_fold_into_counts_that_add_up(heat_both) -> None:
    """Saturation events that ended before the oldest exact tick: the longest kept whole, the rest counted per
    resource and phase; kept and counted together are what the unfolded analysis has, exactly."""
    s, an, e, an_exact = heat_both
    assert an.folded.get(0) and len(an.events) < len(an_exact.events)
    assert _tallies(an.events, an.folded[0]) == _tallies(an_exact.events, {})
    g, ge = s["gpus"][0], e["gpus"][0]
    assert "events_folded" not in ge
    assert len(g["events"]) + sum(f["events"] for f in g["events_folded"]) == len(ge["events"])
    longest = max(an_exact.events, key=lambda x: x.end - x.start)
    assert longest.to_json() in g["events"]  # the longest stay listed
    first = an.series[0].t.array()[an.series[0].reps]
    assert all(x in g["events"] for x in ge["events"] if x["end"] >= first)  # and every one since the oldest exact tick
    assert an.events_count() == an_exact.events_count()
    for k in ("duration_s", "ticks", "first_start", "last_end", "peak_util"):  # what the JSON says of them
        assert all(f[k] is not None for f in g["events_folded"])
    n = len(ge["events"]) - len(g["events"])
    assert f"and {n:,} more saturation events" in fold.folded_events_line(g["events_folded"])  # the text says so


def test_old_stretches_fold_into_counts_that_add_up(heat_both) -> None:
    """Throttled stretches likewise: a GPU's longest old ones listed, the rest counted per reason and phase;
    listed and counted add up to the unfolded analysis' stretches, and the heat figures do not move."""
    s, an, e, _ = heat_both
    h, he = s["heat"], e["heat"]
    assert h["stretches_folded"] and "stretches_folded" not in he and len(h["stretches"]) < len(he["stretches"])
    for k in ("gpus", "phases", "lost_s", "lost_share"):
        assert h[k] == he[k], k
    sums: dict[Any, list[float]] = {}
    for st in he["stretches"]:
        x = sums.setdefault((st["gpu"], st["reason"], st["phase"]), [0, 0, 0.0])
        x[0], x[1], x[2] = x[0] + 1, x[1] + st["ticks"], x[2] + st["duration_s"]
    for st in h["stretches"]:
        x = sums[(st["gpu"], st["reason"], st["phase"])]
        x[0], x[1], x[2] = x[0] - 1, x[1] - st["ticks"], x[2] - st["duration_s"]
    for f in h["stretches_folded"]:
        x = sums[(f["gpu"], f["reason"], f["phase"])]
        x[0], x[1], x[2] = x[0] - f["stretches"], x[1] - f["ticks"], x[2] - f["duration_s"]
    assert all(x[0] == 0 and x[1] == 0 and abs(x[2]) < 1e-6 for x in sums.values()), sums
    assert all(st in he["stretches"] for st in h["stretches"])  # the listed ones, whole
    lines = heat_lines(h, s["start"])
    assert any(f"of {len(he['stretches'])}; --json lists {len(h['stretches'])}, " in x for x in lines)
    assert any("older stretches, counted" in x for x in lines)
    assert an.events_count() == sum(1 for _ in he["stretches"]) + len(e["gpus"][0]["events"])


@pytest.mark.parametrize("chunk", [1_000, 7_777])
def test_folding_does_not_depend_on_the_chunks(heat_recording: Path, heat_both, chunk: int) -> None:
    path = heat_recording
    mp = pytest.MonkeyPatch()
    mp.setattr(fold, "KEEP_LONGEST", 3)
    try:
        out = _fed_in_chunks(path, chunk)
    finally:
        mp.undo()
    assert json.dumps(finite_json(out), sort_keys=True) == json.dumps(heat_both[0], sort_keys=True)


def test_the_ticks_retired_are_labelled_as_the_whole_series_labels_them(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``retire`` gets the codes of the ticks it takes alone (session._retire_codes labels only those): at every
    retire they are the whole series' labels (``_label_codes``) of those rows, events still open included. On
    h200-pinned repeated (its prefill saturates the link: saturated ticks are among those retired)."""
    pinned = _repeated(SOURCE.with_name("h200-pinned.jsonl.gz"), 30_000, tmp_path / "pinned.jsonl")
    from pcie_tui.analyze import session

    seen: list[int] = []
    real = session.retire

    def checked(ser: GpuSeries, block_codes: np.ndarray, cuts: tuple[float, ...] = ()) -> None:
        an = analyzers[-1]
        gi = next(g for g, s in an.series.items() if s is ser)
        whole = an._label_codes(gi, ser.t)[ser.reps : ser.reps + retire.RETIRE_TICKS]
        assert np.array_equal(block_codes, whole)
        seen.append(int(np.count_nonzero(whole != VERDICTS.index("none"))))
        real(ser, block_codes, cuts)

    analyzers: list[Any] = []
    init = session.SessionAnalyzer.__init__

    def remember(self: Any, *a: Any, **k: Any) -> None:
        init(self, *a, **k)
        analyzers.append(self)

    monkeypatch.setattr(session, "retire", checked)
    monkeypatch.setattr(session.SessionAnalyzer, "__init__", remember)
    report_file(pinned)
    assert len(seen) >= 3 and sum(seen) > 0  # several retires, with saturated ticks among those retired
