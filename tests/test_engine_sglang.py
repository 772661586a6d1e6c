"""SGLang, written from its documentation: classification of real-looking command lines, the layout they
give, probe recognition, and /metrics -> EngineSample against a local fake server serving documented bodies
(tests/fixtures/engines/README.md says where each body comes from). No SGLang server runs here."""

from __future__ import annotations

from pathlib import Path

import pytest
from engines.stub_http import serve

from pcie_tui.engines import FindingFacts, sglang

FIX = Path(__file__).parent / "fixtures" / "engines"


@pytest.fixture
def fake():
    """A fake SGLang on 127.0.0.1 at a free port; set ``routes[path] = (status, body)``."""
    routes: dict[str, tuple[int, bytes]] = {}
    with serve(routes, missing=b'{"detail":"Not Found"}') as url:
        yield url, routes


@pytest.mark.parametrize(
    ("argv", "name", "role"),
    [
        (
            ["/opt/venv/bin/python3", "-m", "sglang.launch_server", "--model-path", "m", "--port", "30000"],
            "python3",
            "root",
        ),
        (["sglang", "serve", "--model-path", "meta-llama/Llama-3.1-8B-Instruct"], "sglang", "root"),
        (["/usr/bin/python", "/src/sglang/python/sglang/launch_server.py", "--model", "m"], "python", "root"),
        (["sglang::scheduler_DP1_TP0"], "sglang::schedul", "child"),
        ([], "sglang::detokenizer", "child"),
        (["python3", "-m", "vllm.entrypoints.openai.api_server"], "python3", None),
        (["python3", "-m", "sglang_router.launch_router"], "python3", None),
        (["llama-server", "-m", "x.gguf"], "llama-server", None),
    ],
)
def test_classify(argv, name, role):
    assert sglang.ENGINE.classify(argv, name) == role


def test_layout_from_a_documented_launch_command():
    argv = ["python3", "-m", "sglang.launch_server", "--model-path", "openai/gpt-oss-120b", "--host", "0.0.0.0",
            "--port", "30001", "--tp-size=2", "--data-parallel-size=4", "--mem-fraction-static", "0.85",
            "--enable-metrics", "--cpu-offload-gb", "16", "--enable-hierarchical-cache", "--hicache-ratio", "2.5"]  # fmt: skip
    lay = sglang.ENGINE.parse_layout(argv, {})
    assert (lay["tensor_parallel_size"], lay["data_parallel_size"], lay["pipeline_parallel_size"]) == (2, 4, 1)
    assert lay["gpus_expected"] == 8 and lay["explicit"] == ["data_parallel_size", "tensor_parallel_size"]
    assert lay["port"] == 30001 and lay["host"] == "0.0.0.0" and lay["model"] == "openai/gpt-oss-120b"
    assert lay["enable_metrics"] and lay["enable_hierarchical_cache"] and not lay["enable_dp_attention"]
    assert (lay["cpu_offload_gb"], lay["hicache_ratio"], lay["mem_fraction_static"]) == (16, 2.5, 0.85)
    # The docs' own short spellings, and DP attention sharing the TP GPUs.
    short = sglang.ENGINE.parse_layout(["sglang", "serve", "--tp", "4", "--dp", "2", "--enable-dp-attention"], {})
    assert (short["tensor_parallel_size"], short["data_parallel_size"], short["gpus_expected"]) == (4, 2, 4)
    bare = sglang.ENGINE.parse_layout(["sglang", "serve", "--model-path", "m"], {})
    assert bare["port"] is None and bare["cpu_offload_gb"] is None and bare["gpus_expected"] == 1


def test_recognise_by_metrics_or_model_info():
    e = sglang.ENGINE
    assert e.recognise("/metrics", 200, (FIX / "sglang-metrics-docs.txt").read_bytes())
    assert not e.recognise("/metrics", 200, (Path(__file__).parent / "fixtures" / "vllm-0.32-metrics.txt").read_bytes())
    assert e.recognise("/get_model_info", 200, (FIX / "sglang-get_model_info.json").read_bytes())
    assert not e.recognise("/get_model_info", 404, b'{"detail":"Not Found"}')
    assert not e.recognise("/get_model_info", 200, b'{"model_path": "x"}')
    assert e.default_port == 30000 and e.tested is False and e.docs


