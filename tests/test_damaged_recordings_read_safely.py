"""Damaged and odd recordings: validation at the reader, segments, gaps, time order (issue 10)."""

from __future__ import annotations

import gzip
import json
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest

from pcie_tui.recording.reader import read_recording
from pcie_tui.recording.replay import ReplaySource
from pcie_tui.report.text import build_report

REPO = Path(__file__).resolve().parents[1]
PROBE = REPO / "tests" / "fixtures" / "h200-probe.jsonl"
LLAMA = REPO / "pcie_tui" / "data" / "h200-llama-full.jsonl.gz"


def _lines(path: Path) -> list[str]:
    raw = path.read_bytes()
    text = gzip.decompress(raw).decode() if raw[:2] == b"\x1f\x8b" else raw.decode()
    return [x for x in text.splitlines() if x.strip()]


def _cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "pcie_tui", *args], capture_output=True, text=True, timeout=120)


def _strict(text: str) -> object:
    def no(c: str) -> None:
        raise AssertionError(f"{c} in JSON output")

    return json.loads(text, parse_constant=no)


def _damaged(tmp_path: Path, edit) -> Path:
    lines = _lines(PROBE)
    ticks = [json.loads(x) for x in lines[1:]]
    edit(ticks)
    p = tmp_path / "damaged.jsonl"
    # NaN/Infinity as Python's json writes them (what a foreign or older writer could leave)
    p.write_text("\n".join([lines[0], *(json.dumps(t) for t in ticks)]) + "\n")
    return p


def test_nonfinite_negative_and_over_100_percent_are_unavailable(tmp_path):
    def edit(ticks):
        g = ticks[60]["gpus"][0]
        g.update(pcie_rx_Bps=float("inf"), pcie_tx_Bps=-5.0, dram_bw_util=7.5, sm_util=float("nan"))
        ticks[61]["gpus"][0].update(power_W=float("-inf"), mem_busy=1.03, link_width=3, link_gen=9)

    p = _damaged(tmp_path, edit)
    r = _cli("report", "--json", str(p))
    assert r.returncode == 0, r.stderr
    rep = _strict(r.stdout)
    g = rep["gpus"][0]
    assert g["dram_util"]["peak"] <= 1.0 and g["link_Bps"]["peak"] < 1e12
    w = "\n".join(rep["warnings"])
    for kind in ("pcie_rx_Bps", "pcie_tx_Bps out of range", "dram_bw_util out of range", "link_width out of range"):
        assert kind in w, w
    assert "line 62" in w and "read as unavailable" in w  # tick 60 is line 62 (header is line 1)
    assert r.stderr.count("warning:") == len(rep["warnings"])  # one stderr line per kind
    rec = read_recording(p, warn=False)
    assert rec.samples[60].gpus[0].pcie_rx_Bps is None and rec.samples[60].gpus[0].pcie_tx_Bps is None
    assert rec.samples[61].gpus[0].mem_busy == 1.0  # small overshoot: counter jitter, clamped
    text = _cli("report", str(p))
    assert text.returncode == 0 and not re.search(r"\b(inf|nan)\s*(GB/s|TB/s|MB/s|kB/s|%)", text.stdout, re.I)
    assert "750 %" not in text.stdout


@pytest.mark.parametrize("junk", ["fast", [1, 2], True, {"a": 1}, 10**400])
def test_wrong_types_are_unavailable_not_a_traceback(tmp_path, junk):
    def edit(ticks):
        ticks[10]["gpus"][0]["pcie_rx_Bps"] = junk
        ticks[11]["gpus"][0]["mem_used_bytes"] = junk
        ticks[12]["t"] = junk
        ticks[13]["gpus"][0]["index"] = junk

    p = _damaged(tmp_path, edit)
    r = _cli("report", "--json", str(p))
    assert r.returncode == 0 and "Traceback" not in r.stderr, r.stderr
    rep = _strict(r.stdout)
    assert rep["ticks"] == len(_lines(PROBE)) - 2  # the tick without a usable t is skipped
    rec = read_recording(p, warn=False)
    assert all(isinstance(s.t, float) for s in rec.samples)  # replay builds Samples from the same rows
    assert rec.samples[10].gpus[0].pcie_rx_Bps is None


def _concat(tmp_path: Path, shift_s: float, gz: bool) -> tuple[Path, int]:
    lines = _lines(PROBE)
    second = [lines[0]] + [json.dumps(dict(d, t=d["t"] + shift_s)) for d in map(json.loads, lines[1:])]
    a, b = "\n".join(lines) + "\n", "\n".join(second) + "\n"
    p = tmp_path / ("cat.jsonl.gz" if gz else "cat.jsonl")
    p.write_bytes(gzip.compress(a.encode()) + gzip.compress(b.encode()) if gz else (a + b).encode())
    return p, len(lines) - 1


@pytest.mark.parametrize("gz", [False, True])
def test_a_second_copy_is_set_aside_not_counted_twice(tmp_path, gz):
    p, n = _concat(tmp_path, 0.0, gz)
    rec = read_recording(p, warn=False)
    assert len(rec.samples) == n
    w = "\n".join(rec.warnings)
    assert "holds 2 recordings" in w and f"{n} set aside" in w and "time repeats" in w
    assert [s["ticks"] for s in rec.segments] == [n, 0]


