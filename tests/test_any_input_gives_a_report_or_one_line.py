"""Property/fuzz suite (issue 10): any bytes, any JSON value in any field, into the recording reader
and the engine parsers, gives a report (or engine sample) or one clean UserError: never another
exception, never a non-finite number out. Example counts keep the whole file under ~60 s."""

from __future__ import annotations

import gzip
import json
import math
from pathlib import Path
from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from pcie_tui.core.errors import UserError
from pcie_tui.core.model import EngineSample
from pcie_tui.engines.llamacpp.client import LlamaCppClient
from pcie_tui.engines.llamacpp.log import parse_lines
from pcie_tui.engines.vllm import client as vllm_mod
from pcie_tui.recording.reader import read_recording
from pcie_tui.recording.validate import Tally, clean_engine_sample
from pcie_tui.report.text import build_report

REPO = Path(__file__).resolve().parents[1]
LLAMA = REPO / "pcie_tui" / "data" / "h200-llama-full.jsonl.gz"
VLLM_TEXT = (REPO / "tests" / "fixtures" / "vllm-0.32-metrics.txt").read_text()
_LINES = gzip.decompress(LLAMA.read_bytes()).decode().splitlines()
HEADER, TICKS = _LINES[0], [json.loads(x) for x in _LINES[1:40] if x.strip()]
FAST = settings(max_examples=1000, deadline=None, suppress_health_check=[HealthCheck.too_slow])

_json = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(min_value=-(10**30), max_value=10**30)
    | st.floats()  # NaN and infinities included: json.dumps writes them as NaN/Infinity
    | st.text(max_size=8),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=6), inner, max_size=4),
    max_leaves=12,
)


def _all_finite(obj: Any, path: str = "") -> None:
    if isinstance(obj, float):
        assert math.isfinite(obj), f"non-finite at {path}"
    elif isinstance(obj, dict):
        for k, v in obj.items():
            _all_finite(v, f"{path}.{k}")
    elif isinstance(obj, list | tuple):
        for i, v in enumerate(obj):
            _all_finite(v, f"{path}[{i}]")


def _report_or_user_error(path: Path) -> None:
    try:
        rec = read_recording(path, warn=False)
        if not rec.samples:
            return
        rep, _ = build_report(rec)
        list(rec.samples)  # what replay builds
    except UserError as e:
        assert str(e) and "\n" not in str(e)
        return
    _all_finite(rep)
    json.dumps(rep, allow_nan=False, default=str)


@FAST
@given(st.binary(max_size=400))
def test_any_bytes(tmp_path_factory, data):
    p = tmp_path_factory.mktemp("f") / "x.jsonl"
    p.write_bytes(data)
    _report_or_user_error(p)


@FAST
@given(st.binary(max_size=300), st.booleans())
def test_any_bytes_after_a_real_header(tmp_path_factory, data, gz):
    body = HEADER.encode() + b"\n" + json.dumps(TICKS[0]).encode() + b"\n" + data
    p = tmp_path_factory.mktemp("f") / ("x.jsonl.gz" if gz else "x.jsonl")
    p.write_bytes(gzip.compress(body)[: len(body)] if gz else body)
    _report_or_user_error(p)


