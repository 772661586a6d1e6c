"""The what-if is self-consistent on every bundled demo (issue 21): each lever only where it applies,
predictions monotone in link speed, none better than no link time at all, one ceiling named."""

from __future__ import annotations

import pytest

from pcie_tui.recording import demos
from pcie_tui.recording.reader import read_recording
from pcie_tui.report.text import build_report


def _names() -> list[str]:
    from pathlib import Path

    return sorted(p.name.removesuffix(".jsonl.gz") for p in Path(demos.data_dir()).glob("*.jsonl.gz"))


@pytest.fixture(scope="module", params=_names())
def rep(request):
    r, _ = build_report(read_recording(demos.resolve(request.param)))
    return r


def test_faster_link_never_slower_and_nothing_beats_no_link_time(rep):
    for g in rep["whatif"]["gpus"]:
        links = sorted((s for s in g["scenarios"] if s["kind"] == "link"), key=lambda s: -s["bandwidth_ratio"])
        inf = next(s for s in g["scenarios"] if s["kind"] == "infinite")
        for ph, p in g["phases"].items():
            if p["link_busy_share"] is None:
                continue
            times = [s["phases"][ph]["time_ratio"] for s in links if s["phases"].get(ph)]
            # More bandwidth, never more time; today (ratio 1) lies between the faster and the slower links.
            assert times == sorted(times), (ph, times)
            faster = [s["phases"][ph]["time_ratio"] for s in links if s["bandwidth_ratio"] > 1 and s["phases"].get(ph)]
            slower = [s["phases"][ph]["time_ratio"] for s in links if s["bandwidth_ratio"] < 1 and s["phases"].get(ph)]
            assert all(t <= 1 + 1e-9 for t in faster) and all(t >= 1 - 1e-9 for t in slower), ph
            floor = inf["phases"][ph]["time_ratio"] if inf["phases"].get(ph) else None
            assert floor is not None and all(t >= floor - 1e-9 for t in times), (ph, floor, times)
            pinned = next((s for s in g["scenarios"] if s["kind"] == "pinned"), None)
            if pinned and pinned["phases"].get(ph):
                assert pinned["phases"][ph]["time_ratio"] <= 1 + 1e-9


def test_one_ceiling_named(rep):
    for g, wg in zip(rep["gpus"], rep["whatif"]["gpus"], strict=True):
        names = {p["basis"] for p in wg["phases"].values()}
        assert names == {f"{g['ceiling']['detail']} ceiling"}, names
        for f in rep["attribution"]["findings"].get(str(g["index"]), []):
            assert f["ceilings"]["pinned_Bps"] == pytest.approx(g["ceiling"]["Bps"])


def test_pinned_instead_of_pageable_only_for_staged_copies(rep):
    findings = {f["phase"]: f for fs in rep["attribution"]["findings"].values() for f in fs}
    for g in rep["whatif"]["gpus"]:
        pinned = next((s for s in g["scenarios"] if s["kind"] == "pinned"), None)
        if pinned is None:
            continue
        for ph, v in pinned["phases"].items():
            if v is not None and v["time_ratio"] < 1 - 1e-9:
                assert findings[ph]["transfer_staged"], ph


def test_a_pinned_copy_at_half_duty_is_not_called_pageable():
    """h200-reference's h2d_half_duty: pinned cudaMemcpy at half duty, 28.8 GB/s, four times what pageable
    copies reach on the H200: not staged, so no "pinned instead of pageable" and no pageable wording."""
    r, _ = build_report(read_recording(demos.resolve("h200-reference")))
    f = next(f for f in r["attribution"]["findings"]["0"] if f["phase"] == "h2d_half_duty")
    assert f["bound"] == "transfer" and not f["transfer_staged"] and "whatif_pinned" not in f
    pageable = next(f for f in r["attribution"]["findings"]["0"] if f["phase"] == "h2d_pageable")
    assert pageable["transfer_staged"]
    pinned = next(s for s in r["whatif"]["gpus"][0]["scenarios"] if s["kind"] == "pinned")
    assert (pinned["phases"].get("h2d_half_duty") or {}).get("time_ratio", 1.0) == pytest.approx(1.0)
    assert (
        "pageable memory" not in r["headline"]["text"] and "pinned, but small or intermittent" in r["headline"]["text"]
    )
