"""Real llama-server sessions on an H100 with an outside client's timings beside each (issue 20 and 24).

tests/fixtures/h100-runs/session3-20261207: scripts/device_session3.sh on the project's device (an H100 80GB
HBM3, PCIe Gen5 x16, driver 580.159.04), 2026-12-07: llama.cpp b11434 built with CUDA, a random-weight f16
16-layer model (6.5 GB), each case recorded by the real CLI (`pcie-tui record --pid ... --headless`) while
streaming clients sent random-token prompts; NAME.clients.json holds what each client measured (send, first
token, end: numbers only), NAME.server.log the server's own log, NAME.report.txt what `pcie-tui report` printed
there, device_log-*.txt the calls' output.

* np4c4: 4 slots, 4 concurrent clients, 8 prompts of 4,000 tokens, 13 of 16 layers in host memory (-ngl 4,
  pageable: mmap): the H200's np4c4 again, with the connection-based arrivals (its median read 19 % low there).
* np4c16 / np1c16: 16 concurrent clients on 4 slots and on 1 slot, 2,000-token prompts, fully on the GPU.
* seq-cache / seq-nocache: 6 sequential 9,600-token prompts fully on the GPU with the host prompt cache on
  (default) and off (--cache-ram 0), recorded again at a7ccdc5 (device_log-3.txt): the first recording, made
  before d75aa0a, labelled each slot's setup prefill (the phase is recorded live); this one calls it
  housekeeping and heads with it and its fix. Bundled as the demos h100-prompt-cache and -off.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from pcie_tui.engines.stats import quantile
from pcie_tui.recording.reader import read_recording
from pcie_tui.report.text import build_report

RUNS = Path(__file__).parent / "fixtures" / "h100-runs" / "session3-20261207"
CASES = ("np4c4", "np4c16", "np1c16", "seq-cache", "seq-nocache")


def _case(name: str) -> tuple[dict, list[dict], object]:
    rec = read_recording(RUNS / f"{name}.jsonl.gz")
    clients = json.loads((RUNS / f"{name}.clients.json").read_text())["requests"]
    rep, _ = build_report(rec)
    return rep, clients, rec


@pytest.mark.parametrize("name", CASES)
def test_ttft_is_what_the_clients_waited(name: str) -> None:
    """p50 and p95 of TTFT (queue + slot setup + batch wait + prefill) within 15 % of the clients' at
    concurrency 1, 4 and 16 with 1 and 4 slots; the server's prompt eval time alone is far from it."""
    rep, clients, _ = _case(name)
    eng = rep["engine"]
    waited = sorted(c["t_first"] - c["t_send"] for c in clients)
    assert eng["requests"] == len(clients)
    assert eng["ttft_s"]["p50"] == pytest.approx(quantile(waited, 0.5), rel=0.15)
    assert eng["ttft_s"]["p95"] == pytest.approx(quantile(waited, 0.95), rel=0.15)
    assert "TTFT as the client waits for" in eng["basis"]
    if name in ("np4c16", "np1c16"):  # queued behind 4 slots or 1: the prompt eval time is a small part
        assert eng["prefill_s"]["p50"] < 0.1 * eng["ttft_s"]["p50"]
        assert eng["queue_s"]["p50"] > 0.5 * eng["ttft_s"]["p50"]


@pytest.mark.parametrize("name", CASES)
def test_no_tick_is_idle_while_a_client_waits(name: str) -> None:
    _, clients, rec = _case(name)
    spans = [(c["t_send"], c["t_end"]) for c in clients]
    idle = [
        s.t
        for s in rec.samples
        if s.engine is not None and s.engine.phase == "idle" and any(a + 0.15 < s.t < b - 0.15 for a, b in spans)
    ]
    assert idle == []


def test_the_prompt_cache_ab_on_the_h100_prices_the_fix():
    """With the cache on, each request after the first waited 1.2-1.6 s for its slot's setup; the fix the
    tool prices (--cache-ram 0, TTFT about the prefill alone) is what the run with it measured."""
    on, on_clients, _ = _case("seq-cache")
    off, off_clients, _ = _case("seq-nocache")
    assert on["engine"]["setup_s"]["p50"] > 1.0 and off["engine"]["setup_s"]["p50"] < 0.01
    measured_off = quantile(sorted(c["t_first"] - c["t_send"] for c in off_clients), 0.5)
    predicted = on["engine"]["ttft_s"]["p50"] - on["engine"]["setup_s"]["p50"]
    assert predicted == pytest.approx(measured_off, rel=0.15)


def test_four_concurrent_pageable_prompts_are_a_transfer_bound_prefill():
    rep, _, _ = _case("np4c4")
    h = rep["headline"]
    assert h["phase"] == "prefill" and h["bound"] == "transfer"
    assert rep["engine"]["queue_s"]["p95"] > 1.0  # 8 requests on 4 slots: the second four waited


def test_the_slot_setup_is_housekeeping_live_and_heads_the_answer_with_its_fix():
    """The A/B recorded after d75aa0a: the server's own prompt-cache work between requests is housekeeping in
    the recording itself (its phase is what the live view said), and it is the headline, priced."""
    on, _, rec = _case("seq-cache")
    phases = [s.engine.phase for s in rec.samples if s.engine is not None]
    assert phases.count("housekeeping") >= 40  # 5 setups of 1.2-1.4 s at 10 Hz
    h = on["headline"]
    assert h["phase"] == "housekeeping" and "--cache-ram 0" in h["text"] and "about 0.59 s" in h["text"]
