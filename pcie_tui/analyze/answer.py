"""The answer first: what held this run back, in which phase, and what would change it.

Builds on :mod:`pcie_tui.analyze.attribution` (what bound each phase, with evidence) and
:mod:`pcie_tui.engines` (the cause and the fix in the engine's own words). ``report`` prints
the headline before anything else, ``report --json`` carries it as an object, and the TUI shows
the same text above its panels (:class:`pcie_tui.analyze.analysis.Analysis` serves all three).
"""

from __future__ import annotations

import dataclasses
from typing import Any

from pcie_tui.analyze.attribution import phase_findings
from pcie_tui.analyze.engine_bytes import PhaseCounts
from pcie_tui.analyze.heat import cut_share
from pcie_tui.analyze.result import Answer, Finding, Headline
from pcie_tui.analyze.session import SessionAnalyzer
from pcie_tui.core import units
from pcie_tui.core.model import SessionHeader
from pcie_tui.core.units import rate as fmt_rate
from pcie_tui.core.vocab import BOUND_WORDS
from pcie_tui.engines import EngineFacts, FindingFacts, advise, engine_info, facts_for

# Phases that are not work: a headline about them answers nothing.
NOT_WORK = ("idle", "down", "unlabelled", "load", "gap")
ENGINE_PHASES = ("prefill", "decode", "mixed", "housekeeping", "queue")


def _pct(v: float | None) -> str:
    """A share inside a sentence: "84%"."""
    return units.pct(v, space=False)


def predicted_range(pred: dict[str, Any]) -> str:
    """``2.8-3.2 s``, or one number when hiding the copies would not change it."""
    lo, hi = pred["phase_s_at_best"], pred["phase_s_no_overlap"]
    return f"{lo:.1f} s" if hi - lo < 0.05 else f"{lo:.1f}-{hi:.1f} s"


def over_default_ceiling(f: Finding) -> bool:
    """The link read above its calibrated or default ceiling, so its highest reading became the
    ceiling (:mod:`pcie_tui.core.ceiling`, "observed"): calibrate measures the link's own."""
    return f.ceilings.pinned.source == "observed"


CALIBRATE_HINT = "`pcie-tui calibrate` measures this link's own ceiling"


def evidence_text(f: Finding, short: bool = False) -> str:
    """The numbers behind one finding, with the ceiling and where it came from (``short``: for one line)."""
    if short and f.bound in ("link", "transfer", "host"):
        return _short_evidence(f)
    c = f.ceilings
    # The finding's figures are over the ticks of its bound, not the whole phase (the phase table's).
    rate = f"{fmt_rate(f.link_Bps)} {f.stat} of those ticks"
    pinned = f"{fmt_rate(c.pinned_Bps)} ceiling ({c.pinned_source})"
    dram_name = "DRAM busy (proxy)" if f.dram_basis == "proxy" else "DRAM"
    if f.bound == "link":
        note = f"; {CALIBRATE_HINT}" if over_default_ceiling(f) else ""
        return f"link {rate} = {_pct(f.link_of_pinned)} of the {pinned}{note}"
    if f.bound == "transfer":
        pageable = f", pageable ceiling {fmt_rate(c.pageable_Bps)} ({c.pageable_source})" if f.transfer_staged else ""
        return f"host<->GPU {rate} = {_pct(f.link_of_pinned)} of the {pinned}{pageable}; GPU SM {_pct(f.sm_util)}"
    if f.bound == "host":
        return f"GPU SM {_pct(f.sm_util)}, link {rate} {_when(f)}"
    if f.bound == "memory":
        return f"{dram_name} {_pct(f.dram_util)} of peak, SM {_pct(f.sm_util)}"
    if f.bound == "compute":
        return f"SM {_pct(f.sm_util)}, {dram_name} {_pct(f.dram_util)}"
    if f.bound == "unknown" and f.too_short:
        return f"{f.unknown_why}: no bound is named from so few readings"
    if f.bound == "unknown":
        return f"{f.unknown_why or 'counters not reported'}: what held it back cannot be told"
    return f"link {rate}, SM {_pct(f.sm_util)}"


def clocks_cut_text(f: Finding) -> str:
    """What a memory- or compute-bound finding owes to clocks that were cut ('' where they were not)."""
    c = f.clocks_cut
    if c is None or f.bound not in ("memory", "compute"):
        return ""
    why = "+".join(c["reasons"][:2]) or "clocks under their maximum"
    mhz = c.get("sm_clock_MHz")
    top = c.get("sm_clock_max_MHz")
    clock = f", SM {mhz:,.0f}" + (f" of {top:,.0f} MHz" if top else " MHz") if mhz is not None else ""
    return (
        f"; clocks cut {_pct(c['share'])} of the phase ({why}{clock}): {f.bound}-bound on a throttled GPU "
        "that long, not the workload alone"
    )


