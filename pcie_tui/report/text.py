"""``pcie-tui report``: what a recording says, as text or JSON."""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from pcie_tui.analyze.analysis import Analysis
from pcie_tui.analyze.answer import engine_only_headline, finding_lines
from pcie_tui.analyze.attribution import gpu_ceilings
from pcie_tui.analyze.engine_session import EngineSessionFold
from pcie_tui.analyze.fold import folded_events_line
from pcie_tui.analyze.health_lines import heat_lines, link_health_lines
from pcie_tui.analyze.linkmodel_report import LinkModelReport
from pcie_tui.analyze.session import SessionAnalyzer
from pcie_tui.analyze.ttft_parts import parts_line
from pcie_tui.analyze.verdict import DEFAULT_THRESHOLDS, Thresholds
from pcie_tui.analyze.whatif import render_whatif, whatif_report
from pcie_tui.core.model import GpuInfo, Sample, SessionHeader
from pcie_tui.core.units import bind_units, tokens_per_s, unbind_units
from pcie_tui.core.units import pct as _pct
from pcie_tui.core.units import rate as _gbs
from pcie_tui.core.units import rate as fmt_rate
from pcie_tui.core.vocab import BOUND_SHORT
from pcie_tui.doctor.cli import render_linkmodel
from pcie_tui.recording.reader import Recording, RowStream, SampleList, gc_paused, sample_from_row
from pcie_tui.recording.timeline import BlockColumns
from pcie_tui.sources.faults import fault_words

if TYPE_CHECKING:  # rich is imported where the text report is drawn: `report --json` never needs it
    from rich.console import Console
    from rich.table import Table

# report --json: bump when a field changes meaning or goes away (docs/report-json.md).
SCHEMA_VERSION = 3


def build_report(
    rec: Recording, thresholds: Thresholds = DEFAULT_THRESHOLDS, exact: bool = False
) -> tuple[dict[str, Any], SessionAnalyzer]:
    """The report of a recording held whole; ``exact``: a long session's oldest ticks are not summarised
    (analyze/retire.py), for a plot that draws every tick (the report's numbers come from the default)."""
    # No cyclic GC meanwhile: a long recording's raw ticks are millions of objects, and every
    # full collection rescans them all (a third of the report's time on a 1-hour 8-GPU file).
    with gc_paused():
        return _build_report(rec, thresholds, exact)


def with_stored_calibration(rec: Recording) -> None:
    """GPUs recorded without a calibrated ceiling get this machine's stored one for the same GPU
    (by UUID, on the same link shape), as the live monitor would have used; the header says so."""
    hdr = rec.header
    if not hdr.gpus or all(g.link.measured_Bps is not None for g in hdr.gpus):
        return
    from pcie_tui.sources.live import apply_calibration

    applied = apply_calibration(hdr.gpus)
    gpus = tuple(a if g.link.measured_Bps is None else g for g, a in zip(hdr.gpus, applied, strict=True))
    if gpus != hdr.gpus:
        note = "ceilings: this GPU's stored calibration (pcie-tui calibrate) applied at report time"
        rec.header = dataclasses.replace(hdr, gpus=gpus, extra={**hdr.extra, "calibration_applied": note})


def _build_report(rec: Recording, thresholds: Thresholds, exact: bool) -> tuple[dict[str, Any], SessionAnalyzer]:
    with_stored_calibration(rec)
    # A recording read from a file is fed to the analyzer from its raw ticks (no Samples built: a
    # replay without a screen).
    feed = ReportFeed(rec.header, thresholds)
    feed.analysis.session.exact = exact
    samples = rec.samples
    if rec.rows is not None and isinstance(samples, SampleList) and not samples.built:
        feed.rows(rec.rows)
    else:
        feed.samples(samples)
    return feed.finish(rec)


