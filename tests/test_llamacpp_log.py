"""llama-server log parsing: every known timing format, tailing, and request_stats.

The lines below are real server output as published in public logs and bug reports
(sources noted); the 2023 ``print_timings:`` form is printed with that server's own
format string, since no published copy was found.
"""

from __future__ import annotations

import os

import pytest

from pcie_tui.engines.llamacpp.log import LogTailer, TimingParser, parse_lines, request_stats

# 2025+ upstream: one SLT_INF line each, with --log-prefix/--log-timestamps and colours on.
CURRENT_COLOURED = [
    "\x1b[34m10.54.639.911\x1b[0m \x1b[32mI \x1b[0mslot print_timing: id  0 | task 0 | prompt eval time =    8119.49 ms /  3138 tokens (    2.59 ms per token,   386.48 tokens per second)",
    "\x1b[34m10.54.639.914\x1b[0m \x1b[32mI \x1b[0mslot print_timing: id  0 | task 0 |        eval time =   41904.01 ms /  1291 tokens (   32.46 ms per token,    30.81 tokens per second)",
    "\x1b[34m10.54.639.915\x1b[0m \x1b[32mI \x1b[0mslot print_timing: id  0 | task 0 |       total time =   50023.50 ms /  4429 tokens",
    "\x1b[34m10.54.639.915\x1b[0m \x1b[32mI \x1b[0mslot print_timing: id  0 | task 0 |    graphs reused =        1290",
]

# Late 2024: one multi-line SLT_INF; the three timing lines carry no prefix.
MULTILINE = (
    "slot update_slots: id  3 | task 0 | prompt processing done, n_tokens = 1595, batch.n_tokens = 4\n"
    "slot print_timing: id  3 | task 0 | \n"  # the trailing space is the server's
    """prompt eval time =    1009.35 ms /  1595 tokens (    0.63 ms per token,  1580.23 tokens per second)
       eval time =    2578.94 ms /   188 tokens (   13.72 ms per token,    72.90 tokens per second)
      total time =    3588.29 ms /  1783 tokens
slot      release: id  3 | task 0 | stop processing: n_tokens = 1782, truncated = 0
srv  update_slots: all slots are idle
"""
).splitlines()

# 2024 server_log text format (ik_llama.cpp bug report, same format as upstream mid-2024).
SERVER_TEXT = [
    'INFO [           print_timings] prompt eval time     =    1428.08 ms /   756 tokens (    1.89 ms per token,   529.38 tokens per second) | tid="133287468544000" timestamp=1746695972 id_slot=0 id_task=0 t_prompt_processing=1428.075 n_prompt_tokens_processed=756 t_token=1.8889880952380953 n_tokens_second=529.383960926422',
    'INFO [           print_timings] generation eval time =   44081.50 ms /  2038 runs   (   21.63 ms per token,    46.23 tokens per second) | tid="133287468544000" timestamp=1746695972 id_slot=0 id_task=0 t_token_generation=44081.501 n_decoded=2038 t_token=21.629784592737977 n_tokens_second=46.23254548432914',
    'INFO [           print_timings]           total time =   45509.58 ms | tid="133287468544000" timestamp=1746695972 id_slot=0 id_task=0 t_prompt_processing=1428.075 t_token_generation=44081.501 t_total=45509.575999999994',
    'INFO [            update_slots] slot released | tid="133287468544000" timestamp=1746695972 id_slot=0 id_task=0 n_ctx=32768 n_past=2793 n_system_tokens=0 n_cache_tokens=0 truncated=false',
]