def _short_evidence(f: Finding) -> str:
    """:func:`evidence_text` for the headline's one line (link, transfer and host bounds)."""
    c = f.ceilings
    src = c.pinned.source  # calibrated, default or observed
    cap = f"{fmt_rate(c.pinned_Bps)} pinned ({src})"
    if f.bound == "link":
        return f"link {fmt_rate(f.link_Bps)} = {_pct(f.link_of_pinned)} of {cap}"
    if f.bound == "host":
        return f"SM {_pct(f.sm_util)}, link {fmt_rate(f.link_Bps)}, {_when(f)}"
    gsrc = c.pageable.source
    if not f.transfer_staged:
        pageable = ""
    elif gsrc == src:  # one word for both ceilings
        cap = f"{fmt_rate(c.pinned_Bps)} pinned"
        pageable = f", pageable {fmt_rate(c.pageable_Bps)} (both {src})"
    else:
        pageable = f", pageable {fmt_rate(c.pageable_Bps)} ({gsrc})"
    return f"copies {fmt_rate(f.link_Bps)} = {_pct(f.link_of_pinned)} of {cap}{pageable}; SM {_pct(f.sm_util)}"


def _when(f: Finding) -> str:
    """What "work in flight" rests on for a host-bound finding."""
    if f.phase == "loading":
        return "while the engine loaded"
    return "while requests were in flight" if f.work_basis != "label" else "in a phase labelled as work"


def pick(findings: dict[int, list[Finding]], phase: str | None = None) -> Finding | None:
    """The finding that answers "what held this run back": the longest phase of work (engine phases
    before loading), on the GPU where it lasted longest; with ``phase`` (a live session's current
    phase, when it is work), that phase's."""
    work = [f for fs in findings.values() for f in fs if f.phase not in NOT_WORK and f.bound != "idle"]
    if phase is not None and phase not in NOT_WORK:
        now = [f for f in work if f.phase == phase]
        work = now or work
    if not work:
        return None
    engine = [f for f in work if f.phase in ENGINE_PHASES]
    return max(engine or work, key=lambda f: (f.duration_s, -f.gpu))


def answer(
    header: SessionHeader,
    analyzer: SessionAnalyzer,
    events: Any = (),
    *,
    facts: EngineFacts | None = None,
    phase: str | None = None,
    final: bool = True,
) -> Answer:
    """The answer over what ``analyzer`` has seen. ``events``: the recording's, whose ``engine_ready``
    facts complete the header's (:func:`engine_info`), unless ``facts`` are given. ``phase`` and
    ``final``: a live session's current phase, and False while it runs (its figures are "so far")."""
    fx = facts if facts is not None else facts_for(engine_info(header.engine, events))
    findings = phase_findings(header, analyzer, fx)
    counts = getattr(getattr(analyzer, "engine_bytes", None), "phases", {})
    rw = getattr(analyzer, "request_waits", None)
    waits = rw.waits() if rw is not None else None
    br = getattr(analyzer, "between_requests", None)
    copies = br.copies() if br is not None else None
    for fs in findings.values():
        for f in fs:
            ff = finding_facts(f, counts.get(str(f.phase)))
            if waits is not None:
                ff = dataclasses.replace(
                    ff, requests_timed=waits.n, ttft_p50_s=waits.ttft_p50_s, setup_p50_s=waits.setup_p50_s,
                    cached_prompt_tokens=waits.cached_tokens,
                )  # fmt: skip
            if copies is not None and copies.stretches and f.phase == "housekeeping":
                ff = dataclasses.replace(ff, between_copies=copies.to_json())
            f.advice = tuple(advise(fx, ff))
            f.clocks_cut = cut_share(getattr(analyzer, "heat", None), f.gpu, str(f.phase))
            f.evidence = evidence_text(f) + clocks_cut_text(f)
    top = pick(findings, phase)
    head = headline(top, len(findings) > 1, final) if top is not None else unlabelled_headline(findings)
    return Answer(head, findings, _facts_json(fx))


def _facts_json(fx: EngineFacts | None) -> dict[str, Any] | None:
    return fx.to_json() if fx is not None else None