def report_file(
    path: str | Path, thresholds: Thresholds = DEFAULT_THRESHOLDS
) -> tuple[dict[str, Any], SessionAnalyzer, Recording, int]:
    """The report of a recording file read in blocks (:class:`~pcie_tui.recording.reader.RowStream`): each
    block of ticks is checked, fed to the analysis, the engine's fold and the link model, and dropped, so
    memory stays flat however long the recording. Returns (report, analyzer, the recording without its
    ticks, ticks read); reading warnings are in the recording and the report."""
    st = RowStream(path)
    rec = Recording(Path(path), st.header, SampleList([]), st.events)
    with_stored_calibration(rec)
    feed = ReportFeed(rec.header, thresholds)
    # Blocks as typed ticks where they can be (the analysis takes their columns), unless the link model
    # is compared: it builds Samples from raw dicts.
    st.typed = feed.link.fold is None
    n = 0
    with gc_paused():
        for rows in st.chunks():
            n += len(rows)
            feed.rows(rows, st.columns_of(rows))
            del rows  # gone before the next block is parsed (RowStream.chunks)
        rec.warnings, rec.segments, rec.gaps = st.warnings, st.segments, st.gaps
        out, an = feed.finish(rec)
    return out, an, rec, n


class ReportFeed:
    """What ``report`` works out over a recording, fed its ticks in order (raw rows or Samples) and
    finished once with the recording's header, events, warnings and gaps."""

    def __init__(self, header: SessionHeader, thresholds: Thresholds) -> None:
        self.analysis = Analysis(header, (), thresholds)
        self.engine = EngineSessionFold()
        self.link = LinkModelReport(header)

    def rows(self, rows: list[dict[str, Any]], swept: BlockColumns | None = None) -> None:
        """A block of checked raw ticks (``swept``: the columns the reader's check took from them)."""
        self.analysis.feed_rows(rows, swept)
        self.engine.feed_rows(rows, swept)
        if self.link.fold is not None:  # the link model needs Samples: only when there is a model to compare
            for s in map(sample_from_row, rows):
                self.link.fold.feed(s)

    def samples(self, samples: Sequence[Sample]) -> None:
        self.analysis.feed_all(samples)
        link = self.link.fold
        for s in samples:
            if s.engine is not None:
                self.engine.feed(s.t, s.engine)
            if link is not None:
                link.feed(s)

    def finish(self, rec: Recording) -> tuple[dict[str, Any], SessionAnalyzer]:
        analysis = self.analysis
        analysis.recorded_events(rec.events)
        an = analysis.session
        an.gaps = [(g["start"], g["end"]) for g in rec.gaps]
        analysis.finish()
        ans = analysis.answer()
        out: dict[str, Any] = {"schema_version": SCHEMA_VERSION, "headline": ans.headline.to_json()}
        out.update(an.summary())
        for g in out["gpus"]:  # the one ceiling every "% of" in this report is taken against
            c = gpu_ceilings(an, g["index"]).pinned
            g["ceiling"] = {"Bps": c.Bps, "source": c.source, "detail": c.detail, "theoretical_Bps": c.theoretical_Bps}
        _recording_facts(out, rec)
        out["engine"] = self.engine.report(an)
        if out["headline"]["phase"] is None and not rec.header.gpus and out["engine"]:
            # No GPU readings at all (engine alone): say what ran, and that what held it is unknown.
            out["headline"] = engine_only_headline(out["engine"], out["gpu_unavailable"]).to_json()
        findings = {g: [f.to_json() for f in fs] for g, fs in ans.findings.items()}
        out["attribution"] = {"findings": {str(g): fs for g, fs in findings.items()}, "engine_facts": ans.facts}
        out["whatif"] = whatif_report(rec.header, an, findings)
        out["linkmodel"] = self.link.result()
        out["heat"] = an.heat.report()  # throttled stretches and token timing inside vs outside them
        out["link_health"] = an.link_health.report()  # replay/AER counters that rose, downtraining under load
        return out, an


def _recording_facts(out: dict[str, Any], rec: Recording) -> None:
    """The file, its host and start, and what reading it had to allow for."""
    out["file"] = str(rec.path)
    out["host"] = rec.header.host
    out["created"] = rec.header.created
    out["engine_info"] = rec.header.engine
    out["warnings"] = rec.warnings
    out["gaps"] = [e for e in rec.events if e.get("event") == "engine_gap"] + rec.gaps
    out["segments"] = rec.segments
    out["gaps_s"] = sum(g["duration_s"] for g in rec.gaps)
    out["gpu_unavailable"] = rec.header.extra.get("gpu_unavailable")
    out["calibration_applied"] = rec.header.extra.get("calibration_applied")
    # What went away mid-session (a GPU, NVML, the engine, the clock, the disk), in the live session's words.
    out["faults"] = [{**e, "words": w} for e in rec.events if (w := fault_words(e)) is not None]


