"""The ``?`` page names a figure's source only where the session has the figure: a recording from before
heat capture (the bundled demos) lists no temperature, clock, clock-event, power-limit, fan or link-health
source but says plainly that they are not in it; a recording with them lists each. A replay's figures are
those of its whole recording (a reading late in it counts while paused early); live, those read so far."""

from __future__ import annotations

import dataclasses
import re
from pathlib import Path

import pytest
from test_heat_and_link_health import header as heat_header
from test_heat_and_link_health import session as heat_session

from pcie_tui.core.model import GpuSample, Sample
from pcie_tui.recording import demos
from pcie_tui.recording.reader import Recording, read_recording
from pcie_tui.recording.replay import ReplaySource
from pcie_tui.tui.headless import frame_at, paused_app, run, screen_text, wait_until
from pcie_tui.tui.screens import SourcesScreen
from pcie_tui.tui.seen import FiguresSeen
from pcie_tui.tui.sources import figure_sources
from pcie_tui.tui.state import ViewModel

# The NVML calls and sysfs files behind the heat and link-health figures (pcie_tui/core/metrics.py).
HEAT_CALLS = (
    "nvmlDeviceGetTemperature",
    "nvmlDeviceGetClockInfo",
    "nvmlDeviceGetCurrentClocksEventReasons",
    "nvmlDeviceGetEnforcedPowerLimit",
    "nvmlDeviceGetFanSpeed",
    "nvmlDeviceGetPcieReplayCounter",
    "aer_dev_correctable",
)
HEAT_FIGURES = "temperature, SM / memory clock, clock events, power limit, fan, PCIe replays, AER errors"


def heat_recording(first_heat_tick: int = 0) -> Recording:
    """The generated heat session (tests/test_heat_and_link_health.py) on a GPM GPU; with
    ``first_heat_tick``, the heat and link-health readings only from that tick on."""
    h = heat_header()
    h = dataclasses.replace(h, gpus=(dataclasses.replace(h.gpus[0], metrics_source="gpm"),))
    samples = heat_session()
    gone = {f: None for f in ("temp_C", "sm_clock_MHz", "mem_clock_MHz", "clock_events", "power_limit_W")}
    gone["pcie_replays"] = None
    samples[:first_heat_tick] = [
        dataclasses.replace(s, gpus=(dataclasses.replace(s.gpus[0], **gone),)) for s in samples[:first_heat_tick]
    ]
    return Recording(Path("heat.jsonl"), h, samples)


def page_text(rec: Recording, pos: int) -> str:
    """The whole ``?`` page (scrolled through) of ``rec`` paused at ``pos``."""
    app = paused_app(rec, pos)
    out: list[str] = []

    async def go() -> None:
        async with app.run_test(size=(120, 40)) as pilot:
            await wait_until(pilot, lambda: frame_at(app, pos), 20)
            await pilot.press("question_mark")
            await wait_until(pilot, lambda: isinstance(app.screen, SourcesScreen))
            await pilot.pause()
            body = app.screen.query_one("#sources-body")
            out.append(screen_text(app))
            while body.scroll_y < body.max_scroll_y:
                body.scroll_relative(y=20, animate=False)
                await pilot.pause()
                out.append(screen_text(app))

    run(go())
    return " ".join(" ".join(ln.strip("│ ") for ln in page.splitlines()) for page in out)


def flat(text: str) -> str:
    return " ".join(text.split())


