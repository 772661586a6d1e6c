"""The answer first: what held this run back, in which phase, and what would change it.

Builds on :mod:`pcie_tui.analyze.attribution` (what bound each phase, with evidence) and
:mod:`pcie_tui.engines` (the cause and the fix in the engine's own words). ``report`` prints
the headline before anything else, ``report --json`` carries it as an object, and the TUI shows
the same text above its panels.
"""

from __future__ import annotations

from typing import Any

from pcie_tui.analyze.attribution import BOUND_WORDS, LiveAttribution, phase_findings
from pcie_tui.analyze.phases import fmt_rate
from pcie_tui.analyze.session import SessionAnalyzer
from pcie_tui.engines import EngineFacts, advise, engine_info, facts_for
from pcie_tui.model import SessionHeader

# Phases that are not work: a headline about them answers nothing.
NOT_WORK = ("idle", "down", "unlabelled", "load", "gap")
ENGINE_PHASES = ("prefill", "decode", "mixed")


def _pct(v: float | None) -> str:
    return "n/a" if v is None else f"{v * 100:.0f}%"


def predicted_range(pred: dict[str, Any]) -> str:
    """``2.8-3.2 s``, or one number when hiding the copies would not change it."""
    lo, hi = pred["phase_s_at_best"], pred["phase_s_no_overlap"]
    return f"{lo:.1f} s" if hi - lo < 0.05 else f"{lo:.1f}-{hi:.1f} s"


def over_default_ceiling(f: dict[str, Any]) -> bool:
    """The link ran above an uncalibrated default ceiling: the default is wrong for this link
    (calibrate measures its own), not the link over its capacity."""
    return (f.get("link_of_pinned") or 0.0) > 1.0 and not f["ceilings"]["pinned_source"].startswith("calibrated")


CALIBRATE_HINT = "`pcie-tui calibrate` measures this link's own ceiling"


def evidence_text(f: dict[str, Any], short: bool = False) -> str:
    """The numbers behind one finding, with the ceiling and where it came from (``short``: for one screen row)."""
    c = f["ceilings"]
    b = f["bound"]
    if short:
        stat = "mean" if f.get("stat") == "mean" else ""  # the TUI's running means say so; the report's are medians
        src = "calibrated" if c["pinned_source"].startswith("calibrated") else "default"
        cap = f"{fmt_rate(c['pinned_Bps'])} pinned ({src})"
        if b == "link":
            return f"link {fmt_rate(f.get('link_Bps'))}{' ' + stat if stat else ''} = {_pct(f.get('link_of_pinned'))} of {cap}"
        if b == "transfer":
            gsrc = "calibrated" if c["pageable_source"].startswith("calibrated") else "default"
            if not f.get("transfer_staged", True):
                pageable = ""
            elif gsrc == src:  # one word for both ceilings
                cap = f"{fmt_rate(c['pinned_Bps'])} pinned"
                pageable = f", pageable {fmt_rate(c['pageable_Bps'])} (both {src})"
            else:
                pageable = f", pageable {fmt_rate(c['pageable_Bps'])} ({gsrc})"
            return (
                f"copies {fmt_rate(f.get('link_Bps'))}{' ' + stat if stat else ''} = {_pct(f.get('link_of_pinned'))} of {cap}"
                f"{pageable}; SM {_pct(f.get('sm_util'))}"
            )
        if b == "host":
            return f"SM {_pct(f.get('sm_util'))}, link {fmt_rate(f.get('link_Bps'))}, {_when(f)}"
    # The finding's figures are over the ticks of its bound, not the whole phase (the phase table's).
    rate = f"{fmt_rate(f.get('link_Bps'))} {f.get('stat', 'median')} of those ticks"
    pinned = f"{fmt_rate(c['pinned_Bps'])} {c['pinned_source']} ceiling"
    dram_name = "DRAM busy (proxy)" if f.get("dram_basis") == "proxy" else "DRAM"
    if b == "link":
        note = f" (above that default: {CALIBRATE_HINT})" if over_default_ceiling(f) else ""
        return f"link {rate} = {_pct(f.get('link_of_pinned'))} of the {pinned}{note}"
    if b == "transfer":
        pageable = (
            f", pageable ceiling {fmt_rate(c['pageable_Bps'])} ({c['pageable_source']})"
            if f.get("transfer_staged", True)
            else ""
        )
        return f"host<->GPU {rate} = {_pct(f.get('link_of_pinned'))} of the {pinned}{pageable}; GPU SM {_pct(f.get('sm_util'))}"
    if b == "host":
        return f"GPU SM {_pct(f.get('sm_util'))}, link {rate} {_when(f)}"
    if b == "memory":
        return f"{dram_name} {_pct(f.get('dram_util'))} of peak, SM {_pct(f.get('sm_util'))}"
    if b == "compute":
        return f"SM {_pct(f.get('sm_util'))}, {dram_name} {_pct(f.get('dram_util'))}"
    return f"link {rate}, SM {_pct(f.get('sm_util'))}"