def render_text(report: dict[str, Any], rec: Recording, console: Console) -> None:
    """The report as text: the answer first, then what held each phase back, per GPU its verdict
    time, use and events, the engine, the link budget model, the what-if table and warnings."""
    _render_head(report, console)
    _render_attribution(report, console)
    _render_health(report, console)
    for g in report["gpus"]:
        _render_gpu(report, g, rec.header.gpu(g["index"]), console)
    _render_tail(report, console)


def _render_head(report: dict[str, Any], console: Console) -> None:
    """The headline, the file it reads, and what the reading of that file had to allow for."""
    for line in report["headline"]["text"].splitlines():  # the answer first
        _wrapped(console, line)
    console.print()
    console.print(
        f"[bold]{report['file']}[/]  host {report['host']}  created {report['created']}  "
        f"{report['duration_s']:.1f} s, {report['ticks']} ticks"
    )
    if report.get("calibration_applied"):
        console.print(report["calibration_applied"], markup=False, highlight=False)
    if report.get("gpu_unavailable"):
        console.print(f"GPU side unavailable: {report['gpu_unavailable']}", markup=False, highlight=False)
    holes = [g for g in report.get("gaps") or () if g.get("event") == "recording_gap"]
    if holes:
        console.print(
            f"{len(holes)} gap(s) in the recording, {sum(g['duration_s'] for g in holes):.1f} s in all: "
            "left out of verdict time and rates",
            markup=False,
            highlight=False,
        )
    for f in report.get("faults") or ():
        _wrapped(console, f"Interruption: {f['words']}")


def _render_gpu(report: dict[str, Any], g: dict[str, Any], info: GpuInfo | None, console: Console) -> None:
    """One GPU: its link and ceiling, time per verdict, use, phases and saturation events."""
    link = ""
    if info is not None and info.link.capacity_Bps:
        # The theoretical rate is a spec fact; every share below is of the one ceiling.
        c = g["ceiling"]
        link = (
            f"PCIe Gen{info.link.gen} x{info.link.width} (spec {_gbs(info.link.capacity_Bps)} per direction; "
            f"ceiling {_gbs(c['Bps'])}, {c['detail']})"
        )
    console.print(f"\n[bold]GPU {g['index']}[/] {g['name'] or ''}  {link}")
    console.print(_verdict_table(g))
    console.print(_use_table(g))
    if g["phases"]:
        console.print(_phase_table(report, g))
    if g["events"]:
        console.print(_events_table(g, report["start"]))
    if g.get("events_folded"):  # a long session's old events, beyond the longest (analyze/fold.py)
        _wrapped(console, folded_events_line(g["events_folded"]))


def _verdict_table(g: dict[str, Any]) -> Table:
    """Time in each saturation verdict and its share of the GPU's time."""
    from rich.table import Table

    t = Table("saturated", "time", "share", box=None)
    total = sum(g["time_in_verdict_s"].values()) or 1.0
    for v, secs in g["time_in_verdict_s"].items():
        if secs > 0:
            t.add_row(v, f"{secs:.1f} s", _pct(secs / total))
    return t


def _use_table(g: dict[str, Any]) -> Table:
    """Peak, median and p95 of link, DRAM and SM use."""
    from rich.table import Table

    st = Table("use", "peak", "median", "p95", box=None)
    st.columns[0].no_wrap = True
    q = ("peak", "median", "p95")
    st.add_row("link (% of ceiling)", *(_pct(g["link_util"][k]) for k in q))
    st.add_row("link rate", *(_gbs(g["link_Bps"][k]) for k in q))
    dram = "DRAM (proxy: busy %)" if "proxy" in g["dram_basis"] else "DRAM bandwidth"
    st.add_row(dram, *(_pct(g["dram_util"][k]) for k in q))
    st.add_row("SM", *(_pct(g["sm_util"][k]) for k in q))
    return st


