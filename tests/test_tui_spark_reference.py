"""The sparklines' cells and runs (pcie_tui/tui/spark.py, made faster for issue 22: every chart and every GPU's
line draws them each frame) are the ones the previous code drew (tests/spark_reference.py): the same peaks,
phases, glyphs and styles, runs cut at the same cells, for any history, with missing readings, phase changes
inside a cell, a history that starts mid-cell or is shorter than the chart."""

from __future__ import annotations

import spark_reference as ref
from hypothesis import given, settings
from hypothesis import strategies as st
from rich.style import Style

from pcie_tui.tui import spark

PHASES = st.sampled_from([None, "idle", "prefill", "decode", "h2d_pinned", "d2d_copy", "gap"])
VALUE = st.one_of(st.none(), st.floats(min_value=-5.0, max_value=250.0, allow_nan=False))
STYLES = (Style(color="#4fc3f7"), Style(color="#ff5252"), Style(color="grey50"))


@st.composite
def histories(draw):
    n = draw(st.integers(0, 80))
    whole = draw(st.booleans())
    values = draw(st.lists(st.floats(0.0, 250.0) if whole else VALUE, min_size=n, max_size=n))
    phases = draw(st.one_of(st.just([]), st.lists(PHASES, min_size=n, max_size=n)))
    if phases and draw(st.booleans()):  # long runs of one phase, as in a real session
        phases = [phases[i // 17 * 17] for i in range(n)]
    return tuple(values), tuple(phases), draw(st.integers(0, 500))


@settings(max_examples=1500, deadline=None)
@given(histories(), st.integers(0, 40), st.integers(1, 7))
def test_buckets_are_the_reference(h, width, per_cell):
    values, phases, start = h
    assert spark.buckets(values, phases, start, width, per_cell) == ref.buckets(values, phases, start, width, per_cell)


@settings(max_examples=1500, deadline=None)
@given(
    histories(),
    st.integers(1, 40),
    st.integers(1, 4),
    st.one_of(st.none(), st.just(0.0), st.floats(0.5, 300.0)),
    st.integers(1, 120),
    st.one_of(st.none(), st.floats(0.0, 1.0)),
)
def test_runs_are_the_reference(h, width, height, scale, history_ticks, hot_at):
    values, phases, start = h
    args = (values, phases, start, width, height, scale, history_ticks, *STYLES, hot_at)
    mine, theirs = spark.runs(*args), ref.runs(*args)
    assert mine == theirs
    for row_a, row_b in zip(mine, theirs, strict=True):  # cut at the same cells
        assert [len(t) for t, _ in row_a] == [len(t) for t, _ in row_b]