def test_scrape_maps_documented_metrics_and_leaves_the_rest_none(fake):
    url, routes = fake
    routes["/metrics"] = (200, (FIX / "sglang-metrics-docs.txt").read_bytes())
    routes["/get_model_info"] = (200, (FIX / "sglang-get_model_info.json").read_bytes())
    c = sglang.ENGINE.client(url, None, {"cmdline": None, "layout": None}, None)
    s = c.read()
    assert s.up and s.kind == "sglang" and s.error is None
    assert (s.prompt_tokens_total, s.generation_tokens_total) == (8.128902e06, 7.557572e06)
    assert (s.requests_running, s.requests_waiting) == (162.0, 2826.0)
    assert s.extra["kv_cache_util"] == 0.28 and s.extra["kv_tokens_used"] == 123859.0
    h = s.extra["hist"]
    assert h["ttft_s"]["le"] == [0.04, 1.0, 10.0, 30.0] and h["ttft_s"]["count"] == 11008.0
    assert h["itl_s"]["cum"][-1] == 7.357747e06  # the older name, time_per_output_token_seconds
    assert "queue_s" not in h  # not in this body
    assert "requests_finished_total" not in s.extra  # sglang:num_requests_total absent: not invented
    d = c.describe()
    assert d["kind"] == "sglang" and d["model"] == "qwen/qwen2.5-7b-instruct"
    assert d["version"] is None  # /get_server_info not served: unknown, not guessed
    assert d["tested"] is False


def test_scheduler_gauges_once_per_dp_rank(fake):
    url, routes = fake
    routes["/metrics"] = (200, (FIX / "sglang-metrics-dp.txt").read_bytes())
    s = sglang.ENGINE.client(url, None, {}, None).read()
    # tp_rank 0 of each DP rank, summed (the tp_rank 1 series are x100 and must not count).
    assert (s.requests_running, s.requests_waiting) == (12.0, 4.0)
    assert s.extra["kv_cache_util"] == pytest.approx(0.375) and s.extra["dp_ranks"] == 2
    assert s.extra["requests_finished_total"] == 120.0 and s.extra["cached_tokens_total"] == 8000.0
    assert s.extra["hist"]["itl_s"]["count"] == 1200.0 and s.extra["hist"]["queue_s"]["le"][0] == 0.0


def test_metrics_off_or_down_is_one_clear_error(fake):
    url, routes = fake
    s = sglang.ENGINE.client(url, None, {}, None).read()
    assert not s.up and "--enable-metrics" in s.error and s.prompt_tokens_total is None
    routes["/metrics"] = (200, b"# HELP foo_total x\n# TYPE foo_total counter\nfoo_total 1\n")
    s = sglang.ENGINE.client(url, None, {}, None).read()
    assert not s.up and "no sglang: metrics" in s.error
    down = sglang.ENGINE.client("http://127.0.0.1:9", None, {}, None).read()
    assert not down.up and down.error


def test_facts_and_advice_name_the_flags():
    e = sglang.ENGINE
    argv = ["sglang", "serve", "--model-path", "m", "--cpu-offload-gb", "20", "--tp-size", "2"]
    fx = e.facts({"kind": "sglang", "cmdline": argv, "layout": e.parse_layout(argv, {})})
    assert fx.host_weights == "20 GB of weights in host memory (--cpu-offload-gb 20)" and fx.tensor_parallel == 2
    adv = e.advise(fx, FindingFacts(bound="link"))
    assert len(adv) == 1 and "--cpu-offload-gb" in adv[0].fix and any("not tested" in x for x in adv[0].evidence)
    assert e.advise(fx, FindingFacts(bound="compute")) == []
    hi = e.facts({"kind": "sglang", "layout": e.parse_layout(["sglang", "serve", "--enable-hierarchical-cache"], {})})
    assert hi.host_weights is None and "--hicache-ratio 2.0" in hi.kv_on_host
    assert e.facts({"kind": "sglang"}).host_weights is None