def _when(f: dict[str, Any]) -> str:
    """What "work in flight" rests on for a host-bound finding."""
    if f.get("phase") == "loading":
        return "while the engine loaded"
    return "while requests were in flight" if f.get("work_basis") != "label" else "in a phase labelled as work"


def _pick(findings: dict[int, list[dict[str, Any]]]) -> dict[str, Any] | None:
    """The finding that answers "what held this run back": the longest phase of work (engine phases
    before loading), on the GPU where it lasted longest."""
    work = [f for fs in findings.values() for f in fs if f["phase"] not in NOT_WORK and f["bound"] != "idle"]
    if not work:
        return None
    engine = [f for f in work if f["phase"] in ENGINE_PHASES]
    return max(engine or work, key=lambda f: (f["duration_s"], -f["gpu"]))


def answer(header: SessionHeader, analyzer: SessionAnalyzer, events: Any = ()) -> dict[str, Any]:
    """``{"headline": {...}, "findings": {gpu: [finding + advice]}, "facts": {...}}``; ``events``: the
    recording's, whose ``engine_ready`` facts complete the header's (:func:`engine_info`)."""
    fx: EngineFacts | None = facts_for(engine_info(header.engine, events))
    findings = phase_findings(header, analyzer, fx)
    for fs in findings.values():
        for f in fs:
            f["advice"] = [a.to_json() for a in advise(fx, f)]
    top = _pick(findings)
    head = headline(top, len(findings) > 1) if top is not None else unlabelled_headline(findings)
    head.pop("finding", None)  # the findings below carry it
    return {
        "headline": head,
        "findings": {str(g): fs for g, fs in findings.items()},
        "facts": _facts_json(fx),
    }


def _facts_json(fx: EngineFacts | None) -> dict[str, Any] | None:
    if fx is None:
        return None
    return {
        "kind": fx.kind,
        "host_weights": fx.host_weights,
        "host_pinned": fx.host_pinned,
        "host_memory_why": fx.host_memory_why,
        "kv_on_host": fx.kv_on_host,
        "ubatch": fx.ubatch,
        "tensor_parallel": fx.tensor_parallel,
        "log_evidence": list(fx.log_evidence),
    }


def headline(f: dict[str, Any] | None, several_gpus: bool) -> dict[str, Any]:
    """Two lines at most: what held which phase back with its numbers, then the change that would help."""
    if f is None:
        return {
            "text": "Nothing was in flight: no phase of work to attribute.",
            "phase": None,
            "bound": "idle",
            "gpu": None,
            "share": None,
            "cause": None,
            "fix": None,
            "predicted": None,
        }
    share = f["shares"][f["bound"]]
    where = f" on GPU {f['gpu']}" if several_gpus else ""
    # One screen line where it can be: the evidence in short (the detail below has it in full).
    line1 = (
        f"{f['phase']}{where} ({f['duration_s']:.1f} s): {BOUND_WORDS[f['bound']]} "
        f"{share * 100:.0f}% of the time: {evidence_text(f, short=True)}."
    )
    adv = f["advice"][0] if f.get("advice") else None
    pred = adv.get("predicted") if adv else None
    if adv and adv.get("fix"):
        # The change itself (the fix's first clause), why (the short cause), and what it buys.
        line2 = f"Fix: {adv['fix'].split(': ', 1)[0].split('; ', 1)[0].split(' (', 1)[0]}"
        line2 += f" ({adv.get('short') or adv['cause']})"
        if pred and pred.get("phase_s_at_best"):
            line2 += f": {f['phase']} {pred['phase_s']:.1f} s -> {predicted_range(pred)}"
        line2 += "."
    elif adv:
        line2 = f"Cause: {adv['cause']}."
    elif f["bound"] == "link":
        line2 = "A faster link shortens it, a slower one lengthens it (what-if below)."
        if over_default_ceiling(f):
            line2 = f"{line2[:-1]}; it ran above the default ceiling: {CALIBRATE_HINT}."
    elif f["bound"] == "transfer" and f["phase"] == "loading":
        line2 = (
            "The engine was loading weights: copies ran below the link's capacity, at the pace the host fed them "
            "(file reads, pageable memory); pcie-tui names no fix for a load."
        )
    elif f["bound"] == "transfer":
        which = (
            "nothing pcie-tui read from the engine says which"
            if f.get("work_basis") == "engine"
            else "this recording has no engine facts that say which"
        )
        line2 = (
            "The GPU waited on host<->GPU copies running below the link's capacity (pageable memory, or small or "
            f"intermittent copies); {which}."
        )
    else:
        line2 = "A faster link would not change it much (what-if below)."
    return {
        "finding": f,
        "text": f"{line1}\n{line2}",
        "phase": f["phase"],
        "bound": f["bound"],
        "gpu": f["gpu"],
        "share": share,
        "cause": adv.get("cause") if adv else None,
        "fix": adv.get("fix") if adv else None,
        "predicted": pred,
    }