@pytest.mark.parametrize("gz", [False, True])
def test_a_second_recording_an_hour_later_is_a_segment_and_the_hole_is_excluded(tmp_path, gz):
    p, n = _concat(tmp_path, 3600.0, gz)
    rec = read_recording(p, warn=False)
    assert len(rec.samples) == 2 * n and len(rec.segments) == 2
    rep, _ = build_report(rec)
    holes = [g for g in rep["gaps"] if g["event"] == "recording_gap"]
    assert len(holes) == 1 and holes[0]["reason"].startswith("new segment") and holes[0]["duration_s"] > 3500
    assert rep["gaps_s"] == holes[0]["duration_s"]
    verdict_time = sum(rep["gpus"][0]["time_in_verdict_s"].values())
    assert verdict_time == pytest.approx(rep["duration_s"] - rep["gaps_s"], abs=1e-6)
    assert rep["gpus"][0]["time_in_verdict_s"]["none"] < 100  # not 3,600 s of "none"
    # replay steps over the hour
    src = ReplaySource(rec, speed=1.0)
    src.seek_to_index(n - 2)
    t0 = time.monotonic()
    got = [src.read() for _ in range(3)]
    assert got[-1] is rec.samples[n] and time.monotonic() - t0 < 2.0


def test_backwards_time_is_named_and_set_aside(tmp_path):
    lines = _lines(LLAMA)
    ticks = [json.loads(x) for x in lines[1:]]
    body = ticks[:100] + ticks[40:60] + ticks[100:]  # 20 ticks replayed from the past
    p = tmp_path / "back.jsonl"
    p.write_text("\n".join([lines[0], *map(json.dumps, body)]) + "\n")
    orig = read_recording(LLAMA, warn=False)
    clean, _ = build_report(orig)
    rec = read_recording(p, warn=False)
    rep, _ = build_report(rec)
    assert len(rec.samples) == len(orig.samples)
    w = "\n".join(rep["warnings"])
    assert "time goes back" in w and "line 102" in w and "20 times; ticks set aside" in w
    for k in ("prompt_tokens_per_s", "generation_tokens_per_s", "ttft_s"):
        assert rep["engine"][k] == clean["engine"][k]


def test_a_gpu_not_in_the_header_is_left_out_of_report_and_replay_alike(tmp_path):
    def edit(ticks):
        for d in ticks[50:]:
            d["gpus"].append(dict(d["gpus"][0], index=3))

    p = _damaged(tmp_path, edit)
    rec = read_recording(p, warn=False)
    rep, _ = build_report(rec)
    assert [g["index"] for g in rep["gpus"]] == [0]
    assert {g.index for s in rec.samples for g in s.gpus} == {0}
    w = [x for x in rep["warnings"] if "GPU 3 is not in the header" in x]
    assert len(w) == 1 and "line 52" in w[0] and "report and replay alike" in w[0]


def test_gzip_cut_names_the_file_and_tells_a_cut_from_a_stopped_writer(tmp_path):
    data = gzip.compress(PROBE.read_bytes())
    cut = tmp_path / "cut.jsonl.gz"
    cut.write_bytes(data[: len(data) // 2])
    rec = read_recording(cut, warn=False)
    w = [x for x in rec.warnings if "gzip stream ends early" in x]
    assert len(w) == 1 and str(cut) in w[0] and "writer" not in w[0] and "cut short or damaged" in w[0]


def test_header_junk_is_checked_too(tmp_path):
    lines = _lines(PROBE)
    h = json.loads(lines[0])
    h["interval_s"] = "fast"
    h["gpus"][0]["link"]["capacity_Bps"] = -1
    h["gpus"][0]["memory_total_bytes"] = [1]
    p = tmp_path / "h.jsonl"
    p.write_text("\n".join([json.dumps(h), *lines[1:]]) + "\n")
    r = _cli("report", "--json", str(p))
    assert r.returncode == 0, r.stderr
    rep = _strict(r.stdout)
    assert any("header interval_s invalid" in x for x in rep["warnings"])
    h["gpus"] = [{"index": "zero"}]
    p.write_text("\n".join([json.dumps(h), *lines[1:]]) + "\n")
    r = _cli("report", str(p))
    assert r.returncode == 0 and "Traceback" not in r.stderr


def test_engine_only_recording_reports_and_replays_with_the_reason(tmp_path):
    from pcie_tui.tui.app import make_app
    from pcie_tui.tui.headless import run, screen_text, wait_until

    lines = _lines(LLAMA)
    h = json.loads(lines[0])
    h["gpus"], h["gpu_unavailable"] = [], "NVML could not start (NVML Shared Library Not Found)"
    ticks = [dict(json.loads(x), gpus=[]) for x in lines[1:]]
    p = tmp_path / "engine-only.jsonl"
    p.write_text("\n".join([json.dumps(h), *map(json.dumps, ticks)]) + "\n")
    r = _cli("report", str(p))
    assert r.returncode == 0 and "GPU side unavailable: NVML could not start" in r.stdout, r.stderr
    rec = read_recording(p, warn=False)
    app = make_app(ReplaySource(rec, speed=8.0))

    async def go():
        async with app.run_test(size=(120, 40)) as pilot:
            await wait_until(pilot, lambda: app.frame is not None and app.frame.ticks > 3)
            text = screen_text(app)
            assert "GPU side unavailable: NVML could not start" in text
            assert "llamacpp" in text or "llama" in text.lower()

    run(go())
