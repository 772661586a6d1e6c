"""A GPU's series kept bounded: the newest ticks exact, older ones summarised (a day-long live session).

A session's per-tick series (:class:`pcie_tui.analyze.series.GpuSeries`) would grow ~70 bytes a tick, 20 MB
in 8 hours at 10 Hz. Once more than :data:`EXACT_TICKS` + :data:`RETIRE_TICKS` ticks of a GPU are exact, the
oldest :data:`RETIRE_TICKS` of them are **retired**: replaced by summary rows, about one for every
:data:`STRATUM` ticks, at the front of the same columns. What each retired tick stood for is kept:

- its verdict (with the backdated event intervals, as the summary shows it) is frozen in the series'
  ``verdict`` column; the verdict segments of the retired ticks are kept whole (``retired_segments``), so
  time in each verdict and the timeline stay exact;
- ticks are grouped by phase, verdict, missing counters, which side of the attribution's busy cuts
  (:data:`pcie_tui.analyze.verdict.GPU_BUSY_SM`, ``GPU_BUSY_DRAM``) their SM and DRAM use fell and which
  side of each of its transfer floors (``rate_cuts``) their link rate fell, so a summary row is bound (host,
  transfer, memory, ...) as each of its ticks was;
- within a group, each column is sorted on its own; its largest value is a row of its own (peaks stay exact),
  the rest is cut into strata of :data:`STRATUM` ticks; a summary row holds each column's middle value of one
  stratum (quantiles), for the :data:`MEANS` columns also the stratum's mean (``rep_means``: means, busy
  shares and bytes moved stay exact), the number of ticks it stands for (``rep_n``) and their seconds
  (``rep_w``, summed over the strata of the link rate).

As the session goes on, summary rows are **merged** so a GPU keeps at most about :data:`MAX_REPS` of them
(:func:`merge`): the rows of one group (phase, verdict, missing counters, the sides of the cuts, read from the
rows themselves) are laid end to end per column, each row as its ticks, and cut again into strata twice as
long; a merged row takes the middle of its stratum, the mean of its ticks (each row's ticks counted at their
row's mean) and their seconds, and the group's largest value per column stays a row of one tick.

Counts, seconds, peaks, means, bound and verdict times stay exact; a median or p95 over retired ticks is the
weighted quantile of the strata's middles: within a stratum's spread of the exact one (docs/architecture.md). A
session shorter than :data:`EXACT_TICKS` + :data:`RETIRE_TICKS` ticks (27 min at 10 Hz) retires nothing and
reads exactly as before.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from pcie_tui.analyze.series import Col, GpuSeries, segments, tick_weights
from pcie_tui.analyze.verdict import GPU_BUSY_DRAM, GPU_BUSY_SM, VERDICTS

EXACT_TICKS = 16_384  # the newest ticks of a GPU kept exact
RETIRE_TICKS = 4_096  # ticks retired at a time
STRATUM = 32  # ticks a summary row stands for, at most
COLUMNS = ("t", "link", "link_Bps", "memory", "compute", "mem_used", "pcie_ceiling")
MEANS = ("link", "link_Bps", "memory", "compute")  # columns whose strata keep their mean too
MAX_REPS = 2_048  # summary rows a GPU keeps at most, about: past it, a group's rows are merged pairwise
MIN_GROUP_ROWS = 64  # a group keeps at least this many rows (its quantiles within 1/64 of its ticks' rank)


def reserve(ser: GpuSeries) -> None:
    """A series that reached :data:`RETIRE_TICKS` ticks gets the room its bound needs at once (exact ticks, summary
    rows, and a block's rows past :data:`MAX_REPS`): from then on it allocates nothing (a live session's steady
    state), its memory resident from here rather than growing as the exact window fills."""
    rows = EXACT_TICKS + RETIRE_TICKS + MAX_REPS + RETIRE_TICKS // 8
    if rows > 1 << 20:  # held to no bound of that size (a test's "retire nothing"): room as it comes
        return
    for k in (*COLUMNS, "missing"):
        getattr(ser, k).reserve(rows)
    ser.phase.codes.reserve(rows)
    ser.verdict.codes.reserve(rows)
    for col in (ser.rep_n, ser.rep_w, *(ser.rep_means.setdefault(k, Col()) for k in MEANS)):
        col.reserve(MAX_REPS + RETIRE_TICKS // 8)


def due(ser: GpuSeries) -> bool:
    """Whether the series has more exact ticks than it keeps."""
    return len(ser.t) - ser.reps >= EXACT_TICKS + RETIRE_TICKS


def retire(ser: GpuSeries, block_codes: np.ndarray, rate_cuts: tuple[float, ...] = ()) -> None:
    """Retire the oldest :data:`RETIRE_TICKS` exact ticks of ``ser``; ``block_codes``: the verdict code of
    each of them (indices into VERDICTS, as the summary labels them); ``rate_cuts``: link rates (B/s) where
    what bound a tick changes (the attribution's transfer floors)."""
    a, b = ser.reps, ser.reps + RETIRE_TICKS
    t = ser.t.array()[a:b]
    _keep_segments(ser, t, block_codes)
    w = tick_weights(t, prev=ser.retired_last_t)
    cols = {k: getattr(ser, k).array()[a:b] for k in COLUMNS}
    phase = ser.phase.codes.array()[a:b].astype(np.int64)
    missing = ser.missing.array()[a:b]
    sm = np.nan_to_num(cols["compute"]) >= GPU_BUSY_SM
    dram = np.nan_to_num(cols["memory"]) >= GPU_BUSY_DRAM
    miss = np.where(np.isnan(missing), -1, missing).astype(np.int64)
    rate = np.nan_to_num(cols["link_Bps"])
    sides = [(rate >= cut).astype(np.int64) for cut in rate_cuts]
    parts = [phase, block_codes.astype(np.int64), miss + 1, sm.astype(np.int64), dram.astype(np.int64), *sides]
    _, group = np.unique(_packed(parts), return_inverse=True)
    group = group.reshape(-1)
    reps = _summarise(group, cols, w)
    rows = _group_rows(group)
    n_rep = reps["n"].size
    first = rows[reps["group"]]
    order = np.argsort(reps["t"], kind="stable")
    for k in COLUMNS:
        getattr(ser, k).replace(a, RETIRE_TICKS, reps[k][order])
    ser.missing.replace(a, RETIRE_TICKS, missing[first][order])
    ser.phase.codes.replace(a, RETIRE_TICKS, ser.phase.codes.array()[a:b][first][order])
    ser.verdict.codes.replace(a, RETIRE_TICKS, block_codes[first][order].astype(ser.verdict.codes.array().dtype))
    for k in MEANS:
        ser.rep_means.setdefault(k, Col()).extend(reps["mean_" + k][order])
    ser.rep_n.extend(reps["n"][order])
    ser.rep_w.extend(reps["w"][order])
    ser.reps += n_rep
    ser.retired_last_t = float(t[-1])


def crowded(ser: GpuSeries) -> bool:
    """Whether the series holds more summary rows than it keeps (:func:`merge` them)."""
    return ser.reps > MAX_REPS


def merge(ser: GpuSeries, rate_cuts: tuple[float, ...] = ()) -> None:
    """Once a GPU holds more than :data:`MAX_REPS` summary rows: each group's rows (more than
    :data:`MIN_GROUP_ROWS` of them) cut again into strata twice as long (module doc)."""
    r = ser.reps
    cols = {k: getattr(ser, k).array()[:r] for k in COLUMNS}
    n = np.rint(ser.rep_n.array()[:r]).astype(np.int64)
    missing = ser.missing.array()[:r]
    phase = ser.phase.codes.array()[:r].astype(np.int64)
    verdict = ser.verdict.codes.array()[:r].astype(np.int64)
    sm = np.nan_to_num(cols["compute"]) >= GPU_BUSY_SM
    dram = np.nan_to_num(cols["memory"]) >= GPU_BUSY_DRAM
    miss = np.where(np.isnan(missing), -1, missing).astype(np.int64) + 1
    sides = [(np.nan_to_num(cols["link_Bps"]) >= cut).astype(np.int64) for cut in rate_cuts]
    _, group = np.unique(_packed([phase, verdict, miss, sm.astype(np.int64), dram.astype(np.int64), *sides]),
                         return_inverse=True)  # fmt: skip
    group = group.reshape(-1)
    parts: list[dict[str, np.ndarray]] = []
    for g in range(int(group.max(initial=-1)) + 1):
        idx = np.flatnonzero(group == g)
        rows = {"at": idx, "n": n[idx].astype(np.float64), "w": ser.rep_w.array()[idx]}
        rows.update({k: v[idx] for k, v in cols.items()})
        rows.update({"mean_" + k: ser.rep_means[k].array()[idx] for k in MEANS})
        parts.append(_restrata(rows) if idx.size > MIN_GROUP_ROWS else rows)
    out = {k: np.concatenate([p[k] for p in parts]) for k in parts[0]}
    order = np.argsort(out["t"], kind="stable")
    first = out["at"][order]  # a row of each new one's group: its phase, verdict and missing counters
    m = order.size
    for k in COLUMNS:
        getattr(ser, k).replace(0, r, out[k][order])
    ser.missing.replace(0, r, missing[first])
    ser.phase.codes.replace(0, r, ser.phase.codes.array()[:r][first])
    ser.verdict.codes.replace(0, r, ser.verdict.codes.array()[:r][first])
    for k in MEANS:
        ser.rep_means[k].replace(0, r, out["mean_" + k][order])
    ser.rep_n.replace(0, r, out["n"][order])
    ser.rep_w.replace(0, r, out["w"][order])
    ser.reps = m


def _restrata(rows: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """One group's summary rows as about half as many: per column, the rows sorted by value and laid end to
    end, each as its ticks; the first ``N - 1`` tick positions cut into strata of ``S``, the last (the
    largest value) a row of its own. A stratum's value is the one at its middle position; its mean and
    seconds are those of the positions it covers, each tick carrying its row's mean (and seconds) so sums
    over the group stay what they were."""
    c = rows["n"].astype(np.int64)
    total = int(c.sum())
    keep = max(MIN_GROUP_ROWS, -(-c.size // 2))
    size = max(1, -(-(total - 1) // (keep - 1)))
    bounds = np.minimum(np.arange(0, total - 1 + size, size), total - 1)
    bounds = np.unique(np.append(bounds, total - 1))
    lo, hi = bounds[:-1], bounds[1:]
    out: dict[str, np.ndarray] = {"n": np.append(hi - lo, 1).astype(np.float64)}
    mid = (lo + hi - 1) // 2
    for k in COLUMNS:
        v = rows[k]
        order = np.lexsort((-c, v))  # by value (NaN last), a row of one tick last among equals
        pos = np.concatenate([[0], np.cumsum(c[order])])
        sv = v[order]
        at = np.searchsorted(pos, mid, "right") - 1
        fin = sv[np.isfinite(sv)]
        top = float(fin[-1]) if fin.size else np.nan
        out[k] = np.append(sv[at], top)
        if k in MEANS:
            out["mean_" + k] = _spread(rows["mean_" + k][order], c[order], pos, bounds, top)
        if k == "link_Bps":
            mass = np.concatenate([[0.0], np.cumsum(rows["w"][order])])
            out["w"] = np.diff(np.interp(np.append(bounds, total), pos, mass))
    out["at"] = np.full(out["n"].size, rows["at"][0])
    return out


def _spread(means: np.ndarray, c: np.ndarray, pos: np.ndarray, bounds: np.ndarray, top: float) -> np.ndarray:
    """Each stratum's mean, its positions carrying their row's mean (NaN where none is finite); the top row's:
    the group's largest value."""
    fin = np.isfinite(means)
    mass = np.concatenate([[0.0], np.cumsum(np.where(fin, means, 0.0) * c)])
    nfin = np.concatenate([[0.0], np.cumsum(np.where(fin, c, 0))])
    s = np.diff(np.interp(bounds, pos, mass))
    k = np.diff(np.interp(bounds, pos, nfin))
    with np.errstate(invalid="ignore", divide="ignore"):
        body = np.where(k > 0, s / np.where(k > 0, k, 1.0), np.nan)
    return np.append(body, top)


def _packed(parts: list[np.ndarray]) -> np.ndarray:
    """Non-negative integer columns as one int64 key per tick (mixed radix: each column's largest value
    + 1), so grouping is a 1-D unique (a unique over rows is several times slower)."""
    key = np.zeros(parts[0].size, dtype=np.int64)
    for p in parts:
        key = key * (int(p.max(initial=0)) + 1) + p
    return key


def _group_rows(group: np.ndarray) -> np.ndarray:
    """Per group, the first row in it."""
    first = np.full(int(group.max()) + 1, -1, dtype=np.int64)
    first[group[::-1]] = np.arange(group.size - 1, -1, -1)
    return first


def _summarise(group: np.ndarray, cols: dict[str, np.ndarray], w: np.ndarray) -> dict[str, np.ndarray]:
    """The summary rows: per group and stratum, each column's middle value; and per group a row of one tick
    with each column's largest value (peaks stay exact, and quantiles are not pulled up by them)."""
    by_group = np.argsort(group, kind="stable")
    sizes = np.bincount(group)
    starts = np.concatenate([[0], np.cumsum(sizes)[:-1]])
    # a group's sorted values but its largest in strata of STRATUM; its largest, a row of its own
    body = -(-(sizes - 1) // STRATUM)
    n_strata = body + 1
    first_rep = np.concatenate([[0], np.cumsum(n_strata)[:-1]])
    # each tick's position in its group, its stratum, and the summary row it falls into
    g = group[by_group]
    pos = np.arange(group.size) - starts[g]
    stratum = np.where(pos == sizes[g] - 1, body[g], pos // STRATUM)
    rep_of = first_rep[g] + stratum
    n_rep = int(n_strata.sum())
    out: dict[str, np.ndarray] = {
        "n": np.bincount(rep_of, minlength=n_rep).astype(np.float64),
        "group": np.repeat(np.arange(sizes.size), n_strata),
    }
    top = first_rep + n_strata - 1  # each group's row of its largest values
    for k, v in cols.items():
        order = np.lexsort((v, group))  # by group, then value (NaN last)
        sv = v[order]
        out[k], out["mean_" + k] = _middles(sv, rep_of, n_rep, (g, starts, top))
        if k == "link_Bps":
            out["w"] = np.bincount(rep_of, weights=w[order], minlength=n_rep)
    return out


def _middles(sv: np.ndarray, rep_of: np.ndarray, n_rep: int, groups: tuple[np.ndarray, ...]) -> np.ndarray:
    """Each summary row's value from its stratum of sorted values ``sv``: the middle one, and the mean of
    its finite ones (NaN where it has none), as two rows of an array; a group's top row, the group's largest
    finite one in both. ``groups``: each position's group, each group's first position and its top row."""
    g, starts, top = groups
    first = np.searchsorted(rep_of, np.arange(n_rep), "left")
    last = np.searchsorted(rep_of, np.arange(n_rep), "right") - 1
    finite = np.isfinite(sv)
    n = np.bincount(rep_of, weights=finite.astype(np.float64), minlength=n_rep)
    total = np.bincount(rep_of, weights=np.where(finite, sv, 0.0), minlength=n_rep)
    with np.errstate(invalid="ignore", divide="ignore"):
        out = np.stack([sv[(first + last) // 2], np.where(n > 0, total / n, np.nan)])
    # NaNs sort last: a group's largest finite value sits at its count of finite values in
    n_fin = np.bincount(g, weights=finite.astype(np.float64), minlength=starts.size).astype(np.int64)
    has = n_fin > 0
    out[:, top] = np.where(has, sv[np.where(has, starts + n_fin - 1, starts)], np.nan)
    return out


def _keep_segments(ser: GpuSeries, t: np.ndarray, codes: np.ndarray) -> None:
    """Append the block's verdict segments to the retired ones (a run that goes on is joined)."""
    segs = segments(t.tolist(), codes)
    start, end, code = ser.retired_segments
    if len(start) and segs:
        first = VERDICTS.index(segs[0]["saturated"])
        if int(code.array()[-1]) == first:
            end.array()[-1] = segs[0]["end"]
            segs = segs[1:]
        else:
            end.array()[-1] = segs[0]["start"]
    start.extend([s["start"] for s in segs])
    end.extend([s["end"] for s in segs])
    code.extend([VERDICTS.index(s["saturated"]) for s in segs])


def retired_segments(ser: GpuSeries) -> list[dict[str, Any]]:
    """The retired ticks' verdict segments, as :func:`~pcie_tui.analyze.series.segments` gives them."""
    start, end, code = (c.array().tolist() for c in ser.retired_segments)
    return [{"start": a, "end": b, "saturated": VERDICTS[c]} for a, b, c in zip(start, end, code, strict=True)]


def joined_segments(ser: GpuSeries, tail: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The retired segments and the exact ticks' ones as one timeline (the run at the seam joined)."""
    kept = retired_segments(ser)
    if not kept:
        return tail
    if not tail:
        return kept
    if kept[-1]["saturated"] == tail[0]["saturated"]:
        kept[-1]["end"] = tail[0]["end"]
        return kept + tail[1:]
    kept[-1]["end"] = tail[0]["start"]
    return kept + tail