def _phase_table(report: dict[str, Any], g: dict[str, Any]) -> Table:
    """Per phase: ticks, the saturation verdict's shares, what held it back, link and DRAM medians."""
    from rich.table import Table

    # "saturated" is the link/DRAM verdict alone; "held back by" is the attribution above (a link
    # far below capacity can still be what the phase waited on), so both stand side by side.
    held = {
        f["phase"]: f"{BOUND_SHORT[f['bound']]} {_pct(f['shares'][f['bound']], space=False)}"
        for f in ((report.get("attribution") or {}).get("findings") or {}).get(str(g["index"]), ())
    }
    cols = ("phase", "ticks", "saturated", *(("held back by",) if held else ()))
    pt = Table(*cols, "link median", "DRAM median", box=None)
    pt.columns[0].no_wrap = True
    if held:
        pt.columns[3].no_wrap = True
    for p, ph in g["phases"].items():
        shares = ", ".join(f"{v} {_pct(sh, space=False)}" for v, sh in ph["verdict_share"].items() if sh > 0)
        why = (held.get(p, "n/a"),) if held else ()
        pt.add_row(p, str(ph["ticks"]), shares, *why, _gbs(ph["link_Bps"]["median"]), _pct(ph["dram_util"]["median"]))
    return pt


def _events_table(g: dict[str, Any], t0: float) -> Table:
    """The GPU's saturation events: resource, start (from the session's start), length, peak, mean."""
    from rich.table import Table

    et = Table("saturated", "start", "dur", "peak", "mean", "dir", "phase", box=None)
    et.columns[6].no_wrap = True
    for e in g["events"]:
        dur = (e["end"] - e["start"]) if e["end"] is not None else 0.0
        peak = _pct(e["peak_util"])
        if e["peak_Bps"] is not None:
            peak += f" ({_gbs(e['peak_Bps'])} {e['bus']})"
        et.add_row(
            e["resource"] + (" (proxy)" if e["basis"] == "proxy" else ""),
            f"+{e['start'] - t0:.1f} s",
            f"{dur:.1f} s",
            peak,
            _pct(e["mean_util"]),
            e["direction"] or "",
            e["phase"] or "",
        )
    return et


def _render_tail(report: dict[str, Any], console: Console) -> None:
    """After the GPUs: the engine and its facts, the link budget model, the what-if table, warnings."""
    eng = report.get("engine")
    if eng:
        _render_engine(eng, console)
        _render_engine_bytes(eng.get("bytes"), console)
        _render_engine_facts((report.get("attribution") or {}).get("engine_facts"), console)
    lm = report.get("linkmodel")
    if lm and lm.get("available"):
        console.print("\n[bold]Link budget model[/]")
        _wrapped(console, render_linkmodel(lm))
    elif lm and eng and lm.get("reason"):  # an engine ran, but its model could not be priced: say why
        console.print("\n[bold]Link budget model[/]: not computed", highlight=False)
        _wrapped(console, f"  {lm['reason']} (pcie-tui linkmodel prices a model given its file or shape)")
    whatif = render_whatif(report["whatif"])
    if whatif:
        console.print()
        _wrapped(console, whatif)
    for w in report["warnings"]:
        console.print(f"[yellow]warning:[/] {w}")


def _render_engine_bytes(b: dict[str, Any] | None, console: Console) -> None:
    """The engine's own prefix-cache and KV offload counters, NVML's PCIe bytes beside them, and the
    check line where the engine's bytes exceed what NVML saw."""
    if not b:
        return
    s = b.get("session") or {}
    rate = s.get("prefix_cache_hit_rate")
    if rate is not None:
        _wrapped(
            console,
            f"  prefix cache: {_pct(rate)} of {s.get('prefix_cache_queries') or 0:.0f} looked-up prompt tokens were hits "
            "(the engine's counters; a hit's prefill computes and moves nothing)",
        )
    if s.get("engine_Bps") is not None:
        nvml = s.get("nvml_pcie_Bps")
        seen = f"; NVML PCIe RX + TX over the same {s['span_s']:.1f} s: {fmt_rate(nvml)}" if nvml is not None else ""
        _wrapped(
            console,
            f"  KV offload (the engine's counters): {fmt_rate(s.get('h2d_Bps'))} host->device, "
            f"{fmt_rate(s.get('d2h_Bps'))} device->host{seen}",
        )
    if b.get("check"):
        _wrapped(console, f"  check: {b['check']}")


