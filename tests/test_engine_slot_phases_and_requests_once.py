"""Engine poller bookkeeping: llama-server slot phases and finished requests handed out once."""

from __future__ import annotations

from typing import Any

from pcie_tui.core.model import EngineSample
from pcie_tui.engines.phases import counter_phase
from pcie_tui.engines.poller import EnginePoller


def _llama(gen_total: float, sp: int, sd: int, **extra: Any) -> EngineSample:
    return EngineSample(
        "llamacpp",
        True,
        None,
        8000.0,
        gen_total,
        float(sp + sd),
        0.0,
        extra={"slots_prefill": sp, "slots_decode": sd, **extra},
    )


def test_llama_decode_is_decode_although_its_generation_counter_has_not_moved():
    # llama-server adds generated tokens to its counter only when a request ends.
    prev, cur = _llama(100.0, 0, 1), _llama(100.0, 0, 1)
    assert counter_phase(prev, cur) == "decode"
    assert counter_phase(None, _llama(100.0, 1, 0)) == "prefill"
    assert counter_phase(prev, _llama(100.0, 1, 1)) == "mixed"
    assert counter_phase(prev, _llama(100.0, 0, 0)) == "idle"


def test_vllm_still_uses_counters():
    a = EngineSample("vllm", True, None, 100.0, 50.0, 1.0, 0.0)
    b = EngineSample("vllm", True, None, 100.0, 60.0, 1.0, 0.0)
    assert counter_phase(a, b) == "decode"


class _ScriptedClient:
    """Answers a fixed list of scrapes; the poller under test is real."""

    kind = "llamacpp"
    pid = None
    url = "http://127.0.0.1:1"

    def __init__(self, answers: list[EngineSample]) -> None:
        self.answers = answers

    def describe(self) -> dict[str, Any]:
        return {"kind": self.kind, "url": self.url, "pid": None, "gpus": None}

    def read(self) -> EngineSample:
        return self.answers.pop(0)


def test_finished_requests_reach_exactly_one_tick():
    r1, r2, r3 = ({"prompt_n": n, "prompt_ms": 1.0, "predicted_n": 1, "predicted_ms": 1.0, "seq": n} for n in (1, 2, 3))
    answers = [
        _llama(1.0, 1, 0, requests=[r1]),
        _llama(2.0, 1, 0, requests=[r2]),
        _llama(3.0, 0, 0, requests=[r3]),
        _llama(3.0, 0, 0),
    ]
    poller = EnginePoller(_ScriptedClient(answers), rediscover=False)
    poller.poll_once()
    poller.poll_once()  # two scrapes before one tick: both requests belong to it
    t1 = poller.sample_for_tick(1e9, ())
    t2 = poller.sample_for_tick(1e9 + 0.1, ())  # a tick with no new scrape: nothing repeated
    poller.poll_once()
    t3 = poller.sample_for_tick(1e9 + 0.2, ())
    poller.poll_once()
    t4 = poller.sample_for_tick(1e9 + 0.3, ())
    got = [[r["seq"] for r in (t.extra.get("requests") or [])] for t in (t1, t2, t3, t4)]
    assert got == [[1, 2], [], [3], []]
