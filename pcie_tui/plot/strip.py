"""The plot's strip: one label per tick (what bound it), and its colours. No matplotlib here."""

from __future__ import annotations

import numpy as np

from pcie_tui.analyze.session import SessionAnalyzer

# Strip colours by label: the attribution's bounds (what the plot draws), and the saturation verdict's
# "none" for verdict_strip.
STRIP_COLOURS = {
    "link": "#c0392b",
    "transfer": "#e67e22",
    "host": "#17becf",
    "memory": "#2ca02c",
    "compute": "#8e44ad",
    "idle": "#f2f2f2",
    "none": "#dcdcdc",
    "unknown": "#ffffff",
}


def strip_colour(label: str) -> str:
    return STRIP_COLOURS.get(label, "#7f7f7f")


def verdict_strip(an: SessionAnalyzer, index: int) -> tuple[list[float], list[str], list[str]]:
    """Per tick of GPU ``index``: (unix times, saturation verdict, colour), from the analyzer's timeline."""
    ser = an.series.get(index)
    segs = an.timeline(index)
    if ser is None or not segs:
        return [], [], []
    starts = np.array([s["start"] for s in segs])
    which = np.clip(np.searchsorted(starts, np.asarray(ser.t), "right") - 1, 0, len(segs) - 1)
    labels = [segs[i]["saturated"] for i in which.tolist()]
    return list(ser.t), labels, [strip_colour(v) for v in labels]


def attribution_strip(an: SessionAnalyzer, index: int) -> tuple[list[float], list[str], list[str]]:
    """Per tick of GPU ``index``: (unix times, what bound it, colour), from :mod:`pcie_tui.analyze.attribution`."""
    from pcie_tui.analyze.attribution import BOUNDS, tick_bounds
    from pcie_tui.engines import facts_for

    ser = an.series.get(index)
    if ser is None or not ser.t:
        return [], [], []
    labels = [BOUNDS[c] for c in tick_bounds(an, index, facts_for(an.header.engine)).tolist()]
    return list(ser.t), labels, [strip_colour(v) for v in labels]


# The strip's source: what bound each tick (link/transfer/host/memory/compute/idle).
STRIP = attribution_strip