def test_doctor_notes_a_running_untested_engine():
    """A process that looks like `python -m sglang.launch_server` makes doctor say SGLang is untested."""
    import subprocess
    import sys

    from pcie_tui.doctor.untested import add_untested_engine_items

    proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)", "-m", "sglang.launch_server"])
    try:
        report: dict = {"items": [], "summary": {"pass": 0, "warn": 0, "fail": 0}}
        add_untested_engine_items(report)
    finally:
        proc.kill()
        proc.wait()
    mine = [it for it in report["items"] if it["data"]["pid"] == proc.pid]
    assert len(mine) == 1 and mine[0]["data"]["kind"] == "sglang" and mine[0]["status"] == "pass"
    assert "not tested against a real server" in mine[0]["title"] and report["summary"]["pass"] >= 1


def test_record_and_report_through_the_cli(fake, tmp_path):
    """`pcie-tui record --url` attaches by probing (no GPU needed here) and `report` reads the file."""
    import gzip
    import json
    import subprocess
    import sys

    url, routes = fake
    routes["/metrics"] = (200, (FIX / "sglang-metrics-dp.txt").read_bytes())
    routes["/get_model_info"] = (200, (FIX / "sglang-get_model_info.json").read_bytes())
    out = tmp_path / "sglang.jsonl.gz"
    cmd = [sys.executable, "-m", "pcie_tui", "record", "--url", url, "--headless", "--duration", "2", "--out", str(out)]
    rec = subprocess.run(cmd, capture_output=True, text=True, timeout=60)
    assert rec.returncode == 0 and "attached to SGLang" in rec.stderr and "Traceback" not in rec.stderr, rec.stderr
    with gzip.open(out, "rt") as f:
        lines = f.read().splitlines()
    head = json.loads(lines[0])["engine"]
    assert head["kind"] == "sglang" and head["model"] == "qwen/qwen2.5-7b-instruct" and head["tested"] is False
    ticks = [e for x in lines[1:] if (e := json.loads(x).get("engine")) and e.get("up")]
    assert ticks and all(e["requests_running"] == 12.0 and e["prompt_tokens_total"] == 52000.0 for e in ticks)
    rep = subprocess.run(
        [sys.executable, "-m", "pcie_tui", "report", "--json", str(out)], capture_output=True, text=True
    )
    assert rep.returncode == 0, rep.stderr
    eng = json.loads(rep.stdout)["engine"]
    assert eng["kind"] == "sglang" and eng["prompt_tokens"] == 0.0  # the counters did not move: 0 tokens, measured


# ---- issue 20: live phase and token rates from sglang:realtime_tokens_total, HiCache, current endpoints ----
# The realtime-t0/t1 bodies are written from SGLang's source (observability/metrics_collector.py at 44cedc2b),
# not captured: half a second of a long decode (realtime decode +640 tokens) during which no request ended,
# so the tokenizer's counters stand still.


def _scrape(fake, name: str):
    url, routes = fake
    routes["/metrics"] = (200, (FIX / name).read_bytes())
    return sglang.ENGINE.client(url, None, {}, None).read()


def test_realtime_counters_give_a_long_decode_its_phase(fake):
    import dataclasses

    from pcie_tui.engines.phases import counter_phase

    s0, s1 = _scrape(fake, "sglang-metrics-realtime-t0.txt"), _scrape(fake, "sglang-metrics-realtime-t1.txt")
    # One series per DP rank (tp_rank 0; the x100 tp_rank 1 series would show), prefill = computed + cached.
    assert (s1.extra["live_prompt_tokens_total"], s1.extra["live_generation_tokens_total"]) == (4096.0, 1640.0)
    assert s1.extra["live_prompt_cached_total"] == 256.0
    assert (s0.prompt_tokens_total, s0.generation_tokens_total) == (s1.prompt_tokens_total, s1.generation_tokens_total)
    assert counter_phase(s0, s1) == "decode"
    # Without the realtime counters (older SGLang) the same scrapes read as a prefill in flight.
    old = [dataclasses.replace(s, extra={}) for s in (s0, s1)]
    assert counter_phase(old[0], old[1]) == "prefill"
    # A restart (realtime counters drop) is a reset, not a negative rate.
    from pcie_tui.engines.phases import PhaseTracker

    tr = PhaseTracker()
    tr.update(s1)
    assert tr.would_reset(s0)