@pytest.mark.parametrize("demo", ["h200-pinned", "h200-prompt-cache"])
def test_a_recording_without_heat_names_none_of_their_sources(demo):
    rec = read_recording(demos.resolve(demo), warn=False)
    assert not any(g.temp_C is not None or g.sm_clock_MHz is not None for s in rec.samples for g in s.gpus)
    text = flat(page_text(rec, len(rec.samples) // 2))
    for call in HEAT_CALLS:
        assert call not in text, call
    assert f"not recorded {HEAT_FIGURES}: not in this recording" in text, text
    # what the recording has keeps its source
    for call in ("NVML_GPM_METRIC_PCIE_TX_PER_SEC", "nvmlDeviceGetPowerUsage", "nvmlDeviceGetMemoryInfo"):
        assert call in text, call


def test_a_generated_recording_with_heat_lists_each_source():
    text = flat(page_text(heat_recording(), 700))
    for call in HEAT_CALLS[:4] + ("nvmlDeviceGetPcieReplayCounter",):
        assert call in text, call
    # the session has no fan reading and no AER counts: those two alone are named as not in it
    assert "nvmlDeviceGetFanSpeed" not in text and "aer_dev_correctable" not in text
    assert "not recorded fan, AER errors: not in this recording" in text, text


def test_a_replay_counts_a_reading_late_in_its_recording_while_paused_early():
    rec = heat_recording(first_heat_tick=500)
    vm = ViewModel(rec.header)
    src = ReplaySource(rec)
    src.seek_to_index(20)
    src.set_paused(True)
    vm.sync_replay(src, None)
    vm.replay_view(src)
    f = vm.frame()
    assert f.ticks == 20 and f.figures_whole
    assert f.figures is not None and {"temp_C", "clock_events", "pcie_replays"} <= f.figures[0]
    assert "fan_util" not in f.figures[0]
    figures = [r.figure for r in figure_sources(rec.header, rec.header.gpus[0], f.figures[0], f.figures_whole)]
    assert "temperature" in figures and "not recorded" in figures


def test_live_the_page_says_no_reading_so_far_until_one_arrives():
    rec = heat_recording(first_heat_tick=100)
    vm = ViewModel(rec.header)
    for s in rec.samples[:50]:
        vm.feed(s)
    f = vm.frame()
    assert f.figures is not None and not f.figures_whole
    rows = {r.figure: r for r in figure_sources(rec.header, rec.header.gpus[0], f.figures[0], f.figures_whole)}
    assert "temperature" not in rows and "not recorded" not in rows
    assert rows["no reading yet"].source.startswith("temperature, SM / memory clock, clock events, power limit")
    assert "so far" in rows["no reading yet"].source
    for s in rec.samples[50:150]:
        vm.feed(s)
    f = vm.frame()
    rows = {r.figure: r for r in figure_sources(rec.header, rec.header.gpus[0], f.figures[0], f.figures_whole)}
    assert "nvmlDeviceGetTemperature" in rows["temperature"].source
    assert rows["no reading yet"].source.startswith("fan, AER errors:")


def test_not_known_lists_every_source_and_the_header_gives_the_link_state():
    rec = read_recording(demos.resolve("h200-probe"), warn=False)  # no per-tick link state; mem used, power null
    info = rec.header.gpus[0]
    everything = [r.figure for r in figure_sources(rec.header, info)]
    assert "temperature" in everything and "not recorded" not in everything
    seen = FiguresSeen()
    seen.scan(rec.samples, read_whole=True)
    rows = {r.figure: r for r in figure_sources(rec.header, info, seen.snapshot()[0], seen.whole)}
    assert "link gen/width" in rows  # the panel's title shows it from the header
    assert rows["not recorded"].source.startswith("mem used, power, temperature"), rows["not recorded"].source
    assert "mem used" not in rows and "power" not in rows


def test_figures_are_per_gpu_and_a_scan_is_bounded():
    def tick(k: int) -> Sample:
        gpus = (GpuSample(0, pcie_tx_Bps=1.0, fan_util=0.3 if k == 7 else None), GpuSample(1, pcie_tx_Bps=1.0))
        return Sample(float(k), gpus if k % 2 else gpus[::-1])  # GPU order differs tick to tick

    samples = [tick(k) for k in range(10)]
    seen = FiguresSeen()
    seen.scan(samples, read_whole=True, budget=8)  # 4 ticks of 2 GPUs
    assert seen.scanned == 4 and not seen.whole
    assert seen.snapshot() == {0: {"pcie_tx_Bps"}, 1: {"pcie_tx_Bps"}}
    while not seen.whole:
        seen.scan(samples, read_whole=True, budget=8)
    assert seen.snapshot() == {0: {"pcie_tx_Bps", "fan_util"}, 1: {"pcie_tx_Bps"}}
    seen.note(tick(3))  # a replay's figures come from its recording: a fed tick adds nothing
    live = FiguresSeen()
    for s in samples:
        live.note(s)
    assert live.snapshot() == seen.snapshot() and not live.whole


# ---- the engine section: the same rule ------------------------------------------------------------------


def _engine_part(text: str) -> str:
    return text[text.index("Engine panel") :]


def test_the_engine_section_lists_only_the_engine_figures_read_so_far():
    """llama-server paused before its first request ended: no TTFT, ITL or queue yet; those rows are named as
    without a reading, not given a source. The KV cache, which llama-server never reports, is not among them:
    its row says it is not collected by this engine, and why. Once requests ended (the end of the recording),
    TTFT and prefill come with their source; the KV cache row stays as it was."""
    rec = read_recording(demos.resolve("h200-pinned"), warn=False)
    early = flat(_engine_part(page_text(rec, 40)))
    assert "running, waiting /slots entries" in early or "running, waiting running: /slots" in early, early
    assert "in host memory llama-server's load log" in early, early
    assert "TTFT, prefill llama-server log, per finished request" not in early, early
    assert re.search(r"no reading yet [^:]*TTFT, prefill[^:]*: no reading of them in this session so far", early)
    kv = "KV cache not collected by this engine: llama-server's /metrics and /slots, as read here, carry no KV"
    assert kv in early and "KV cache" not in early.split("no reading yet")[1], early
    late = flat(_engine_part(page_text(rec, len(rec.samples) - 1)))
    assert "TTFT, prefill llama-server log, per finished request" in late, late
    assert kv in late, late


@pytest.mark.parametrize("kind", ["vllm", "ollama", "llamacpp", "sglang"])
def test_every_engine_row_is_checked_for_readings(kind):
    """Each row of every registered engine is either checked against the session's readings (listed only
    with one) or one the engine never exposes (listed as not collected by it, with or without readings)."""
    from pcie_tui.engines import registry
    from pcie_tui.tui.sources import ENGINE_FIGURE_KEYS, NOT_EXPOSED, engine_sources

    assert set(registry.names()) == {"vllm", "ollama", "llamacpp", "sglang"}  # a new engine: add it above
    eng = registry.get(kind)
    assert eng is not None, kind
    labels = [r[0] for r in eng.sources("w")]
    assert all(label in ENGINE_FIGURE_KEYS or label in eng.not_exposed for label in labels), kind
    assert eng.not_exposed <= set(labels), kind
    never = [r for r in engine_sources(kind, {}, 10.0, frozenset()) if r.figure != "no reading yet"]
    assert [r.figure for r in never] == [label for label in labels if label in eng.not_exposed], never
    assert all(r.source.startswith(f"{NOT_EXPOSED}: ") for r in never), never
    rows = engine_sources(kind, {}, 10.0, frozenset())
    assert (rows[-1].figure == "no reading yet") == bool(set(labels) - eng.not_exposed), rows
    assert [r.figure for r in engine_sources(kind, {}, 10.0, None)] == [r[0] for r in eng.sources("the last 10 s")]
    everything = frozenset(k for keys in ENGINE_FIGURE_KEYS.values() for k in keys)
    assert "no reading yet" not in [r.figure for r in engine_sources(kind, {}, 10.0, everything)]


def test_ollama_and_sglang_raw_readings_count_as_seen():
    from pcie_tui.core.model import EngineSample
    from pcie_tui.tui.seen import EngineFiguresSeen

    seen = EngineFiguresSeen()
    seen.note(None, EngineSample(kind="ollama", up=True, extra={"models": [{"name": "m"}], "gpu_layers": None}), None)
    assert {"models"} <= seen.snapshot() and "gpu_layers" not in seen.snapshot()
    seen.note(None, EngineSample(kind="sglang", up=True, extra={"hicache": {"load_back_tokens_total": 3.0}}), None)
    assert "hicache" in seen.snapshot()
