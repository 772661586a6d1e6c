"""The reader's bulk checks (recording/timeline.py, recording/validate.py) agree with a value-by-value check."""

from __future__ import annotations

import numpy as np
import pytest

from pcie_tui.core import metrics
from pcie_tui.recording.timeline import numbers_in_range
from pcie_tui.recording.validate import cached_columns, gpu_columns_ok

CASES = [
    [1.0, None, 2.0],
    [None],
    [],
    [1e18],
    [1e18 * 1.0000001],
    [-0.0],
    [-1e-300],
    [float("nan")],
    [None, float("nan")],
    [1.0, float("nan")],
    [10**18],
    [10**18 + 1],
    [1, None, 2.5],
    [None, -1],
    [float("inf")],
]


@pytest.mark.parametrize("vals", CASES, ids=repr)
def test_engine_numbers_in_range_as_one_by_one(vals: list) -> None:
    nums = [v for v in vals if v is not None]
    one_by_one = all(0 <= v <= 1e18 for v in nums)  # a NaN is out
    assert numbers_in_range(vals, set(map(type, vals))) is one_by_one


@pytest.mark.parametrize("none", [False, True])
def test_gpu_matrix_of_present_fields_reads_every_number(none: bool) -> None:
    """Dicts holding some of the table's fields (the usual recording): ints, floats and (maybe) None
    come out as np.array reads them, the fields left out NaN."""
    keys = metrics.names()
    present = [k for k in keys if k in ("sm_util", "mem_used_bytes", "pcie_tx_Bps")]
    assert len(present) >= 2
    flat = [
        {"index": 0, **{k: float((i + j) % 2) if j % 2 else (i + j) % 2 for j, k in enumerate(present)}}
        for i in range(50)
    ]
    if none:
        flat[3][present[0]] = None
    assert gpu_columns_ok(flat)
    got = cached_columns(flat, keys)
    assert got is not None
    want = np.full((len(keys), len(flat)), np.nan)
    for k in present:
        want[keys.index(k)] = np.array([d[k] for d in flat], dtype=np.float64)
    np.testing.assert_array_equal(got, want)


def test_up_readings_as_up_fields() -> None:
    """from_rows' engine readings of a block whose "up" the check swept: what engine_bytes.up_fields gives."""
    from pcie_tui.analyze.columns import up_readings
    from pcie_tui.analyze.engine_bytes import up_fields

    engines = [{"up": i % 3 != 0, "kind": "x"} for i in range(10)]
    ups = [e["up"] for e in engines]
    got = up_readings(engines, ups)
    assert got == up_fields(engines)
    assert all(a is b for a, b in zip(got, up_fields(engines), strict=True))
    assert up_readings([], []) == []
