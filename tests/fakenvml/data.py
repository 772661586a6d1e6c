"""Capture files for the stand-in pynvml: loading, the replay timeline, GPM answers by window."""

from __future__ import annotations

import bisect
import json
import math
from pathlib import Path
from typing import Any

import pynvml as _real

ROOT = Path(__file__).resolve().parents[2]
CAPTURE = ROOT / "tests" / "fixtures" / "h200-nvml-capture.json"
PROBE = ROOT / "tests" / "fixtures" / "h200-nvml-probe-2026-12-02.json"  # copy of ../shared/data/

NVMLError = _real.NVMLError


def _raise_if_err(v: Any) -> Any:
    """Captured errors are stored as "ret N" (the nvmlReturn code)."""
    if isinstance(v, str) and v.startswith("ret "):
        raise _real.NVMLError(int(v[4:]))
    return v


class ManualClock:
    """A monotonic clock that only moves when told (for deterministic GPM windows)."""

    def __init__(self, t: float = 1000.0) -> None:
        self.t = t

    def __call__(self) -> float:
        return self.t

    def advance(self, dt: float) -> None:
        self.t += dt


class Capture:
    """Replay data for one GPU: static answers, a timeline of per-tick answers, GPM readings.

    ``gpm`` holds every captured GPM answer as {t, phase, window_s, metrics}.
    """

    def __init__(
        self, static: dict[str, Any], ticks: list[dict[str, Any]], gpm: list[dict[str, Any]], meta: dict[str, Any]
    ):
        self.static = static
        self.ticks = ticks
        self.meta = meta
        t0 = float(ticks[0]["t"])
        self.times = [float(t["t"]) - t0 for t in ticks]
        gaps = sorted(b - a for a, b in zip(self.times, self.times[1:], strict=False)) or [0.1]
        self.period = self.times[-1] + gaps[len(gaps) // 2]
        self.gpm = [{**g, "t": float(g["t"]) - t0} for g in gpm]
        self.truth: dict[str, Any] = meta.get("truth", {})

    def index_at(self, t: float) -> int:
        return max(0, bisect.bisect_right(self.times, t % self.period) - 1)

    def tick_at(self, t: float) -> dict[str, Any]:
        return self.ticks[self.index_at(t)]

    def gpm_at(self, t: float, window_s: float) -> dict[str, Any] | None:
        """The captured GPM answer for a window of ``window_s`` ending at ``t``.

        Among readings of the phase running at ``t``: those whose window was within
        15 ms of the asked one (so short windows come back NaN as often as they did
        on the H200), nearest in time; else the nearest window length.
        """
        if not self.gpm:
            return None
        phase = self.tick_at(t)["phase"]
        tt = t % self.period
        cands = [g for g in self.gpm if g["phase"] == phase] or self.gpm
        close = [g for g in cands if abs(g["window_s"] - window_s) <= 0.015]
        if close:
            best = min(close, key=lambda g: abs(g["t"] - tt))
        else:
            best = min(cands, key=lambda g: (abs(g["window_s"] - window_s), abs(g["t"] - tt)))
        return dict(best["metrics"])

    def phase_spans(self) -> dict[str, tuple[float, float]]:
        """Phase -> (first, last) tick time on the replay timeline."""
        out: dict[str, tuple[float, float]] = {}
        for t, tick in zip(self.times, self.ticks, strict=True):
            a, _b = out.get(tick["phase"], (t, t))
            out[tick["phase"]] = (a, t)
        return out


def load_capture(path: str | Path = CAPTURE) -> Capture:
    """A capture written by tests/fakenvml/capture.py."""
    d = json.loads(Path(path).read_text())
    gpm = [{"t": t["t"], "phase": t["phase"], **t["gpm"]} for t in d["ticks"] if "gpm" in t]
    gpm += d.get("gpm_short", [])
    meta = {**d.get("meta", {}), "truth": d.get("truth", {}), "cost": d.get("cost", {})}
    return Capture(d["static"], d["ticks"], gpm, meta)


def probe_path() -> Path:
    return PROBE


def from_probe(path: str | Path | None = None) -> Capture:
    """The shared first probe, mapped onto the capture layout.

    The probe read GPM every ~147 ms but alternated its sample pair so that every
    other reading came back NaN/0: those NaN readings become the short-window
    answers, the finite ones the long-window answers (held until the next one).
    Per-tick memory, power and link were not probed: the static reads stand in.
    """
    d = json.loads(Path(path or probe_path()).read_text())
    st = d["static"]
    idle = st.get("gpm_idle", {})
    static = {
        "count": st["count"],
        "name": st["name"],
        "uuid": st.get("uuid", "GPU-h200-probe"),
        "pci_bus_id": st["pci_bus_id"],
        "curr_gen": st["curr_gen"],
        "curr_width": st["curr_width"],
        "max_gen": st["max_gen"],
        "max_width": st["max_width"],
        "gpu_max_gen": st["gpu_max_gen"],
        "mem": [st["mem"][0], st["mem"][0] - st["mem"][1], st["mem"][1]],
        "gpm_supported": st["gpm_supported"],
        "nvlink_state": [_errstr(st["nvlink0_state"])],
        "nvlink_speed_field": st["fields"].get("NVML_FI_DEV_NVLINK_GET_SPEED", "ret 3"),
        "procs_compute": st.get("procs", []),
        "procs_graphics": [],
        "numa_node": _errstr(st["numa_node"]),
    }
    ticks: list[dict[str, Any]] = []
    gpm: list[dict[str, Any]] = []
    for s in d["samples"]:
        g = s["gpm"]
        dram = g.get("NVML_GPM_METRIC_DRAM_BW_UTIL")
        valid = isinstance(dram, float) and math.isfinite(dram)
        nvl = {k: v for k, v in idle.items() if k.startswith("NVML_GPM_METRIC_NVLINK_TOTAL")}
        # The probe's own cadence for valid readings; its notes put the NaN ones at ~50 ms.
        gpm.append({"t": s["t"], "phase": s["phase"], "window_s": 0.147 if valid else 0.05, "metrics": {**nvl, **g}})
        ticks.append(
            {
                "t": s["t"],
                "phase": s["phase"],
                "util": s["util"],
                "mem": static["mem"],
                "power_mw": st["power_mw"],
                "link": [st["curr_gen"], st["curr_width"]],
                "pcie_kBps": [s["tx"], s["rx"]],
            }
        )
    return Capture(static, ticks, gpm, {"source": str(path or probe_path()), "truth": d.get("results", {})})


def _errstr(v: Any) -> Any:
    """The probe wrote errors as 'ERR NVMLError_NotSupported(3)'."""
    if isinstance(v, str) and v.startswith("ERR") and v.endswith(")"):
        return f"ret {int(v[v.rindex('(') + 1 : -1])}"
    return v


HEAT_DIR = ROOT / "tests" / "fixtures"


class HeatCapture:
    """Clock, temperature, clock-event, power-limit, fan and replay answers of a real GPU under sustained load.

    ``ticks``: [{t (s from the first), temp_C, sm_MHz, mem_MHz, reasons, power_mw, limit_mw, fan_pct, replays}],
    each value in NVML's own unit, an error as "ret N"; ``static``: {sm_max_MHz, mem_max_MHz}. Replayed on its
    own timeline (looping), beside the main capture's traffic.
    """

    def __init__(self, static: dict[str, Any], ticks: list[dict[str, Any]], meta: dict[str, Any]) -> None:
        self.static, self.ticks, self.meta = static, ticks, meta
        self.times = [float(t["t"]) for t in ticks]
        gaps = sorted(b - a for a, b in zip(self.times, self.times[1:], strict=False)) or [0.1]
        self.period = self.times[-1] + gaps[len(gaps) // 2]

    def tick_at(self, t: float) -> dict[str, Any]:
        return self.ticks[max(0, bisect.bisect_right(self.times, t % self.period) - 1)]


def load_heat(path: str | Path) -> HeatCapture:
    d = json.loads(Path(path).read_text())
    return HeatCapture(d["static"], d["ticks"], d.get("meta", {}))


# NVML error strings as pynvml words them -> their return codes (a capture that kept only the text).
_NVML_ERRORS = {"Not Supported": 3, "No permission": 4, "Invalid Argument": 2, "Function Not Found": 13,
                "GPU is lost": 15, "Unknown Error": 999, "Timeout": 10, "Insufficient Size": 7}  # fmt: skip


def _answer(v: Any) -> Any:
    """A captured answer in the heat capture's form: the value, or "ret N" for an error."""
    if isinstance(v, dict) and "error" in v:
        text = str(v["error"])
        return f"ret {next((c for w, c in _NVML_ERRORS.items() if w.lower() in text.lower()), 999)}"
    return v


def heat_from_raw_capture(path: str | Path) -> dict[str, Any]:
    """The heat capture (``load_heat``'s JSON) from scripts/device_session3_nvml.py's JSON lines: header, one
    sample a tick, footer. Values stay NVML's own answers; errors become "ret N"."""
    import gzip

    opener = gzip.open if str(path).endswith(".gz") else open
    with opener(path, "rt") as f:
        rows = [json.loads(line) for line in f if line.strip()]
    head = next(r for r in rows if r.get("kind") == "header")
    foot = next((r for r in rows if r.get("kind") == "footer"), {})
    samples = [r for r in rows if "kind" not in r]
    t0 = samples[0]["t"]
    ticks = [
        {
            "t": round(s["t"] - t0, 4), "phase": s.get("phase"), "temp_C": _answer(s["temp_c"]),
            "sm_MHz": _answer(s["sm_mhz"]), "mem_MHz": _answer(s["mem_mhz"]), "reasons": _answer(s["reasons"]),
            "power_mw": _answer(s["power_mw"]), "limit_mw": _answer(s["enforced_limit_mw"]),
            "fan_pct": _answer(s["fan_pct"]), "replays": _answer(s["replay"]),
            "util": [s["util_gpu"], s["util_mem"]] if isinstance(s.get("util_gpu"), int) else "ret 999",
        }
        for s in samples
    ]  # fmt: skip
    mx = head.get("max_clocks_mhz", {})
    meta = {
        "what": "raw NVML answers at ~10 Hz (scripts/device_session3_nvml.py), converted by fakenvml.heat_from_raw_capture",
        "gpu": head.get("name"), "driver": head.get("driver"), "uuid": head.get("uuid"),
        "power_limit_mw": head.get("power_limit_mw"), "temperature_thresholds_c": head.get("temperature_thresholds_c"),
        "load": foot.get("load_stdout"), "created_unix": head.get("t"),
    }  # fmt: skip
    return {"meta": meta, "static": {"sm_max_MHz": _answer(mx.get("sm")), "mem_max_MHz": _answer(mx.get("mem"))},
            "ticks": ticks}  # fmt: skip