def finding_facts(f: Finding, counts: PhaseCounts | None = None) -> FindingFacts:
    """The finding as an engine's ``advise`` reads it (the engines sit below the analysis); ``counts``:
    the engine's own counters over the finding's phase (:mod:`pcie_tui.analyze.engine_bytes`)."""
    c = f.ceilings
    pc = counts or PhaseCounts()
    return FindingFacts(
        bound=f.bound, phase=f.phase, gpu=f.gpu, duration_s=f.duration_s, bound_s=f.bound_s,
        shares=dict(f.shares), link_Bps=f.link_Bps, link_of_pinned=f.link_of_pinned,
        sm_util=f.sm_util, dram_util=f.dram_util,
        pinned_ceiling_Bps=c.pinned_Bps, pinned_ceiling_source=c.pinned_source,
        pageable_ceiling_Bps=c.pageable_Bps, pageable_ceiling_source=c.pageable_source,
        vram_used_bytes=f.vram_used_bytes, vram_total_bytes=f.vram_total_bytes,
        transfer_Bps=f.transfer_Bps, transfer_staged=f.transfer_staged, whatif_pinned=f.whatif_pinned,
        prefix_cache_hit_rate=pc.hit_rate, engine_offload_Bps=pc.rate("engine_bytes"),
        nvml_pcie_Bps=pc.rate("nvml_bytes"), preemptions=pc.preemptions, engine_copies=engine_copies(pc),
    )  # fmt: skip


def engine_copies(pc: PhaseCounts) -> dict[str, dict[str, float | None]] | None:
    """Per direction, the engine's own KV copy bytes, seconds and rate over a phase (None: it counted none)."""
    if pc.h2d_bytes is None and pc.d2h_bytes is None:
        return None
    return {
        d: {"bytes": getattr(pc, f"{d}_bytes"), "seconds": getattr(pc, f"{d}_s"), "Bps": pc.engine_rate(d)}
        for d in ("h2d", "d2h")
    }


NOTHING = "Nothing was in flight: no phase of work to attribute."
# A live phase's bound is named once this much of it has been measured: one tick is a guess, not a finding.
EVIDENCE_MIN_S = 1.0


def headline(f: Finding | None, several_gpus: bool, final: bool = True) -> Headline:
    """Two lines at most: what held which phase back with its numbers, then the change that would help.
    ``final`` False: a live session still running (the phase's figures are so far)."""
    if f is None:
        return Headline(NOTHING, None, "idle", None, None)
    where = f" on GPU {f.gpu}" if several_gpus else ""
    if not final and f.duration_s < EVIDENCE_MIN_S:
        text = (
            f"{f.phase}{where} · measuring ({f.duration_s:.1f} s of it so far): "
            f"what holds it back is named after {EVIDENCE_MIN_S:g} s of the phase."
        )
        return Headline(text, f.phase, "unknown", f.gpu, None, finding=f, final=False)
    so_far = "" if final else " so far"
    # One screen line where it can be: the evidence in short (the detail below has it in full).
    line1 = (
        f"{f.phase}{where}{so_far} ({f.duration_s:.1f} s): {BOUND_WORDS[f.bound]} "
        f"{_pct(f.share)} of the time: {evidence_text(f, short=True)}."
    )
    adv = f.advice[0] if f.advice else None
    pred = adv.predicted if adv else None
    return Headline(
        f"{line1}\n{_second_line(f, adv)}", f.phase, f.bound, f.gpu, f.share,
        cause=adv.cause if adv else None, fix=adv.fix if adv else None, predicted=pred, finding=f, final=final,
    )  # fmt: skip


def _second_line(f: Finding, adv: Any) -> str:
    """The headline's second line: the fix in the engine's words with what it buys, else the cause."""
    if adv and adv.fix:
        # The change itself (the fix's first clause), why (the short cause), and what it buys.
        line2 = f"Fix: {adv.fix.split(': ', 1)[0].split('; ', 1)[0].split(' (', 1)[0]}"
        line2 += f" ({adv.short or adv.cause})"
        pred = adv.predicted
        if pred and pred.get("phase_s_at_best"):
            line2 += f": {f.phase} {pred['phase_s']:.1f} s -> {predicted_range(pred)}"
        elif pred and pred.get("ttft_after_s") is not None:
            line2 += f": TTFT p50 {pred['ttft_p50_s']:.2f} s -> about {pred['ttft_after_s']:.2f} s"
        return line2 + "."
    if adv:
        return f"Cause: {adv.cause}."
    if f.bound == "unknown":
        return "No fix is proposed from counters that were not reported; the what-if leaves those ticks out."
    if f.bound == "link":
        line2 = "A faster link shortens it, a slower one lengthens it (what-if below)."
        if over_default_ceiling(f):
            line2 = f"{line2[:-1]}; it read above the default ceiling, so its highest reading is the ceiling: {CALIBRATE_HINT}."
        return line2
    if f.bound == "transfer" and f.phase == "loading":
        return (
            "The engine was loading weights: copies ran below the link's capacity, at the pace the host fed them "
            "(file reads, pageable memory); pcie-tui names no fix for a load."
        )
    if f.bound == "transfer" and not f.transfer_staged:
        return (
            "The GPU waited on host<->GPU copies running below the link's capacity, faster than pageable copies "
            f"reach ({fmt_rate(f.ceilings.pageable_Bps)}, {f.ceilings.pageable.source}): pinned, but small or "
            "intermittent; a faster link shortens only their busy share (what-if below)."
        )
    if f.bound == "transfer":
        which = (
            "nothing pcie-tui read from the engine says which"
            if f.work_basis == "engine"
            else "this recording has no engine facts that say which"
        )
        return (
            "The GPU waited on host<->GPU copies running below the link's capacity (pageable memory, or small or "
            f"intermittent copies); {which}."
        )
    return "A faster link would not change it much (what-if below)."


