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


def test_a_request_given_a_slot_after_the_last_idle_answer_is_not_idle(tmp_path):
    """H200 demo h200-prompt-cache, before this: the scrape answered idle at 3.7 s, the next request took the
    slot at once and the server's loop went into its prompt-cache save, so the next scrape hung until its
    timeout, and three ticks read the stale 'idle' while the client waited. The tick thread now asks the
    log (real LlamaCppClient, real log file): a slot given a request -> housekeeping; with the scrape
    overdue, a request the log shows started -> prefill; nothing open -> idle."""
    from pcie_tui.engines.llamacpp.client import LlamaCppClient

    log = tmp_path / "server.log"
    log.write_text("")

    class Scripted(LlamaCppClient):
        def read(self) -> EngineSample:
            done = self._poll_logs({})
            return _llama(0.0, 0, 0, server_state="ready", **({"requests": done} if done else {}))

    poller = EnginePoller(Scripted("http://127.0.0.1:1", log_path=str(log)), interval_s=0.1, rediscover=False)
    poller.poll_once()
    t = poller._latest[0]
    assert poller.sample_for_tick(t + 0.05, ()).phase == "idle"
    with log.open("a") as f:
        f.write("0.00.100.000 I slot get_availabl: id  0 | task -1 | selected slot by LRU, t_last = -1\n")
    s = poller.sample_for_tick(t + 0.1, ())
    assert s.phase == "housekeeping" and s.extra["phase_from"] == "log"
    with log.open("a") as f:
        f.write("0.00.300.000 I slot launch_slot_: id  0 | task 7 | processing task, is_child = 0\n")
    assert poller.sample_for_tick(t + 0.12, ()).phase == "idle"  # a fresh answer said idle: /slots wins
    assert poller.sample_for_tick(t + 0.3, ()).phase == "prefill"  # the scrape is overdue: the log wins
    with log.open("a") as f:
        p = "0.00.500.000 I slot print_timing: id  0 | task 7 |"
        f.write(
            f"{p} prompt eval time =     100.00 ms /   100 tokens (    1.00 ms per token,  1000.00 tokens per second)\n"
        )
        f.write(
            f"{p}        eval time =     100.00 ms /    11 tokens (   10.00 ms per token,   100.00 tokens per second)\n"
        )
        f.write(f"{p}       total time =     200.00 ms /   111 tokens\n")
        f.write("0.00.500.100 I slot      release: id  0 | task 7 | stop processing: n_tokens = 111, truncated = 0\n")
    assert poller.sample_for_tick(t + 0.4, ()).phase == "idle"
    poller.poll_once()  # the finished request, read by the tick thread, reaches the next reading once
    assert len(poller.sample_for_tick(t + 0.5, ()).extra.get("requests") or ()) == 1
