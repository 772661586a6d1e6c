"""Live prefill progress from llama-server's log (b11434 ``print_timings_pp``), before a request ends.

The lines are the H200's own (tests/fixtures/h200-runs/attrib/ngl8-server.log, -ngl 8, a 4000-token
prompt at 670 tokens/s); no engine is run.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from pcie_tui.engines.llamacpp.log import LogTailer, TimingParser, parse_progress

H200_LOG = Path(__file__).parent / "fixtures" / "h200-runs" / "attrib" / "ngl8-server.log"


def test_a_prefill_progress_line_parses_to_numbers():
    line = (
        "0.09.436.577 I slot print_timing: id  0 | task 8 | prompt processing, n_tokens =   2048, "
        "progress = 0.51, t =   3.08 s / 665.93 tokens per second"
    )
    assert parse_progress(line) == {
        "slot": 0,
        "task": 8,
        "phase": "prefill",
        "n_tokens": 2048,
        "progress": 0.51,
        "t_s": 3.08,
        "tokens_per_s": 665.93,
    }
    tg = "1.02.000.001 I slot print_timing: id  3 | task 12 | n_gen =    200, tg =  30.50 t/s, tg_3s =  31.25 t/s"
    assert parse_progress(tg) == {
        "slot": 3,
        "task": 12,
        "phase": "decode",
        "n_tokens": 200,
        "tokens_per_s": 30.5,
        "tokens_per_s_3s": 31.25,
    }
    for other in (
        "0.12.395.001 I slot print_timing: id  0 | task 8 | prompt eval time =    6033.85 ms /  4000 tokens",
        "0.00.110.763 I srv    load_model: loading model '/tmp/llb/model.gguf'",
    ):
        assert parse_progress(other) is None


def test_progress_lines_are_not_taken_for_a_multi_line_timing_header():
    p = TimingParser()
    p.feed(
        "slot print_timing: id  0 | task 8 | prompt processing, n_tokens = 2048, progress = 0.51, t = 3.08 s / 665.93 tokens per second"
    )
    assert p._header_left == 0  # a bare "prompt eval time" after it is not slot 0's


def _write(path: Path, lines: list[str]) -> None:
    with path.open("a") as f:
        f.write("".join(x + "\n" for x in lines))


def test_the_tailer_shows_a_running_prefill_and_drops_it_when_the_request_ends(tmp_path: Path):
    lines = H200_LOG.read_text().splitlines()
    head = [x for x in lines if "task 8 |" not in x and "task 45" not in x and "task 106" not in x]
    task8 = [x for x in lines if "task 8 |" in x]
    log = tmp_path / "server.log"
    _write(log, head[:8])  # loaded, listening
    t = LogTailer(str(log), from_start=True)
    assert t.poll() == [] and t.progress() == []
    _write(log, task8[:2])  # two progress lines: the second is the latest
    assert t.poll() == []
    (live,) = t.progress()
    assert {k: live[k] for k in ("slot", "task", "phase", "n_tokens", "progress")} == {
        "slot": 0,
        "task": 8,
        "phase": "prefill",
        "n_tokens": 2560,
        "progress": 0.64,
    }
    assert live["t_s"] == pytest.approx(3.81) and live["tokens_per_s"] == pytest.approx(671.41) and live["t"] > 0
    _write(log, task8[2:4])
    t.poll()
    assert t.progress()[0]["progress"] == 0.9
    _write(log, task8[4:])  # prompt eval / eval / total time: the request ended
    (req,) = t.poll()
    assert (req["slot"], req["prompt_n"]) == (0, 4000) and t.progress() == []


def test_a_released_slot_is_no_longer_in_progress(tmp_path: Path):
    log = tmp_path / "server.log"
    log.write_text("")
    t = LogTailer(str(log), from_start=True)
    _write(
        log,
        [
            "0.01.000.000 I slot print_timing: id  1 | task 5 | prompt processing, n_tokens =    512, progress = 0.10, t =   3.10 s / 165.16 tokens per second",
            "0.01.100.000 I slot print_timing: id  2 | task 6 | prompt processing, n_tokens =   1024, progress = 0.20, t =   3.20 s / 320.00 tokens per second",
        ],
    )
    t.poll()
    assert [(r["slot"], r["task"]) for r in t.progress()] == [(1, 5), (2, 6)]
    _write(log, ["0.02.000.000 I slot      release: id  1 | task 5 | stop processing: n_tokens = 600, truncated = 0"])
    t.poll()
    assert [r["slot"] for r in t.progress()] == [2]


def test_the_reading_carries_the_progress_and_the_engine_panel_shows_it(tmp_path: Path):
    """The client puts the log's live progress into its reading (numbers only, recorded with the tick), and
    the engine panel says it in words, with units: what a long prefill has done before its request ends."""
    from pcie_tui.engines.llamacpp.client import LlamaCppClient
    from pcie_tui.tui.engine_panel import progress_line

    log = tmp_path / "server.log"
    log.write_text("")
    client = LlamaCppClient("http://127.0.0.1:9", log_path=str(log))  # nothing listens: the log still reads
    client.read()
    lines = [x for x in H200_LOG.read_text().splitlines() if "task 8 |" in x]
    _write(log, lines[:2])
    e = client.read()
    (live,) = e.extra["progress"]
    assert (live["slot"], live["phase"], live["n_tokens"], live["progress"]) == (0, "prefill", 2560, 0.64)
    assert set(map(type, live.values())) <= {int, float, str} and live["phase"] in ("prefill", "decode")
    assert progress_line(e.extra["progress"]) == "log: slot 0 prefill 64 % (2,560 tok in 3.81 s, 671 tok/s)"
    decode = {"slot": 2, "task": 9, "phase": "decode", "n_tokens": 100, "tokens_per_s": 30.5}
    assert progress_line([decode]) == "log: slot 2 decode 100 tok at 30.5 tok/s"
    assert progress_line([]) is None and progress_line(None) is None and progress_line([{"slot": "x"}]) is None
    _write(log, lines[2:])  # the request ended: nothing in progress
    assert "progress" not in client.read().extra
