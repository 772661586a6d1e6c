"""Plain-text rendering of doctor and calibrate reports (no Textual, no colour required), and their JSON."""

from __future__ import annotations

import json
import sys
from typing import Any

from pcie_tui.core.units import rate

_MARK = {"pass": "PASS", "warn": "WARN", "fail": "FAIL"}


def render_doctor(report: dict[str, Any]) -> str:
    lines = [
        f"pcie-tui doctor on {report['host']}: link state read {report['load']['how']} ({report['load']['detail']})",
        "",
    ]
    for it in report["items"]:
        gpu = it["gpu"]
        who = f"GPU{gpu}" if isinstance(gpu, int) else ("GPU" + "<->GPU".join(map(str, gpu)) if gpu else "host")
        lines.append(f"[{_MARK[it['status']]}] {who:<12} {it['check']:<12} {it['title']}")
        for e in it["evidence"]:
            lines.append(f"        - {e}")
        if it["status"] != "pass" or it["advice"] != "Nothing to do.":
            lines.append(f"        advice: {it['advice']}")
    topo = report["topology"]
    if len(topo["gpus"]) > 1:
        lines += ["", "Topology (like nvidia-smi topo -m):"]
        width = max(6, *(len(c) for row in topo["matrix"] for c in row)) + 1
        lines.append(" " * 8 + "".join(f"{g:<{width}}" for g in topo["gpus"]))
        for g, row in zip(topo["gpus"], topo["matrix"], strict=True):
            lines.append(f"{g:<8}" + "".join(f"{c:<{width}}" for c in row))
        lines.append(
            "  X = self, NV# = # NVLinks, PIX = one switch, PXB = several switches, PHB = via the CPU's "
            "host bridge, NODE = across host bridges in a NUMA node, SYS = across sockets"
        )
    s = report["summary"]
    lines += ["", f"{s['pass']} pass, {s['warn']} warn, {s['fail']} fail"]
    return "\n".join(lines)


def render_calibration(result: dict[str, Any]) -> str:
    where = f"saved to {result['path']}" if result.get("path") else "not saved (--no-save)"
    lines = [f"pcie-tui calibrate ({result['backend']}, {result['size_mib']} MiB copies); {where}"]
    if result.get("baseline"):
        lines.append(
            f"machine fingerprint saved to {result['baseline']} (pcie-tui doctor --since it says what changed)"
        )
    for e in result["gpus"]:
        lines.append(
            f"GPU{e['index']} {e['name']} ({e['uuid']}) link Gen{e['gen']} x{e['width']}, "
            f"theoretical {rate(e['theoretical_Bps'])} per direction"
        )
        for d in ("h2d", "d2h"):
            r = e[d]
            pct = (
                f" = {100 * r['payload_Bps'] / e['theoretical_Bps']:.0f}% of theoretical"
                if e["theoretical_Bps"]
                else ""
            )
            lines.append(
                f"    {d.upper()}: payload {rate(r['payload_Bps'])}{pct}; counter ({r['counter_source'] or 'n/a'}) "
                f"reads {rate(r['counter_Bps'])}"
            )
        for d in ("h2d", "d2h"):
            r = e.get(f"{d}_pageable")
            if r:
                lines.append(
                    f"    {d.upper()} pageable: payload {rate(r['payload_Bps'])}; counter ({r['counter_source'] or 'n/a'}) "
                    f"reads {rate(r['counter_Bps'])}"
                )
        lines.append(
            f"    ceiling stored for the monitor: {rate(e['counter_Bps'])} pinned (what the counter reads at saturation)"
            + (f", {rate(e['pageable_counter_Bps'])} pageable host->device" if e.get("pageable_counter_Bps") else "")
        )
        for peer, bps in (e.get("peers") or {}).items():
            lines.append(f"    -> {peer}: {rate(bps)} device-to-device")
    return "\n".join(lines)


def print_json(obj: Any) -> None:
    from pcie_tui.recording.validate import finite_json

    # RFC 8259: no NaN/Infinity (they become null).
    plain = json.loads(json.dumps(obj, default=_json_default))
    json.dump(finite_json(plain), sys.stdout, indent=1, allow_nan=False)
    sys.stdout.write("\n")


def _json_default(o: Any) -> Any:
    if isinstance(o, set):
        return sorted(o)
    return str(o)