def _paths(d: Any, prefix: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
    out = [prefix] if prefix else []
    if isinstance(d, dict):
        for k, v in d.items():
            out += _paths(v, (*prefix, k))
    elif isinstance(d, list):
        for i, v in enumerate(d):
            out += _paths(v, (*prefix, i))
    return out


@FAST
@given(st.lists(st.tuples(st.integers(0, len(TICKS) - 1), st.integers(0, 10**6), _json), min_size=1, max_size=6))
def test_any_json_value_in_any_tick_field(tmp_path_factory, edits):
    ticks = json.loads(json.dumps(TICKS))
    header = json.loads(HEADER)
    for ti, pick, value in edits:
        target = header if pick % 7 == 0 else ticks[ti]
        paths = _paths(target)
        path = paths[pick % len(paths)]
        obj = target
        for k in path[:-1]:
            obj = obj[k]
        obj[path[-1]] = value
    p = tmp_path_factory.mktemp("f") / "x.jsonl"
    p.write_text("\n".join([json.dumps(header), *map(json.dumps, ticks)]) + "\n")
    _report_or_user_error(p)


def _mutate_text(text: str, cuts: list[tuple[int, str]]) -> str:
    for pos, ins in cuts:
        i = pos % (len(text) + 1)
        text = text[:i] + ins + text[i + len(ins) :]
    return text


_numberish = st.sampled_from(["NaN", "+Inf", "-Inf", "1e999", "-5", "x", "{", "}", '"', "\n", " ", "1e308"])


@FAST
@given(st.lists(st.tuples(st.integers(0, 10**6), _numberish | st.text(max_size=5)), max_size=8))
def test_vllm_metrics_any_text(cuts):
    body = _mutate_text(VLLM_TEXT, cuts).encode("utf-8", "replace")
    real = vllm_mod.http_get
    vllm_mod.http_get = lambda url, timeout_s: (200, body)  # type: ignore[assignment]
    try:
        s = vllm_mod.VllmClient("http://127.0.0.1:9").read()
    finally:
        vllm_mod.http_get = real
    s = clean_engine_sample(s, Tally())
    _all_finite(s.to_json())
    for k in ("prompt_tokens_total", "generation_tokens_total", "requests_running", "requests_waiting"):
        v = getattr(s, k)
        assert v is None or (isinstance(v, int | float) and v >= 0)


_LLAMA_METRICS = (
    "# TYPE llamacpp:prompt_tokens_total counter\nllamacpp:prompt_tokens_total 120\n"
    "# TYPE llamacpp:tokens_predicted_total counter\nllamacpp:tokens_predicted_total 40\n"
    "# TYPE llamacpp:requests_processing gauge\nllamacpp:requests_processing 1\n"
    "# TYPE llamacpp:requests_deferred gauge\nllamacpp:requests_deferred 0\n"
)


@FAST
@given(
    st.lists(st.tuples(st.integers(0, 10**6), _numberish | st.text(max_size=5)), max_size=6),
    st.one_of(_json, st.lists(st.dictionaries(st.sampled_from(["id", "id_task", "is_processing", "n_ctx",
        "next_token", "n_decoded", "n_prompt_tokens", "params"]), _json, max_size=6), max_size=3)),
)  # fmt: skip
def test_llamacpp_metrics_and_slots_any_answer(metrics_cuts, slots):
    metrics = _mutate_text(_LLAMA_METRICS, metrics_cuts).encode("utf-8", "replace")
    slots_body = json.dumps(slots).encode()
    client = LlamaCppClient("http://127.0.0.1:9")

    def fake_get(path: str) -> tuple[int, bytes, dict[str, str]]:
        if path.startswith("/metrics"):
            return 200, metrics, {}
        if path.startswith("/slots"):
            return 200, slots_body, {}
        return 200, b"{}", {}

    client._get = fake_get  # type: ignore[method-assign]
    for _ in range(2):
        s = clean_engine_sample(client.read(), Tally())
        _all_finite(s.to_json())


_LOG = [
    "slot update_slots: id  0 | task 12 | new prompt, n_ctx_slot = 4096, n_keep = 0, n_prompt_tokens = 40",
    "prompt eval time =      12.34 ms /    40 tokens (    0.31 ms per token,  3241.49 tokens per second)",
    "       eval time =      50.00 ms /    10 tokens (    5.00 ms per token,   200.00 tokens per second)",
    "      total time =      62.34 ms /    50 tokens",
    "slot      release: id  0 | task 12 | stop processing: n_past = 50, truncated = 0",
]


@FAST
@given(st.lists(st.tuples(st.integers(0, len(_LOG) - 1), st.integers(0, 10**6), _numberish | st.text(max_size=6)),
                max_size=8), st.lists(st.text(max_size=80), max_size=3))  # fmt: skip
def test_llama_log_lines_any_text(edits, extra_lines):
    lines = list(_LOG)
    for li, pos, ins in edits:
        lines[li] = _mutate_text(lines[li], [(pos, ins)])
    out = parse_lines(lines + extra_lines)  # never raises
    # what the engine door (the poller) makes of them: finite numbers or null
    s = clean_engine_sample(EngineSample("llamacpp", True, extra={"requests": out}), Tally())
    _all_finite(s.to_json())
