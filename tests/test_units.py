"""One set of units: every rate, size, share, duration and token rate has one format, and a
number never wraps apart from its unit (the report's wrapper and the TUI headline bar)."""

from __future__ import annotations

import io
import re

import pytest
from rich.console import Console

from pcie_tui.core import units
from pcie_tui.recording import demos
from pcie_tui.recording.reader import read_recording
from pcie_tui.report.text import _wrapped, build_report

UNIT_START = re.compile(
    r"(?:" + "|".join(re.escape(u) for u in sorted(units.UNITS, key=len, reverse=True)) + r")(?![\w/])"
)


def test_rate_is_gbs_with_one_decimal_from_1_gbs_and_3_digits_below():
    assert units.rate(None) == "n/a"
    assert units.rate(0) == "0 B/s"  # a zero reading is a reading, with its unit
    assert units.rate(1e9) == "1.0 GB/s"
    assert units.rate(999.5e6) == "1.0 GB/s"  # rounds up to 1.00 GB/s: said in GB/s
    assert units.rate(999.4e6) == "999 MB/s"
    assert units.rate(53.84e9) == "53.8 GB/s" and units.rate(63.015e9) == "63.0 GB/s"
    assert units.rate(249e3) == "249 kB/s" and units.rate(14.3e6) == "14.3 MB/s"
    assert units.rate(5e12) == "5000.0 GB/s"  # an answer's rates stay comparable in GB/s


def test_rate_sig_keeps_3_significant_digits_at_any_size():
    assert units.rate_sig(None) == "n/a" and units.rate_sig(0.0) == "0 B/s"
    assert units.rate_sig(5.163e9) == "5.16 GB/s" and units.rate_sig(58.02e9) == "58.0 GB/s"
    assert units.rate_sig(999.7e6) == "1.00 GB/s"  # not "1000 MB/s"
    assert units.rate_sig(835584.0) == "836 kB/s" and units.rate_sig(4.22e12) == "4.22 TB/s"


def test_sizes():
    assert units.size(None) == "n/a" and units.size(0) == "0 B"
    assert units.size(2_621_440) == "2.62 MB" and units.size(16_400) == "16.4 kB" and units.size(999) == "999 B"
    assert units.gib(None) == "n/a" and units.gib(150754820096) == "140.4 GiB" and units.gib(0) == "0.0 GiB"


def test_percentages_one_function_two_spellings():
    assert units.pct(None) == "n/a" and units.pct(0) == "0 %" and units.pct(0.877) == "88 %"
    assert units.pct(0.877, space=False) == "88%"  # inside a sentence (headline, findings)
    assert units.pct(0.1234, space=False, digits=1) == "12.3%" and units.pct(1.0) == "100 %"


def test_durations_and_token_rates():
    assert units.seconds(None) == units.duration(None) == units.tokens_per_s(None) == "n/a"
    assert units.seconds(0.0921) == "92 ms" and units.seconds(0.0052) == "5.2 ms" and units.seconds(2.34) == "2.34 s"
    assert units.seconds(0) == "0.0 ms" and units.duration(18.64) == "18.6 s"
    assert units.tokens_per_s(11.74) == "11.7 tok/s" and units.tokens_per_s(99.94) == "99.9 tok/s"
    assert units.tokens_per_s(1572.3) == "1572 tok/s" and units.tokens_per_s(0) == "0.0 tok/s"


def test_bind_units_glues_numbers_to_their_units_only():
    text = "link 50.1 GB/s = 83% of 60.2 GB/s, 84 % of 3 steps, 2.8-3.2 s, 16 tokens, 5 Bytes"
    bound = units.bind_units(text)
    assert "50.1\u00a0GB/s" in bound and "84\u00a0%" in bound and "3.2\u00a0s," in bound and "16\u00a0tokens" in bound
    assert "3 steps" in bound and "5 Bytes" in bound and "link 50.1" in bound
    assert units.unbind_units(bound) == text


def _split_pairs(lines: list[str]) -> list[tuple[str, str]]:
    """Consecutive lines where one ends with a bare number and the next starts with a unit."""
    return [
        (a, b)
        for a, b in zip(lines, lines[1:], strict=False)
        if re.search(r"\d$", a.rstrip()) and UNIT_START.match(b.lstrip())
    ]


def _texts() -> list[str]:
    """Headlines and findings of every bundled demo, and a dense synthetic line."""
    out = [
        "prefill (6.5 s): link-saturated 95% of the time: link 50.1 GB/s = 83% of 60.2 GB/s pinned (calibrated); "
        "1 2 3 4 5 6 7 8 9 10 GB/s 11 % 12 s 13 ms 14 tok/s 15 GiB 16 MB 17 W"
    ]
    for path in demos.available().values():
        report, _ = build_report(read_recording(path, warn=False))
        out += report["headline"]["text"].splitlines()
        for fs in report["attribution"]["findings"].values():
            out += [f"  {f['phase']} {f['duration_s']:.1f} s: {f['evidence']}" for f in fs]
    return out


@pytest.fixture(scope="module")
def texts() -> list[str]:
    return _texts()


def test_wrap_never_parts_a_number_from_its_unit(texts):
    for text in texts:
        for width in range(12, 161, 3):
            lines = units.wrap(text, width)
            assert not _split_pairs(lines), (width, text)
            assert "".join(lines).replace(" ", "") == text.replace(" ", "")  # nothing lost, nothing added
            assert all(len(ln) <= width for ln in lines)


def test_report_wrapper_never_parts_a_number_from_its_unit(texts):
    for width in range(30, 161, 7):
        console = Console(width=width, file=io.StringIO(), force_terminal=True, color_system=None)
        for text in texts:
            console.file = io.StringIO()
            _wrapped(console, text)
            lines = console.file.getvalue().splitlines()
            assert not _split_pairs(lines), (width, text, lines)
            assert " ".join(lines).split() == text.split()
            assert "\ue000" not in "".join(lines)


def test_time_axis_marks_are_exact_and_never_repeat():
    """units.ago never rounds (90 s read '-2 min' and 150 s too once), and an axis' labels are distinct and
    ordered from the oldest to now, at any interval and width."""
    import re

    from pcie_tui.core.units import ago
    from pcie_tui.tui.timeline import axis

    assert [ago(s) for s in (45, 60, 90, 150, 3600, 3900, 3930)] == [
        "-45 s", "-1 min", "-1:30 min", "-2:30 min", "-1:00 h", "-1:05 h", "-1:05:30 h",
    ]  # fmt: skip

    def secs(label: str) -> float:
        if label == "now":
            return 0.0
        num, unit = label[1:].split(" ")
        parts = [float(x) for x in num.split(":")]
        if unit == "s":
            return parts[0]
        if unit == "min":
            return parts[0] * 60 + (parts[1] if len(parts) > 1 else 0)
        return parts[0] * 3600 + parts[1] * 60 + (parts[2] if len(parts) > 2 else 0)

    for interval in (0.1, 0.5, 1.0, 2.0, 10.0, 60.0):
        for width in (60, 100, 120, 175):
            labels = re.findall(r"-[\d:.]+ (?:s|min|h)|now", axis(width, 300, 300, interval).plain)
            ages = [secs(x) for x in labels]
            assert len(set(labels)) == len(labels) and ages == sorted(ages, reverse=True), (interval, width, labels)