def test_live_token_rates_name_their_source_and_win_over_the_request_end_counters():
    from pcie_tui.analyze.engine import EngineStats
    from pcie_tui.core.model import EngineSample, Sample

    def tick(t: float, live_gen: float, gen_total: float) -> Sample:
        extra = {"live_prompt_tokens_total": 100.0, "live_generation_tokens_total": live_gen}
        e = EngineSample(
            kind="sglang", up=True, prompt_tokens_total=100.0, generation_tokens_total=gen_total, extra=extra
        )
        return Sample(t=t, gpus=(), engine=e)

    st = EngineStats(10.0)
    # 40 tok/s decoded live; 1000 tokens of requests that ran mostly before the window end at t=2.
    for i in range(5):
        st.feed(tick(float(i), 40.0 * i, 0.0 if i < 2 else 1000.0))
    snap = st.snapshot()
    assert snap["generation_tokens_per_s"] == pytest.approx(40.0)
    assert 'generation: sglang:realtime_tokens_total{mode="decode"}' in snap["rate_source"]
    got = sglang.ENGINE.live_tokens([(0.0, tick(0.0, 0.0, 0).engine), (2.0, tick(2.0, 80.0, 0).engine)], "generation")
    assert got == (80.0, 2.0, 'sglang:realtime_tokens_total{mode="decode"}')
    # An older SGLang: no realtime counter, the request-end counters and their source.
    st = EngineStats(10.0)
    for i in range(3):
        e = EngineSample(kind="sglang", up=True, generation_tokens_total=10.0 * i)
        st.feed(Sample(t=float(i), gpus=(), engine=e))
    assert st.snapshot()["rate_source"] == "generation: counter"


def test_hicache_counters_per_dp_rank_in_extra(fake):
    s = _scrape(fake, "sglang-metrics-realtime-t1.txt")
    h = s.extra["hicache"]
    assert h["load_back_tokens_total"] == 2048.0  # kv + swa pools of tp_rank 0
    assert (h["load_back_bytes_total"], h["backup_bytes_total"]) == (268435456.0, 536870912.0)
    assert h["evicted_tokens_total"] == 4096.0 and h["load_back_seconds_total"] == 0.5
    assert "hicache" not in _scrape(fake, "sglang-metrics-dp.txt").extra  # not exported: absent, not 0


def test_describe_reads_the_current_endpoints_first_and_falls_back(fake):
    url, routes = fake
    routes["/metrics"] = (200, (FIX / "sglang-metrics-realtime-t0.txt").read_bytes())
    routes["/server_info"] = (200, b'{"version": "0.5.6", "tp_size": 1}')
    routes["/get_server_info"] = (200, b'{"version": "old"}')
    routes["/model_info"] = (200, b'{"model_path": "Qwen/Qwen3-8B", "is_generation": true}')
    d = sglang.ENGINE.client(url, None, {}, None).describe()
    assert (d["version"], d["version_from"], d["model"]) == ("0.5.6", "/server_info", "Qwen/Qwen3-8B")
    assert d["realtime_tokens"] is True and d["hicache"]["load_back_bytes_total"] == 268435456.0
    del routes["/server_info"], routes["/model_info"]
    routes["/get_model_info"] = (200, (FIX / "sglang-get_model_info.json").read_bytes())
    routes["/metrics"] = (200, (FIX / "sglang-metrics-dp.txt").read_bytes())
    d = sglang.ENGINE.client(url, None, {}, None).describe()
    assert (d["version"], d["version_from"], d["model"]) == ("old", "/get_server_info", "qwen/qwen2.5-7b-instruct")
    assert d["realtime_tokens"] is False and d["hicache"] is None


