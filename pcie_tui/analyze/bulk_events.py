"""The saturation verdict's hysteresis automaton over runs of ticks (the bulk analyzer's core).

:func:`events` mirrors :class:`pcie_tui.analyze.verdict.GpuVerdictTracker` exactly, one resource
of one GPU at a time, over numpy runs instead of ticks (tests/test_bulk.py checks the property).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from pcie_tui.analyze.verdict import Event, Thresholds

BUS = (None, "pcie", "pcie", "nvlink", "nvlink")  # by link-source code; 0 = no link reading
DIR = (None, "rx", "tx", "rx", "tx")


def _runs(mask: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Starts and ends (inclusive) of the runs of True in ``mask``."""
    d = np.diff(np.concatenate(([0], mask.view(np.int8), [0])))
    return np.flatnonzero(d == 1), np.flatnonzero(d == -1) - 1


def _reach(tk: np.ndarray, starts: np.ndarray, hold: float) -> np.ndarray:
    """Per start s: the first index j >= s with ``tk[j] - tk[s] >= hold`` (len(tk) if none).

    Exactly the streaming test (a float subtraction, monotone in tk[j] for sorted tk): a
    searchsorted estimate, then an exact bisection wherever the estimate is off.
    """
    m = tk.size
    if starts.size == 0:
        return starts
    ts = tk[starts]
    with np.errstate(invalid="ignore", over="ignore"):
        j = np.maximum(np.searchsorted(tk, ts + hold, "left"), starts)
    at = tk[np.minimum(j, m - 1)] - ts >= hold
    before = tk[np.maximum(j - 1, 0)] - ts >= hold
    bad = ~((j == m) | at) | ((j > starts) & before)
    for i in np.flatnonzero(bad).tolist():
        s, t0 = int(starts[i]), tk[starts[i]]
        lo, hi = s, m  # first x in [s, m) with tk[x] - t0 >= hold, else m
        while lo < hi:
            mid = (lo + hi) // 2
            if tk[mid] - t0 >= hold:
                hi = mid
            else:
                lo = mid + 1
        j[i] = lo
    return j


def events(
    gpu: int,
    resource: str,
    val: np.ndarray,
    t: np.ndarray,
    u: dict[str, np.ndarray],
    gph: np.ndarray,
    ph_names: list[Any],
    th: Thresholds,
    act: np.ndarray,
    t_last: float,
) -> list[tuple[Event, int]]:
    """Events of one resource of one GPU, each with the GPU-tick index it opened at; fills ``act``."""
    ki = np.flatnonzero(~np.isnan(val))  # unknown readings hold the state
    if ki.size == 0:
        return []
    v, tk = val[ki], t[ki]
    en: Any
    ex: Any
    if resource == "memory":
        proxy = u["proxy"][ki]
        en = np.where(proxy, th.proxy_memory_enter, th.memory_enter)
        ex = np.where(proxy, th.proxy_memory_exit, th.memory_exit)
    else:
        proxy = np.zeros(ki.size, dtype=bool)
        en, ex = np.float64(th.enter(resource)), np.float64(th.exit(resource))
    above = v >= en
    keep = v >= ex
    hold = th.hold_s
    m = ki.size
    a_st, a_en = _runs(above)
    b_st, b_en = _runs(~keep)
    a_j = _reach(tk, a_st, hold)
    b_c = _reach(tk, b_st, hold)
    ent = a_j <= a_en
    ent_st, ent_j = a_st[ent], a_j[ent]
    cls = b_c <= b_en
    cls_st, cls_c = b_st[cls], b_c[cls]

    def fresh(starts_all: np.ndarray, ends_all: np.ndarray, p: int) -> tuple[int, int]:
        """A run entered part-way at p (its true start is earlier): (reach index, run end)."""
        e = int(ends_all[np.searchsorted(starts_all, p, "right") - 1])
        return int(_reach(tk, np.array([p]), hold)[0]), e

    out: list[tuple[int, int, int | None, int | None]] = []  # (s, j, close c, first below m)
    p = 0
    while p < m:
        # Inactive from p: the next run of >= enter that lasts hold_s.
        s = j = -1
        if above[p] and p > 0 and above[p - 1]:
            jj, e = fresh(a_st, a_en, p)
            if jj <= e:
                s, j = p, jj
            else:
                p = e + 1
        if s < 0:
            k = int(np.searchsorted(ent_st, p, "left"))
            if k == ent_st.size:
                break
            s, j = int(ent_st[k]), int(ent_j[k])
        # Active from j + 1: the next run of < exit that lasts hold_s.
        q = j + 1
        c = mb = -1
        if q < m and not keep[q] and not keep[q - 1]:
            cc, e = fresh(b_st, b_en, q)
            if cc <= e:
                c, mb = cc, q
            else:
                q = e + 1
        if c < 0 and q < m:
            k = int(np.searchsorted(cls_st, q, "left"))
            if k < cls_st.size:
                c, mb = int(cls_c[k]), int(cls_st[k])
        if c < 0:
            last_below = None
            if m - 1 > j and not keep[m - 1]:
                mb = max(int(b_st[np.searchsorted(b_st, m - 1, "right") - 1]), j + 1)
                last_below = mb
            out.append((s, j, None, last_below))
            break
        out.append((s, j, c, mb))
        p = c + 1

    events: list[tuple[Event, int]] = []
    for es, ej, ec, below in out:
        stop = m if ec is None else ec
        act[ki[ej] : (act.size if ec is None else ki[ec])] = True
        tail = np.arange(ej + 1, stop)
        fi = np.concatenate((np.arange(es, ej + 1), tail[keep[ej + 1 : stop]]))
        # A close (or a run below exit left open at the end) ends at the last tick still >= exit.
        end = float(tk[below - 1]) if below is not None else t_last
        ev = Event(gpu, resource, start=float(tk[es]), end=end, proxy=bool(proxy[ej]))
        _fill(ev, v[fi], ki[fi], u, gph, ph_names)
        events.append((ev, int(ki[ej])))
    return events


def _fill(
    ev: Event, vals: np.ndarray, ticks: np.ndarray, u: dict[str, np.ndarray], gph: np.ndarray, names: list[Any]
) -> None:
    """The folds of verdict._fold over an event's ticks, in one go."""
    ev.n = int(vals.size)
    ev.sum_util = float(np.cumsum(vals)[-1])  # sequential, as the streaming += is
    top = float(vals.max())
    if top >= 0.0:
        ev.peak_util = top
        if ev.resource == "link":
            at = int(ticks[np.flatnonzero(vals == top)[-1]])
            sc = int(u["src"][at])
            ev.bus, ev.direction, ev.peak_Bps = BUS[sc], DIR[sc], float(u["link_Bps"][at])
    pc = gph[ticks]
    pc = pc[pc >= 0]
    if pc.size and pc[0] == pc[-1] and (pc == pc[0]).all():
        ev.phases[names[int(pc[0])]] = int(pc.size)
    elif pc.size:
        uq, first, cnt = np.unique(pc, return_index=True, return_counts=True)
        for k in np.argsort(first, kind="stable").tolist():
            ev.phases[names[int(uq[k])]] = int(cnt[k])
    if ev.resource == "link":
        used = np.bincount(u["src"][ticks], minlength=len(DIR))
        ev.directions = {d for x, d in enumerate(DIR) if d and used[x]}
