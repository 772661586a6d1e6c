"""Doctor's note on running engines whose pcie-tui support was written from documentation, never tested here."""

from __future__ import annotations

from typing import Any


def add_untested_engine_items(report: dict[str, Any]) -> None:
    """One "engine" item per running engine kind whose registry entry says ``tested = False``."""
    import psutil

    from pcie_tui.engines import registry

    seen: set[str] = set()
    for p in psutil.process_iter(["name", "cmdline"]):
        try:
            hit = registry.for_process(p.info.get("cmdline") or [], p.info.get("name") or "")
        except Exception:  # noqa: BLE001 - a process that vanished or an odd command line: not an engine
            continue
        if hit is None or hit[1] != "root" or hit[0].tested or hit[0].name in seen:
            continue
        e = hit[0]
        seen.add(e.name)
        report["items"].append(
            {
                "check": "engine",
                "gpu": None,
                "status": "pass",
                "title": f"{e.display} (pid {p.pid}): support written from its documentation, "
                "not tested against a real server",
                "evidence": list(e.docs[:2]),
                "advice": f"Cross-check pcie-tui's {e.display} figures with the engine's own tools (docs/engines.md).",
                "data": {"kind": e.name, "pid": p.pid, "tested": False},
            }
        )
        report["summary"]["pass"] += 1