UNLABELLED_BUSY_MIN_S = 1.0  # less busy time than this in a session without phases reads as nothing in flight


def unlabelled_headline(findings: dict[int, list[dict[str, Any]]]) -> dict[str, Any]:
    """No phase of work to tie a bound to (no engine attached, no labels): what the GPUs did anyway.

    The busiest unlabelled stretch is summed up by the share of each bound, so a GPU-only recording
    of a link held at its ceiling does not read as "nothing in flight".
    """
    seen = [f for fs in findings.values() for f in fs if f["phase"] == "unlabelled"]
    busy = [(f, f["duration_s"] * (1.0 - f["shares"].get("idle", 0.0))) for f in seen]
    busy = [(f, b) for f, b in busy if b >= UNLABELLED_BUSY_MIN_S]
    if not busy:
        return headline(None, False)
    f, _ = max(busy, key=lambda fb: (fb[1], -fb[0]["gpu"]))
    order = sorted(f["shares"], key=lambda b: -f["shares"][b])
    bound = next(b for b in order if b != "idle")
    parts = [f"{BOUND_WORDS[b]} {f['shares'][b] * 100:.0f}%" for b in order if f["shares"][b] >= 0.01]
    where = f"GPU {f['gpu']}" if len(findings) > 1 else "the GPU"
    line1 = (
        f"No phases to tie it to (no engine, no labels): over {f['duration_s']:.1f} s {where} was {', '.join(parts)}."
    )
    line2 = "Attach to the engine (--pid or --url) to see which phase held it; the detail below has rates and ceilings."
    return {
        "finding": f,
        "text": f"{line1}\n{line2}",
        "phase": "unlabelled",
        "bound": bound,
        "gpu": f["gpu"],
        "share": f["shares"][bound],
        "cause": None,
        "fix": None,
        "predicted": None,
    }


def engine_only_headline(engine: dict[str, Any], why: str | None) -> dict[str, Any]:
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
        f"{p} {v['time_s']:.1f} s" + (f" ({v['share'] * 100:.0f}% of the session)" if i == 0 and v.get("share") else "")
        for i, (p, v) in enumerate(work)
    )
    because = f" ({why})" if why else ""
    return {
        "text": f"{ran}: no GPU readings in this recording{because}, so what held {'them' if len(work) > 1 else 'it'} back is unknown.\n"
        "Record on the machine with the GPUs (NVML) to see whether the link, memory or compute held each phase.",
        "phase": work[0][0],
        "bound": "unknown",
        "gpu": None,
        "share": None,
        "cause": None,
        "fix": None,
        "predicted": None,
    }


def live_headline(live: LiveAttribution, phase: str | None) -> dict[str, Any] | None:
    """The headline so far, for the TUI: the current phase when it is work, else the longest work phase."""
    findings = live.findings()
    if not findings:
        return None
    current = {g: [f for f in fs if f["phase"] == phase] for g, fs in findings.items()}
    top = _pick(current) if phase not in NOT_WORK else None
    top = top or _pick(findings)
    if top is None:
        head = unlabelled_headline(findings)
        return head if head["phase"] is not None else None
    top["advice"] = [a.to_json() for a in advise(live.facts, top)]
    return headline(top, len(findings) > 1)