# 2024 server_log JSON format (--log-format json). The prompt line is a published one; the
# published excerpt stops there, so the next two carry only the message (the parser then reads
# the message text, as it must for any line without the numeric fields).
SERVER_JSON = [
    '{"tid":"125380885884928","timestamp":1756831192,"level":"INFO","function":"print_timings","line":819,"msg":"prompt eval time     =    7928.04 ms /  2386 tokens (    3.32 ms per token,   300.96 tokens per second)","id_slot":0,"id_task":0,"t_prompt_processing":7928.044,"n_prompt_tokens_processed":2386,"t_token":3.3227342833193627,"n_tokens_second":300.95695735291076}',
    '{"tid":"125380885884928","timestamp":1756831192,"level":"INFO","function":"print_timings","line":835,"msg":"generation eval time =    1575.14 ms /    44 runs   (   35.80 ms per token,    27.93 tokens per second)","id_slot":0,"id_task":0}',
    '{"tid":"125380885884928","timestamp":1756831192,"level":"INFO","function":"print_timings","line":842,"msg":"          total time =    9503.18 ms","id_slot":0,"id_task":0}',
]

# libllama's own report (llama.cpp CI log, 2023) and its 2024+ name (CI log).
LLAMA_PRINT_TIMINGS = """\
llama_print_timings:        load time =   576.45 ms
llama_print_timings:      sample time =   283.10 ms /   400 runs   (    0.71 ms per token,  1412.91 tokens per second)
llama_print_timings: prompt eval time =   599.83 ms /    19 tokens (   31.57 ms per token,    31.68 tokens per second)
llama_print_timings:        eval time = 24513.59 ms /   399 runs   (   61.44 ms per token,    16.28 tokens per second)
llama_print_timings:       total time = 25431.49 ms
""".splitlines()
LLAMA_PRINT_TIMINGS_OLDEST = """\
llama_print_timings:        load time = 26628.92 ms
llama_print_timings:      sample time =    49.99 ms /   128 runs   (    0.39 ms per token)
llama_print_timings: prompt eval time =   353.32 ms /     2 tokens (  176.66 ms per token)
llama_print_timings:        eval time = 32074.79 ms /   127 runs   (  252.56 ms per token)
llama_print_timings:       total time = 58777.76 ms
""".splitlines()
PERF_CONTEXT = """\
0.00.059.294 I llama_perf_context_print:        load time =      50.13 ms
0.00.059.296 I llama_perf_context_print: prompt eval time =       7.07 ms /     9 tokens (    0.79 ms per token,  1273.71 tokens per second)
0.00.059.297 I llama_perf_context_print:        eval time =       0.00 ms /     1 runs   (    0.00 ms per token,      inf tokens per second)
0.00.059.298 I llama_perf_context_print:       total time =       8.87 ms /    10 tokens
""".splitlines()


def _server_2023_lines(t_prompt: float, n_prompt: int, t_gen: float, n_gen: int) -> list[str]:
    # Format strings of server.cpp's print_timings() (2023, LOG_TEE), applied as printf would.
    # ruff: printf-style on purpose: these are the C format strings.
    return [
        "",
        "print_timings: prompt eval time = %10.2f ms / %5d tokens (%8.2f ms per token, %8.2f tokens per second)"  # noqa: UP031
        % (t_prompt, n_prompt, t_prompt / n_prompt, 1e3 / t_prompt * n_prompt),
        "print_timings:        eval time = %10.2f ms / %5d runs   (%8.2f ms per token, %8.2f tokens per second)"  # noqa: UP031
        % (t_gen, n_gen, t_gen / n_gen, 1e3 / t_gen * n_gen),
        "print_timings:       total time = %10.2f ms" % (t_prompt + t_gen),  # noqa: UP031
    ]


def test_current_format_with_colours_and_prefix():
    (r,) = parse_lines(CURRENT_COLOURED)
    assert (r["prompt_n"], r["prompt_ms"], r["predicted_n"], r["predicted_ms"]) == (3138, 8119.49, 1291, 41904.01)
    assert (r["slot"], r["task"], r["total_ms"], r["format"]) == (0, 0, 50023.50, "slot")


def test_multiline_format():
    (r,) = parse_lines(MULTILINE)
    assert (r["prompt_n"], r["prompt_ms"], r["predicted_n"], r["predicted_ms"]) == (1595, 1009.35, 188, 2578.94)
    assert (r["slot"], r["task"], r["format"]) == (3, 0, "slot-multiline")


