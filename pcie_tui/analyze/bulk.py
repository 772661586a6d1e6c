"""Whole-recording analysis in bulk: the same result as feeding a SessionAnalyzer tick by tick.

:func:`analyze_rows` takes a recording's raw tick dicts (as :func:`pcie_tui.record.reader.read_rows`
returns them), lays each GPU's readings out as numpy columns, computes utilisation for every tick at
once (the rules of :func:`pcie_tui.analyze.verdict.utilisation`) and runs the hysteresis automaton of
:class:`pcie_tui.analyze.verdict.GpuVerdictTracker` over runs of ticks instead of ticks. The analyzer
it returns holds the same ``series``, ``events``, ``t0``/``t_last``/``n`` and final tracker verdicts
as ``analyze(header, samples)``; tests/test_bulk.py checks that property on random recordings.

It is a finished analyzer: feeding it more ticks afterwards is not supported (the trackers' internal
hysteresis state is not restored). Anything the vectorised path cannot mirror exactly (ticks out of
time order, odd value types) falls back to the streaming analyzer.
"""

from __future__ import annotations

import gc
from collections.abc import Sequence
from itertools import chain
from operator import itemgetter
from typing import Any

import numpy as np

from pcie_tui.analyze.bulk_events import BUS as _BUS
from pcie_tui.analyze.bulk_events import DIR as _DIR
from pcie_tui.analyze.bulk_events import events as _events
from pcie_tui.analyze.session import SessionAnalyzer, _GpuSeries, analyze
from pcie_tui.analyze.verdict import (
    DEFAULT_THRESHOLDS,
    RESOURCES,
    Event,
    GpuVerdictTracker,
    Thresholds,
    Utilisation,
)
from pcie_tui.model import GpuInfo, Sample, SessionHeader, pcie_capacity_Bps
from pcie_tui.record.validate import cached_columns

_VERDICT_NAMES = np.array(["link", "memory", "compute", "none"], dtype=object)
_F = np.float64


class _Fallback(Exception):
    """The vectorised path cannot mirror the streaming analyzer for this input."""


def tick_phase(d: dict[str, Any]) -> Any:
    """:func:`pcie_tui.analyze.session.sample_phase` on a raw tick dict."""
    eng = d.get("engine")
    if isinstance(eng, dict):
        p = eng.get("phase")
        if p:
            return p
    label = d.get("label")
    return label if isinstance(label, str) else None


def analyze_rows(
    header: SessionHeader, rows: Sequence[dict[str, Any]], thresholds: Thresholds = DEFAULT_THRESHOLDS
) -> SessionAnalyzer:
    """A finished SessionAnalyzer over raw tick dicts, equal to streaming ``Sample.from_json`` rows through it.

    ``rows`` must be well-formed ticks (``read_rows`` drops the others): a number ``t``, and ``gpus`` a
    list of dicts with an integer ``index``.
    """
    was = gc.isenabled()
    gc.disable()  # the columns build ~10 objects per GPU-sample; GC would rescan the rows each time
    try:
        return _analyze(header, rows, thresholds)
    except (_Fallback, TypeError, ValueError, OverflowError):
        return analyze(header, [Sample.from_json(d) for d in rows], thresholds)
    finally:
        if was:
            gc.enable()


_READINGS = ("pcie_rx_Bps", "pcie_tx_Bps", "nvlink_rx_Bps", "nvlink_tx_Bps", "dram_bw_util", "mem_busy", "sm_util")


_LINK = ("link_gen", "link_width")  # only written when known


def _columns(flat: list[dict[str, Any]], keys: tuple[str, ...]) -> np.ndarray:
    """keys x GPU-samples as floats, None -> NaN. One C-level sweep when every key is present."""
    done = cached_columns(flat, keys)  # the reader's validation built these already
    if done is not None:
        return done
    try:
        rows = list(map(itemgetter(*keys), flat))
    except KeyError:
        try:
            rows = list(map(itemgetter(*keys[:-2]), flat))
            rows = [(*r, g.get(keys[-2]), g.get(keys[-1])) for r, g in zip(rows, flat, strict=True)]
        except KeyError:
            rows = [tuple(g.get(k) for k in keys) for g in flat]
    a = np.array(rows, dtype=_F)
    if a.shape != (len(flat), len(keys)):
        raise _Fallback("readings of unexpected shape")
    return a.T