def _render_engine_facts(fx: dict[str, Any] | None, console: Console) -> None:
    """Where the engine put what, as its flags, environment, log or API said (the attribution's facts)."""
    if not fx:
        return
    if fx.get("host_weights"):
        why = f" ({fx['host_memory_why']})" if fx.get("host_memory_why") else ""
        _wrapped(console, f"  in host memory: {fx['host_weights']}{why}")
    if fx.get("kv_on_host"):
        _wrapped(console, f"  KV cache in host memory: {fx['kv_on_host']}")
    said = _runtime_facts(fx)
    if said:
        _wrapped(console, f"  read: {said}")
    for line in (fx.get("log_evidence") or [])[:3]:
        _wrapped(console, f"  engine said: {line}")


_FACT_NAMES = {
    "load_mode": "load mode",
    "gpu_layers": "layers on the GPU",
    "op_offload": "op offload",
    "op_offload_min_batch": "op offload from batch",
    "memory_not_in_vram": "model memory not in VRAM",
    "request_timing": "per-request timing",
    "hicache": "HiCache",
    "hicache_moved": "HiCache moved",
    "token_source": "token counts",
    "weight_offload": "weight offload",  # vLLM (weights_pinned is the line above, as host_pinned)
    "kv_offload": "KV offload",
    "prefix_caching": "prefix caching",
}


def _runtime_facts(fx: dict[str, Any]) -> str:
    """The engine's runtime facts with their sources, one phrase each (host_pinned is the line above)."""
    out = []
    for f in fx.get("runtime") or []:
        name = _FACT_NAMES.get(f.get("name")) if isinstance(f, dict) else None
        if name is None:
            continue
        v = f.get("value")
        shown = "unknown" if v is None else ("on" if v is True else "off" if v is False else str(v))
        out.append(f"{name} {shown} ({f.get('source')})")
    return " · ".join(out)


HANG = 4  # a wrapped line's continuation sits this much further in than its first line
GLUE = "\ue000"  # a private-use character: one cell wide, a word character to rich's wrapper


def _render_attribution(report: dict[str, Any], console: Console) -> None:
    """What held each phase back, per GPU: bound, shares, evidence, cause and fix (the same lines the
    TUI's answer screen shows: :func:`pcie_tui.analyze.answer.finding_lines`)."""
    lines = finding_lines((report.get("attribution") or {}).get("findings") or {})
    if not lines:  # a session without work (GPU-only, unlabelled) gets no empty section
        return
    console.print("\n[bold]What held each phase back[/]")
    for line in lines:
        _wrapped(console, line)


def _render_health(report: dict[str, Any], console: Console) -> None:
    """Heat and clocks (throttled stretches, token timing inside vs outside), then link health."""
    if report.get("heat") is not None:
        console.print("\n[bold]Heat and clocks[/]")
        for line in heat_lines(report["heat"], report.get("start")):
            _wrapped(console, line)
    lh = report.get("link_health") or {}
    if lh.get("read") or lh.get("events"):
        console.print("\n[bold]Link health[/]")
        for line in link_health_lines(lh, report.get("start")):
            _wrapped(console, line)


