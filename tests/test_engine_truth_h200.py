"""Real llama-server sessions on an H200 with an outside client's timings beside each (issue 20 and 24).

tests/fixtures/h200-runs/engine-truth-20261206: scripts/device_concurrency.sh on the project's device (an H200,
PCIe Gen5 x16): llama.cpp b11434 built with CUDA, a random-weight f16 16-layer model (6.5 GB), each case recorded
by the real CLI (`pcie-tui record --pid ... --headless`) while streaming clients sent random-token prompts;
NAME.clients.json holds what each client measured (send, first token, end: numbers only), NAME.server.log the
server's own log, NAME.report.txt what `pcie-tui report` printed there, device_log.txt the call's output.

* seq-cache / seq-nocache: 6 sequential 9,600-token prompts fully on the GPU, the host prompt cache on (the
  default, 8192 MiB) and off (--cache-ram 0): the A/B of issue 24, bundled as the demos h200-prompt-cache
  and h200-prompt-cache-off (pcie_tui/data, with their truth).
* np4c4: 4 slots, 4 concurrent clients, 13 of 16 layers in host memory (pageable: mmap).
* mlock (-lm mlock), noop (--no-op-offload), fit (-ngl auto with a --fit-target margin that leaves the model
  too little VRAM, as a model larger than the card would).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from pcie_tui.engines.stats import quantile
from pcie_tui.recording import demos
from pcie_tui.recording.reader import read_recording
from pcie_tui.report.text import build_report

RUNS = Path(__file__).parent / "fixtures" / "h200-runs" / "engine-truth-20261206"


DEMOS = {"seq-cache": "h200-prompt-cache", "seq-nocache": "h200-prompt-cache-off"}


def _case(name: str) -> tuple[dict, list[float]]:
    if name in DEMOS:
        rec = read_recording(demos.resolve(DEMOS[name]))
        truth = json.loads((demos.data_dir() / f"{DEMOS[name]}.truth.json").read_text())["truth"]
    else:
        rec = read_recording(RUNS / f"{name}.jsonl.gz")
        truth = json.loads((RUNS / f"{name}.clients.json").read_text())["requests"]
    rep, _ = build_report(rec)
    return rep, sorted(r["t_first"] - r["t_send"] for r in truth)


@pytest.mark.parametrize("name", ["seq-cache", "seq-nocache", "mlock", "noop", "fit"])
def test_ttft_is_what_the_client_waited(name):
    """p50 within 15 % everywhere; p95 where there are 6 requests (with 2 or 3 it is the slowest one, and
    in mlock that one's client saw its first token two decode steps after the server made it: the random
    byte vocabulary made it a partial UTF-8 character, which the server holds back until it is whole)."""
    rep, client = _case(name)
    eng = rep["engine"]
    assert eng["ttft_s"]["p50"] == pytest.approx(quantile(client, 0.5), rel=0.15)
    if len(client) >= 6:
        assert eng["ttft_s"]["p95"] == pytest.approx(quantile(client, 0.95), rel=0.15)
    assert "TTFT as the client waits for" in eng["basis"]


def test_four_concurrent_long_prompts_tail_as_the_clients_saw_it():
    """Recorded before the clock counted a wait behind the server's loop inside a batch (three of the
    first four requests waited 2.9 s behind the first one's prompt batch with free slots, read as 0):
    the median reads 19 % low there, the tail, made of the requests that waited for slots, within 15 %.
    The server's own prompt eval time alone says far less than either."""
    rep, client = _case("np4c4")
    eng = rep["engine"]
    assert eng["ttft_s"]["p95"] == pytest.approx(quantile(client, 0.95), rel=0.15)
    assert 0.75 * quantile(client, 0.5) <= eng["ttft_s"]["p50"] <= quantile(client, 0.5)
    assert eng["queue_s"]["p95"] > 1.0  # requests waited for a slot, and the tool saw it
    assert rep["headline"]["phase"] == "prefill" and rep["headline"]["bound"] == "transfer"


def test_the_prompt_cache_ab_names_the_housekeeping_and_its_price():
    on, client_on = _case("seq-cache")
    off, client_off = _case("seq-nocache")
    # With the cache on, 1.8 s of each request's ~2.4 s went to the server's own work before it started;
    # the tool calls that stretch housekeeping (never idle) and makes it the headline, with the fix.
    assert on["engine"]["setup_s"]["p50"] > 1.5 and off["engine"]["setup_s"]["p50"] < 0.01
    assert on["engine"]["phases"]["housekeeping"]["time_s"] > 5.0 and "housekeeping" not in off["engine"]["phases"]
    h = on["headline"]
    assert h["phase"] == "housekeeping" and "TTFT p50 2.30 s -> about 0.53 s" in h["text"]
    finding = next(f for f in on["attribution"]["findings"]["0"] if f["phase"] == "housekeeping")
    (advice,) = finding["advice"]
    assert "host prompt cache, 8192 MiB, default: --cache-ram 8192" in advice["cause"]
    assert advice["fix"].startswith("--cache-ram 0 turns the host prompt cache off")
    # The B side measured what the fix predicts: TTFT without the setup.
    predicted = on["engine"]["ttft_s"]["p50"] - on["engine"]["setup_s"]["p50"]
    assert off["engine"]["ttft_s"]["p50"] == pytest.approx(predicted, rel=0.15)
    assert quantile(client_off, 0.5) < 0.3 * quantile(client_on, 0.5)


def test_runtime_facts_on_the_gpu():
    mlock, _ = _case("mlock")
    fx = mlock["attribution"]["engine_facts"]
    assert fx["host_pinned"] is True and "(flag -lm mlock)" in fx["host_memory_why"]
    noop, _ = _case("noop")
    assert noop["headline"]["phase"] == "prefill" and noop["headline"]["bound"] == "host"
    finding = next(f for f in noop["attribution"]["findings"]["0"] if f["phase"] == "prefill")
    assert finding["advice"][0]["cause"].startswith("op offload off (flag --no-op-offload)")
    fit, _ = _case("fit")
    layers = next(f for f in fit["attribution"]["engine_facts"]["runtime"] if f["name"] == "gpu_layers")
    # b11434 prints no "offloaded N/M layers" at its default verbosity: the placement is unknown, not assumed;
    # the measurement still shows weights streamed from pageable host memory in prefill.
    assert layers["value"] is None and layers["source"].startswith("unknown")
    assert fit["headline"]["phase"] == "prefill" and fit["headline"]["bound"] == "transfer"


def test_the_exporter_observes_each_requests_wait():
    """The demo's six requests: one observation each of TTFT (the client's), queue and slot setup."""
    from pcie_tui.export.prometheus import ExportState

    rec = read_recording(demos.resolve("h200-prompt-cache"))
    state = ExportState()
    state.start(rec.header, "replay", "h200-prompt-cache", rec.events)
    for s in rec.samples:
        state.feed(s)
    for name in ("ttft", "queue", "setup"):
        assert state.per_request[name]["count"] == 6, name
    setup = state.per_request["setup"]
    # ~1.8 s of each later request's wait was the prompt cache (the first one's slot had nothing to save).
    assert 8.0 < setup["sum"] < 10.5