def _analyze(header: SessionHeader, rows: Sequence[dict[str, Any]], th: Thresholds) -> SessionAnalyzer:
    an = SessionAnalyzer(header, th)
    n = len(rows)
    if n == 0:
        return an
    t_tick = list(map(float, map(itemgetter("t"), rows)))
    an.t0, an.t_last, an.n = t_tick[0], t_tick[-1], n
    glists = [d.get("gpus") or () for d in rows]
    counts = np.fromiter(map(len, glists), dtype=np.int64, count=n)
    flat: list[dict[str, Any]] = list(chain.from_iterable(glists))
    if not flat:
        return an
    tick_of = np.repeat(np.arange(n), counts)
    t_all = np.array(t_tick, dtype=_F)[tick_of]
    phases = [  # tick_phase, inlined
        p
        if isinstance(e := d.get("engine"), dict) and (p := e.get("phase"))
        else (lb if isinstance(lb := d.get("label"), str) else None)
        for d in rows
    ]
    ph_obj = np.empty(n, dtype=object)
    ph_obj[:] = phases
    # Event phase codes in first-appearance order (dict.fromkeys keeps it); falsy phases are not counted.
    ph_names = [p for p in dict.fromkeys(phases) if p]
    lookup = {p: -1 for p in dict.fromkeys(phases) if not p}
    lookup.update((p, i) for i, p in enumerate(ph_names))
    ph_code = np.fromiter(map(lookup.__getitem__, phases), dtype=np.int64, count=n)
    idx = np.fromiter(map(int, map(itemgetter("index"), flat)), dtype=np.int64, count=len(flat))
    keys = _READINGS + _LINK + ("power_W", "mem_used_bytes")
    done = cached_columns(flat, keys)  # the reader's validation built all of them already
    if done is None:
        used = np.array([np.nan if (v := g.get("mem_used_bytes")) is None else v for g in flat], dtype=_F)
        done = np.vstack([_columns(flat, _READINGS + _LINK), np.full(len(flat), np.nan), used])
    cols = dict(zip(keys, done, strict=True))
    uniq, first = np.unique(idx, return_index=True)
    opened: list[tuple[int, int, Event]] = []  # (flat position, resource order, event)
    for gi in uniq[np.argsort(first)].tolist():
        pos = np.flatnonzero(idx == gi)
        t = t_all[pos]
        if t.size > 1 and np.any(t[1:] < t[:-1]):
            raise _Fallback("ticks out of time order")
        info = header.gpu(gi)
        u = _utilisation(info, {k: c[pos] for k, c in cols.items()})
        gph = ph_code[tick_of[pos]]
        active = []
        for ri, r in enumerate(RESOURCES):
            val = u["link"] if r == "link" else u["memory"] if r == "memory" else u["compute"]
            act = np.zeros(pos.size, dtype=bool)
            for ev, j in _events(gi, r, val, t, u, gph, ph_names, th, act, an.t_last):
                opened.append((int(pos[j]), ri, ev))
            active.append(act)
        vcode = np.where(active[0], 0, np.where(active[1], 1, np.where(active[2], 2, 3)))
        tr = GpuVerdictTracker(info, gi, th)
        tr.verdict = str(_VERDICT_NAMES[vcode[-1]])
        tr.last_util = _last_util(u)
        an.trackers[gi] = tr
        ser = an.series[gi] = _GpuSeries()
        ser.t = t.tolist()
        ser.verdict = _VERDICT_NAMES[vcode].tolist()
        ser.link = _nullable(u["link"])
        ser.link_Bps = _nullable(u["link_Bps"])
        ser.memory = _nullable(u["memory"])
        ser.compute = _nullable(u["compute"])
        ser.phase = ph_obj[tick_of[pos]].tolist()
        ser.mem_used = _nullable(cols["mem_used_bytes"][pos])
        ser.memory_proxy = bool(u["proxy"].any())
        ser.__dict__["_arrays"] = {k: u[k] for k in ("link", "link_Bps", "memory", "compute")}  # for summary()
        ser.__dict__["_arrays"]["mem_used"] = cols["mem_used_bytes"][pos]
    opened.sort(key=lambda x: (x[0], x[1]))
    an.events = [e for _p, _r, e in opened]
    return an