UNLABELLED_BUSY_MIN_S = 1.0  # less busy time than this in a session without phases reads as nothing in flight


def unlabelled_headline(findings: dict[int, list[Finding]]) -> Headline:
    """No phase of work to tie a bound to (no engine attached, no labels): what the GPUs did anyway.

    The busiest unlabelled stretch is summed up by the share of each bound, so a GPU-only recording
    of a link held at its ceiling does not read as "nothing in flight".
    """
    seen = [f for fs in findings.values() for f in fs if f.phase == "unlabelled"]
    busy = [(f, f.duration_s * (1.0 - f.shares.get("idle", 0.0))) for f in seen]
    busy = [(f, b) for f, b in busy if b >= UNLABELLED_BUSY_MIN_S]
    if not busy:
        return headline(None, False)
    f, _ = max(busy, key=lambda fb: (fb[1], -fb[0].gpu))
    order = sorted(f.shares, key=lambda b: -f.shares[b])
    bound = next(b for b in order if b != "idle")
    parts = [f"{BOUND_WORDS[b]} {_pct(f.shares[b])}" for b in order if f.shares[b] >= 0.01]
    where = f"GPU {f.gpu}" if len(findings) > 1 else "the GPU"
    line1 = f"No phases to tie it to (no engine, no labels): over {f.duration_s:.1f} s {where} was {', '.join(parts)}."
    line2 = "Attach to the engine (--pid or --url) to see which phase held it; the detail below has rates and ceilings."
    return Headline(f"{line1}\n{line2}", "unlabelled", bound, f.gpu, f.shares[bound], finding=f)


def engine_only_headline(engine: dict[str, Any], why: str | None) -> Headline:
    """A recording with no GPU readings (the engine alone): what ran, and that what held it is unknown.

    ``engine`` is the report's engine object (its ``phases`` with ``time_s`` and ``share``).
    """
    phases = engine.get("phases") or {}
    work = sorted(
        ((p, v) for p, v in phases.items() if p in ENGINE_PHASES and v.get("time_s", 0.0) > 0),
        key=lambda kv: -kv[1]["time_s"],
    )
    if not work:
        return headline(None, False)
    ran = ", ".join(
        f"{p} {v['time_s']:.1f} s" + (f" ({_pct(v['share'])} of the session)" if i == 0 and v.get("share") else "")
        for i, (p, v) in enumerate(work)
    )
    because = f" ({why})" if why else ""
    them = "them" if len(work) > 1 else "it"
    text = (
        f"{ran}: no GPU readings in this recording{because}, so what held {them} back is unknown.\n"
        "Record on the machine with the GPUs (NVML) to see whether the link, memory or compute held each phase."
    )
    return Headline(text, work[0][0], "unknown", None, None)


def finding_lines(findings: dict[str, list[dict[str, Any]]]) -> list[str]:
    """ "What held each phase back", one line per phase of work (bound, shares, evidence) with its
    cause, fix and evidence lines indented under it: the lines ``report`` prints and the TUI's
    answer screen shows (``findings``: ``Answer.to_json()["findings"]``). Empty without work."""
    shown = {gpu: [f for f in fs if f["phase"] not in NOT_WORK] for gpu, fs in findings.items()}
    lines: list[str] = []
    for gpu, fs in shown.items():
        for f in fs:
            others = ", ".join(
                f"{BOUND_WORDS[b]} {units.pct(v)}" for b, v in f["shares"].items() if b != f["bound"] and v >= 0.05
            )
            who = f"GPU {gpu} " if len(findings) > 1 else ""
            if f.get("too_short"):
                lines.append(f"  {who}{f['phase']} {f['duration_s']:.1f} s: {f['evidence']}")
                continue
            lines.append(
                f"  {who}{f['phase']} {f['duration_s']:.1f} s: {BOUND_WORDS[f['bound']]} "
                + units.pct(f["shares"][f["bound"]])
                + (f" ({others})" if others else "")
                + f"; {f['evidence']}"
            )
            for a in f.get("advice") or ():
                lines.append(f"      cause: {a['cause']}")
                if a.get("fix"):
                    lines.append(f"      fix: {a['fix']}")
                lines += [f"      evidence: {ev}" for ev in a.get("evidence") or ()]
    return lines