def test_server_text_format():
    (r,) = parse_lines(SERVER_TEXT)
    assert (r["prompt_n"], r["prompt_ms"], r["predicted_n"], r["predicted_ms"]) == (756, 1428.08, 2038, 44081.50)
    assert (r["slot"], r["task"], r["format"], r["total_ms"]) == (0, 0, "server-text", 45509.58)


def test_server_json_format_prefers_unrounded_fields():
    (r,) = parse_lines(SERVER_JSON)
    # prompt from the numeric fields (unrounded), generation from the message text
    assert (r["prompt_n"], r["prompt_ms"], r["predicted_n"], r["predicted_ms"]) == (2386, 7928.044, 44, 1575.14)
    assert (r["slot"], r["format"], r["total_ms"]) == (0, "server-json", 9503.18)


def test_old_json_keys_2023():
    lines = [
        '{"timestamp":1700000000,"level":"INFO","function":"print_timings","line":1,"msg":"prompt eval time     =      50.00 ms /    10 tokens (    5.00 ms per token,   200.00 tokens per second)","slot_id":2,"task_id":7,"t_prompt_processing":50.0,"num_prompt_tokens_processed":10,"t_token":5.0,"n_tokens_second":200.0}',
        '{"timestamp":1700000000,"level":"INFO","function":"print_timings","line":2,"msg":"generation eval time =     100.00 ms /     4 runs   (   25.00 ms per token,    40.00 tokens per second)","slot_id":2,"task_id":7,"t_token_generation":100.0,"n_decoded":4,"t_token":25.0,"n_tokens_second":40.0}',
        '{"timestamp":1700000000,"level":"INFO","function":"print_timings","line":3,"msg":"          total time =     150.00 ms","slot_id":2,"task_id":7,"t_prompt_processing":50.0,"t_token_generation":100.0,"t_total":150.0}',
    ]
    (r,) = parse_lines(lines)
    assert (r["prompt_n"], r["predicted_n"], r["slot"], r["task"]) == (10, 4, 2, 7)


def test_libllama_reports():
    (a,) = parse_lines(LLAMA_PRINT_TIMINGS)
    assert (a["prompt_n"], a["prompt_ms"], a["predicted_n"], a["predicted_ms"]) == (19, 599.83, 399, 24513.59)
    assert a["format"] == "llama_print_timings" and a["total_ms"] == 25431.49 and "slot" not in a
    (b,) = parse_lines(LLAMA_PRINT_TIMINGS_OLDEST)
    assert (b["prompt_n"], b["predicted_n"], b["predicted_ms"]) == (2, 127, 32074.79)
    (c,) = parse_lines(PERF_CONTEXT)
    assert (c["prompt_n"], c["prompt_ms"], c["predicted_n"], c["format"]) == (9, 7.07, 1, "llama_perf_context_print")


def test_server_2023_format():
    (r,) = parse_lines(_server_2023_lines(123.456, 42, 789.0, 17))
    assert (r["prompt_n"], r["prompt_ms"], r["predicted_n"], r["predicted_ms"]) == (42, 123.46, 17, 789.0)
    assert r["format"] == "print_timings"


def test_progress_lines_and_partial_requests_are_not_requests():
    p = TimingParser()
    lines = [
        "8.44.220.334 I slot print_timing: id  0 | task 0 | prompt processing, n_tokens =   5832, progress = 1.00, t =   3.55 s / 1644.70 tokens per second",
        "8.47.583.592 I slot print_timing: id  0 | task 0 | n_decoded =    198, tg =  65.77 t/s, tg_3s =  65.77 t/s",
        # A tail that starts mid-request: eval + total without their prompt line.
        "slot print_timing: id  1 | task 5 |        eval time =      10.00 ms /     2 tokens (    5.00 ms per token,   200.00 tokens per second)",
        "slot print_timing: id  1 | task 5 |       total time =      10.00 ms /     2 tokens",
    ]
    assert [p.feed(x) for x in lines] == [None, None, None, None]


