"""llama-server answers read into numbers: /metrics text and /slots lists (pure functions, no I/O)."""

from __future__ import annotations

from typing import Any

from prometheus_client.parser import text_string_to_metric_families

from pcie_tui.core.model import EngineSample
from pcie_tui.engines.promtext import parse_plain


def parse_metrics(body: bytes) -> dict[str, float] | None:
    """Sample name -> value (unlabelled samples); None if it is not Prometheus text.

    llama-server's /metrics is plain ``name value`` lines, read in one pass; anything
    else goes through prometheus_client's parser, which gives the same numbers.
    """
    out = parse_plain(body)
    if out is None:
        out = {}
        try:
            for fam in text_string_to_metric_families(body.decode("utf-8", "replace")):
                for s in fam.samples:
                    if not s.labels:
                        out[s.name] = float(s.value)
        except (ValueError, TypeError, KeyError, IndexError):
            return None
    return out if any(k.startswith("llamacpp:") for k in out) else None


def slot_numbers(slots: list[Any]) -> list[dict[str, Any]]:
    """Numbers only from /slots (it also returns prompt and generated text, which is dropped)."""
    out = []
    for s in slots:
        if not isinstance(s, dict):
            continue
        nt = s.get("next_token")
        nt0 = nt[0] if isinstance(nt, list) and nt and isinstance(nt[0], dict) else nt if isinstance(nt, dict) else {}
        rec: dict[str, Any] = {"id": s.get("id"), "processing": bool(s.get("is_processing", s.get("state", 0)))}
        if isinstance(s.get("id_task"), int):
            rec["task"] = s["id_task"]  # tells a new request on the slot from the one before
        if isinstance(s.get("n_prompt_tokens_processed"), int):
            rec["n_prompt_processed"] = s["n_prompt_tokens_processed"]
        if isinstance(nt0.get("n_decoded"), int):
            rec["n_decoded"] = nt0["n_decoded"]
        elif isinstance(s.get("n_decoded"), int):
            rec["n_decoded"] = s["n_decoded"]
        out.append(rec)
    return out


def slot_phase(s: EngineSample) -> str | None:
    """prefill / decode / mixed / idle from this scrape's /slots, None when /slots gave nothing.

    llama-server adds a request's generated tokens to its counter only when the request
    ends, so counter deltas cannot see decode while it runs; the slots can: a busy slot
    that has not produced a token yet is in prefill, one that has is decoding.
    """
    if not s.up:
        return None
    p, d = s.extra.get("slots_prefill"), s.extra.get("slots_decode")
    if not isinstance(p, int) or not isinstance(d, int):
        return None
    return busy_phase(p, d)


def busy_phase(prefill: int, decode: int) -> str:
    """mixed / prefill / decode / idle from how many busy slots are in prefill and in decode."""
    return "mixed" if prefill and decode else "prefill" if prefill else "decode" if decode else "idle"