def _nullable(a: np.ndarray) -> list[float | None]:
    nan = np.isnan(a)
    if not nan.any():
        return a.tolist()  # type: ignore[no-any-return]
    o = a.astype(object)
    o[nan] = None
    return o.tolist()  # type: ignore[no-any-return]


def _capacity(gen: np.ndarray, width: np.ndarray) -> np.ndarray:
    """pcie_capacity_Bps per tick (NaN where unknown), evaluated once per distinct gen x width."""
    out = np.full(gen.size, np.nan)
    both = ~np.isnan(gen) & ~np.isnan(width)
    if both.any():
        gens, gi = np.unique(gen[both], return_inverse=True)
        widths, wi = np.unique(width[both], return_inverse=True)
        table = np.full((gens.size, widths.size), np.nan)
        for i, g in enumerate(gens.tolist()):
            for j, w in enumerate(widths.tolist()):
                if int(g) != g or int(w) != w:
                    raise _Fallback("non-integer link gen/width")
                c = pcie_capacity_Bps(int(g), int(w))
                table[i, j] = np.nan if c is None else c
        out[both] = table[gi.reshape(-1), wi.reshape(-1)]
    return out


def _utilisation(info: GpuInfo | None, c: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """:func:`pcie_tui.analyze.verdict.utilisation` for every tick of one GPU."""
    size = c["sm_util"].size
    theo = _capacity(c["link_gen"], c["link_width"])
    hdr_cap = info.link.capacity_Bps if info is not None else None
    if hdr_cap is not None:
        theo = np.where(np.isnan(theo), float(hdr_cap), theo)
    measured = info.link.measured_Bps if info is not None else None
    pc = theo
    if measured is not None:
        pc = np.where(np.isnan(theo) | (measured <= theo), float(measured), theo)
    pc_ok = ~np.isnan(pc) & (pc != 0)
    nc = info.nvlink_capacity_Bps if info is not None else None
    link = np.full(size, np.nan)
    link_Bps = np.full(size, np.nan)
    ceiling = np.full(size, np.nan)
    src = np.zeros(size, dtype=np.int8)
    cands: list[tuple[int, np.ndarray, Any, Any]] = [
        (1, c["pcie_rx_Bps"], pc, pc_ok),
        (2, c["pcie_tx_Bps"], pc, pc_ok),
    ]
    if nc:
        cands += [(3, c["nvlink_rx_Bps"], float(nc), True), (4, c["nvlink_tx_Bps"], float(nc), True)]
    with np.errstate(divide="ignore", invalid="ignore"):
        for code, v, cap, ok in cands:
            r = v / cap
            take = ok & ~np.isnan(v) & (np.isnan(link) | (r > link))
            link = np.where(take, r, link)
            link_Bps = np.where(take, v, link_Bps)
            ceiling = np.where(take, cap, ceiling)
            src = np.where(take, np.int8(code), src)
    dram, busy = c["dram_bw_util"], c["mem_busy"]
    gpm = info is not None and info.metrics_source == "gpm"
    use_dram = np.ones(size, dtype=bool) if gpm else ~np.isnan(dram)
    return {
        "link": link,
        "link_Bps": link_Bps,
        "ceiling": ceiling,
        "src": src,
        "memory": np.where(use_dram, dram, busy),
        "proxy": ~use_dram & ~np.isnan(busy),
        "compute": c["sm_util"],
    }


def _last_util(u: dict[str, np.ndarray]) -> Utilisation:
    def f(a: np.ndarray) -> float | None:
        x = float(a[-1])
        return None if x != x else x

    s = int(u["src"][-1])
    return Utilisation(
        f(u["link"]),
        _BUS[s],
        _DIR[s],
        f(u["link_Bps"]),
        f(u["ceiling"]),
        f(u["memory"]),
        bool(u["proxy"][-1]),
        f(u["compute"]),
    )