def test_interleaved_slots_are_kept_apart():
    a = "slot print_timing: id  0 | task 1 | "
    b = "slot print_timing: id  1 | task 2 | "
    lines = [
        a + "prompt eval time =      10.00 ms /    11 tokens (    0.91 ms per token,  1100.00 tokens per second)",
        b + "prompt eval time =      20.00 ms /    22 tokens (    0.91 ms per token,  1100.00 tokens per second)",
        b + "       eval time =      40.00 ms /     4 tokens (   10.00 ms per token,   100.00 tokens per second)",
        a + "       eval time =      30.00 ms /     3 tokens (   10.00 ms per token,   100.00 tokens per second)",
        a + "      total time =      40.00 ms /    14 tokens",
        b + "      total time =      60.00 ms /    26 tokens",
    ]
    got = parse_lines(lines)
    assert [(r["slot"], r["prompt_n"], r["predicted_n"]) for r in got] == [(0, 11, 3), (1, 22, 4)]


def test_tailer_offsets_partial_lines_truncation_and_rotation(tmp_path):
    log = tmp_path / "server.log"
    log.write_text("old line\n" + "\n".join(CURRENT_COLOURED[:3]) + "\n")
    t = LogTailer(str(log))  # attach: what is already there is history
    assert t.poll() == []
    with open(log, "a") as f:
        f.write(MULTILINE[1] + "\n" + MULTILINE[2] + "\n" + MULTILINE[3] + "\n      total time")
    assert t.poll() == []  # the total line is not finished yet
    with open(log, "a") as f:
        f.write(" =    3588.29 ms /  1783 tokens\n")
    (r,) = t.poll()
    assert r["prompt_n"] == 1595 and isinstance(r["t"], float)
    # Restarted with '>': the file shrinks, reading starts again from the top.
    log.write_text("\n".join(SERVER_TEXT[:3]) + "\n")
    (r,) = t.poll()
    assert r["prompt_n"] == 756
    # Rotated: a new file under the same name.
    os.rename(log, tmp_path / "server.log.1")
    log.write_text("\n".join(LLAMA_PRINT_TIMINGS) + "\n")
    (r,) = t.poll()
    assert r["prompt_n"] == 19
    assert t.poll() == []


def test_tailer_from_start_and_missing_file(tmp_path):
    log = tmp_path / "s.log"
    log.write_text("\n".join(CURRENT_COLOURED) + "\n")
    assert len(LogTailer(str(log), from_start=True).poll()) == 1
    gone = LogTailer(str(tmp_path / "nope.log"))
    assert gone.poll() == [] and "cannot read log" in (gone.error or "")


def test_request_stats_values():
    reqs = [
        {"prompt_n": 100, "prompt_ms": 50.0, "predicted_n": 10, "predicted_ms": 100.0},
        {"prompt_n": 300, "prompt_ms": 100.0, "predicted_n": 30, "predicted_ms": 200.0},
        {"prompt_n": 0, "prompt_ms": 0.0, "predicted_n": 5, "predicted_ms": 25.0},  # fully cached prompt
    ]
    s = request_stats(reqs)
    assert s["requests"] == 3 and s["prompt_tokens"] == 400 and s["generation_tokens"] == 45
    pr = s["prompt_tokens_per_s"]
    assert pr["n"] == 2 and pr["p50"] == pytest.approx(2500.0) and pr["overall"] == pytest.approx(400 / 0.15)
    gr = s["generation_tokens_per_s"]
    assert gr["n"] == 3 and gr["p50"] == pytest.approx(150.0) and gr["overall"] == pytest.approx(45 / 0.325)
    lat = s["prompt_latency_s"]
    assert lat["p50"] == pytest.approx(0.075) and lat["p99"] == pytest.approx(0.0995)


def test_request_stats_counts_a_repeated_request_once():
    r = {"t": 5.0, "seq": 1, "prompt_n": 100, "prompt_ms": 50.0, "predicted_n": 10, "predicted_ms": 100.0}
    other = dict(r, seq=2)
    assert request_stats([r, dict(r), other])["requests"] == 2


def test_request_stats_empty_is_none_not_zero():
    s = request_stats([])
    assert s["requests"] == 0
    assert s["prompt_tokens_per_s"]["p50"] is None and s["prompt_tokens_per_s"]["overall"] is None
    assert s["prompt_latency_s"]["p95"] is None
