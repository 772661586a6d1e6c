"""Compare a recorded llama-server case with its clients' own timings (scripts/device_session3.sh's output).

For each request the client saw (NAME.clients.json: send, first token, end), the recording's request whose
first token is nearest: the client's TTFT beside the tool's (queue + slot setup + batch wait + prefill), and the
ticks the recorder labelled idle while that request was outstanding. Then p50/p95 of both sides.

usage: python3 scripts/device_session3_compare.py DIR NAME [NAME ...]
"""

from __future__ import annotations

import itertools
import json
import sys
from pathlib import Path
from typing import Any

from pcie_tui.engines.stats import quantile
from pcie_tui.recording.reader import read_recording
from pcie_tui.report.text import build_report

EDGE_S = 0.15  # a tick this close to a request's send or end may straddle it


def recorded_requests(rec: Any) -> list[dict]:
    seen, out = set(), []
    for s in rec.samples:
        for r in (s.engine.extra.get("requests") or []) if s.engine else []:
            key = (r.get("task"), r.get("t"))
            if key not in seen:
                seen.add(key)
                out.append(r)
    return out


def idle_while_outstanding(rec: Any, clients: list[dict]) -> list[float]:
    """Times of ticks labelled idle while some client request was outstanding (away from its edges)."""
    spans = [(c["t_send"] + EDGE_S, c["t_end"] - EDGE_S) for c in clients]
    return [s.t for s in rec.samples if s.engine and s.engine.phase == "idle" and any(a <= s.t <= b for a, b in spans)]


def _first(r: dict) -> float:
    return float(r.get("t_arrive", 0.0) + (r.get("client_ttft_s") or 0.0))


def pair(clients: list[dict], reqs: list[dict]) -> list[tuple[dict, dict | None]]:
    """Clients and recorded requests paired so that their first tokens differ least in all (exhaustive up to
    8 requests, else in order)."""
    if len(reqs) != len(clients) or len(reqs) > 8:
        ordered = sorted(reqs, key=_first)
        return [(c, ordered[i] if i < len(ordered) else None) for i, c in enumerate(clients)]
    best = min(
        itertools.permutations(reqs),
        key=lambda p: sum(abs(_first(r) - c["t_first"]) for c, r in zip(clients, p, strict=True)),
    )
    return list(zip(clients, best, strict=True))


def compare(run_dir: Path, name: str) -> dict:
    rec = read_recording(run_dir / f"{name}.jsonl.gz")
    clients = json.loads((run_dir / f"{name}.clients.json").read_text())["requests"]
    reqs = recorded_requests(rec)
    rows = []
    for c, r in pair(sorted(clients, key=lambda c: c["t_first"]), reqs):
        parts = {k: r.get(k) for k in ("queue_s", "slot_setup_s", "batch_wait_s", "prompt_s")} if r else {}
        rows.append({"client_ttft_s": c["t_first"] - c["t_send"], "tool_ttft_s": r and r.get("client_ttft_s"),
                     "arrive_minus_send_s": r and r.get("t_arrive", 0.0) - c["t_send"], **parts,
                     "sum_s": sum(v for v in parts.values() if isinstance(v, int | float)) if r else None})  # fmt: skip
    rep, _ = build_report(rec)
    client = sorted(r["client_ttft_s"] for r in rows)
    return {"name": name, "rows": rows, "n_recorded": len(reqs), "report_ttft": rep["engine"]["ttft_s"],
            "client_p50": quantile(client, 0.5), "client_p95": quantile(client, 0.95),
            "idle_ticks_outstanding": idle_while_outstanding(rec, clients), "headline": rep["headline"]["text"]}  # fmt: skip


def main() -> int:
    run_dir = Path(sys.argv[1])
    for name in sys.argv[2:]:
        c = compare(run_dir, name)
        rt = c["report_ttft"]
        print(f"== {name}: {len(c['rows'])} client requests, {c['n_recorded']} recorded")
        print(f"   TTFT p50 client {c['client_p50']:.3f} s report {rt['p50']:.3f} s ({rt['p50'] / c['client_p50'] - 1:+.1%});"
              f" p95 client {c['client_p95']:.3f} s report {rt['p95']:.3f} s ({rt['p95'] / c['client_p95'] - 1:+.1%})")  # fmt: skip
        for r in c["rows"]:
            print("   " + " ".join(f"{k}={v:.3f}" if isinstance(v, float) else f"{k}={v}" for k, v in r.items()))
        print(f"   idle ticks with a request outstanding: {len(c['idle_ticks_outstanding'])}")
        print(f"   headline: {c['headline']}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