def test_hicache_cause_cites_what_moved_with_its_source():
    e = sglang.ENGINE
    moved = {"load_back_bytes_total": 268435456.0, "backup_bytes_total": 536870912.0, "evicted_tokens_total": 4096.0}
    fx = e.facts({"kind": "sglang", "cmdline": ["sglang", "serve"], "hicache": moved, "realtime_tokens": True})
    assert fx.fact("hicache").value is True and "sglang:load_back_*" in fx.fact("hicache").source
    assert fx.fact("token_source").value == "live"
    (adv,) = e.advise(fx, FindingFacts(bound="link"))
    assert "host->GPU 268 MB (sglang:load_back_bytes_total)" in adv.cause
    assert "GPU->host 537 MB (sglang:hicache_backup_bytes_total)" in adv.cause
    assert "read when pcie-tui attached" in adv.cause and "/metrics" in adv.evidence[0]
    # Tokens only (the source read exports no bytes): said so, never turned into bytes.
    fx = e.facts({"kind": "sglang", "layout": e.parse_layout(["sglang", "serve", "--enable-hierarchical-cache"], {}),
                  "hicache": {"load_back_tokens_total": 2048.0}})  # fmt: skip
    (adv,) = e.advise(fx, FindingFacts(bound="transfer"))
    assert "2048 tokens (sglang:load_back_tokens_total; bytes not exported)" in adv.cause
    assert adv.evidence[0] == "True (flag --enable-hierarchical-cache)"
    # Flag on, counters never read: the movement is unknown, and the cause stays on the flag.
    fx = e.facts({"kind": "sglang", "layout": e.parse_layout(["sglang", "serve", "--enable-hierarchical-cache"], {})})
    assert fx.fact("hicache_moved").value is None and fx.fact("token_source").value is None
    (adv,) = e.advise(fx, FindingFacts(bound="link"))
    assert adv.cause.startswith("HiCache: a host-memory KV pool") and "unknown (unknown:" in adv.cause
    off = e.facts({"kind": "sglang", "cmdline": ["sglang", "serve"]})
    assert off.fact("hicache").value is False and off.kv_on_host is None


# ---- captured from real servers (tests/fixtures/engines/README.md, "Captured from real servers") ----


def test_real_0_5_1_scrape_reads_its_scheduler_gauges(fake):
    """`curl http://localhost:30000/metrics` from an SGLang 0.5.1 server (sgl-project/sglang#13485), cut to
    the four complete gauge families. Hand reading: one series each, labels engine_type, model_name, pp_rank,
    tp_rank (no dp_rank: DP rank 0), so running = 1.0, used tokens = 1.0, token_usage = 0.0, gen_throughput =
    0.8371284457403783; no num_queue_reqs and no tokenizer counter or histogram in the cut -> None / absent."""
    url, routes = fake
    routes["/metrics"] = (200, (FIX / "sglang-metrics-real-0.5.1.txt").read_bytes())
    c = sglang.ENGINE.client(url, None, {}, None)
    s = c.read()
    assert s.up and s.error is None
    assert (s.requests_running, s.requests_waiting) == (1.0, None)
    assert (s.prompt_tokens_total, s.generation_tokens_total) == (None, None)
    assert s.extra["kv_cache_util"] == 0.0 and s.extra["kv_tokens_used"] == 1.0
    assert s.extra["gen_throughput_tps"] == 0.8371284457403783 and s.extra["dp_ranks"] == 1
    assert s.extra["hist"] == {} and "live_generation_tokens_total" not in s.extra and "hicache" not in s.extra
    d = c.describe()
    assert d["realtime_tokens"] is False and d["hicache"] is None


def test_real_pr1853_scrape_reads_the_prompt_counter_under_the_old_name_label(fake):
    """The first /metrics SGLang served (sgl-project/sglang#1853, a maintainer's local run, 2024-11-03): label
    `name` instead of `model_name`, cut to the five complete families. Hand reading: prompt_tokens_total =
    230794.0 (one series); the four gauges there (max_total_num_tokens, max_prefill_tokens,
    max_running_requests, context_len) are none of ours, so running/waiting None and no DP rank counted."""
    url, routes = fake
    routes["/metrics"] = (200, (FIX / "sglang-metrics-real-pr1853-2024-11.txt").read_bytes())
    s = sglang.ENGINE.client(url, None, {}, None).read()
    assert s.up and s.prompt_tokens_total == 230794.0 and s.generation_tokens_total is None
    assert (s.requests_running, s.requests_waiting) == (None, None)
    assert "dp_ranks" not in s.extra and "kv_cache_util" not in s.extra