def _wrapped(console: Console, text: str) -> None:
    """Plain text (no markup) fitted to the console's width, line by line: a line too long
    for it wraps at word boundaries with its continuation indented under its own start
    (rich's own wrapping would start the continuation at column 0). A number never parts from its
    unit: each pair is glued with :data:`GLUE` (one cell, not a space to rich) while wrapping."""
    from rich.cells import cell_len
    from rich.text import Text

    width = console.width
    for line in text.split("\n"):
        body = line.lstrip(" ")
        indent = min(len(line) - len(body), max(0, width // 2))
        if cell_len(line) <= width or not body:
            console.print(line, markup=False, highlight=False, crop=False, soft_wrap=True)
            continue
        hang = indent + HANG if width - indent - HANG >= 20 else indent
        parts = Text(bind_units(body, GLUE)).wrap(console, width - hang)
        for i, part in enumerate(parts):
            pad = " " * (indent if i == 0 else hang)
            part = Text(unbind_units(part.plain.rstrip(), GLUE))
            console.print(Text(pad) + part, markup=False, highlight=False, crop=False, soft_wrap=True)


TAIL_MIN_REQUESTS = 20  # fewer timed requests than this: p95/p99 fall between requests, and the report says so


def _q(d: dict[str, Any] | None, unit: str = "auto", scale: float = 1e3) -> str:
    """p50/p95/p99 of a quantile dict in seconds; ``unit="auto"``: ms, or s once a quantile reaches 1 s."""
    if not d or d.get("p50") is None:
        return "n/a"
    top = max((v for v in d.values() if isinstance(v, int | float)), default=0.0)
    if unit == "auto":
        unit, scale = ("s", 1.0) if top >= 1.0 else ("ms", 1e3)
    places = 2 if unit == "s" and top < 10.0 else 1  # 1.04 s and 1.00 s stay apart
    vals = [d.get(k) for k in ("p50", "p95", "p99")]
    return " / ".join("n/a" if v is None else f"{v * scale:.{places}f}" for v in vals) + f" {unit} (p50/p95/p99)"


def _render_ttft_parts(tp: dict[str, Any] | None, console: Console) -> None:
    """The engine's TTFT in parts (means that sum), its preemptions, and what it does not time, with why."""
    if not tp:
        return
    _wrapped(console, "  " + parts_line(tp) + "; each part's p50/p95/p99 is on its line above")
    if tp.get("counts_apart"):
        _wrapped(console, f"  (means over different requests: {', '.join(tp['counts_apart'])} counted another number)")
    per = tp.get("preemptions_per_request")
    if per:
        _wrapped(console, f"  preempted: {per:.2f} times per finished request ({tp.get('preemptions') or 0:g} in all)")
    for why in tp.get("unmeasured") or ():
        _wrapped(console, f"  not measured: {why}")


def _render_engine(eng: dict[str, Any], console: Console) -> None:
    def q_rate(d: dict[str, Any] | None) -> str:
        if not d or d.get("p50") is None:
            return "n/a"
        return " / ".join(f"{d[k]:.1f}" for k in ("p50", "p95", "p99")) + " tok/s (p50/p95/p99)"

    out = console.print
    req = eng.get("requests")
    out(f"\n[bold]Engine[/] {eng.get('kind')}  requests {'n/a' if req is None else f'{req:g}'}")
    up_s = eng.get("up_s")
    over = f" (token counters over {up_s:.1f} s up)" if isinstance(up_s, int | float) and up_s > 0 else ""
    _wrapped(
        console,
        f"  prompt {tokens_per_s(eng.get('prompt_tokens_per_s'))}, generation {tokens_per_s(eng.get('generation_tokens_per_s'))}{over}",
    )
    for label, key in (
        ("prefill (prompt eval)", "prefill_s"),
        ("decode               ", "decode_s"),
        ("time to first token  ", "ttft_s"),
        ("inter-token latency  ", "itl_s"),
        ("queue                ", "queue_s"),
        ("slot setup           ", "setup_s"),
    ):
        if key == "setup_s" and not eng.get(key):
            continue  # only engines that time it (llama-server: its prompt cache's work before a request)
        _wrapped(console, f"  {label} {_q(eng.get(key))}")
    _render_ttft_parts(eng.get("ttft_parts"), console)
    pr = eng.get("per_request") or {}
    if pr.get("n"):
        _wrapped(
            console,
            f"  per request ({pr['n']}): prompt {q_rate(pr.get('prompt_tokens_per_s'))}, "
            f"generation {q_rate(pr.get('generation_tokens_per_s'))}",
        )
    basis = eng.get("basis") or eng.get("quantile_method")
    if basis:
        _wrapped(console, f"  latency basis: {basis}")
    n = pr.get("n")
    if isinstance(n, int) and 1 < n < TAIL_MIN_REQUESTS and "per request" in str(eng.get("quantile_method")):
        # Linear interpolation: with 3 requests p99 sits between the two slowest, on no request.
        _wrapped(console, f"  tail: over {n} requests, p95 and p99 are interpolated between the slowest two")
    phases = sorted((eng.get("phases") or {}).items(), key=lambda kv: -kv[1].get("time_s", 0.0))
    shown = [f"{p} {v['time_s']:.1f} s ({_pct(v.get('share'))})" for p, v in phases if v.get("time_s", 0.0) > 0]
    if shown:
        _wrapped(console, "  engine phases: " + ", ".join(shown))
