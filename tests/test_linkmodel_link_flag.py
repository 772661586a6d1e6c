"""``--link GENxWIDTH`` is a real PCIe link: Gen 1 to 6, a width the specification defines; errors name the flag."""

from __future__ import annotations

import pytest
from test_linkmodel_checks import _cli

from pcie_tui.core.errors import UserError
from pcie_tui.doctor.cli import parse_link


@pytest.mark.parametrize(
    "value,words",
    [
        ("5x3", "x3 is not a PCIe link width"),
        ("9x16", "there is no PCIe Gen9"),
        ("0x16", "there is no PCIe Gen0"),
        ("4x0", "x0 is not a PCIe link width"),
        ("x16", "GENxWIDTH"),
        ("4x16x2", "GENxWIDTH"),
    ],
)
def test_bad_link_is_one_line_naming_the_flag(value, words, capsys):
    rc, out, err = _cli(["linkmodel", "--hidden", "64", "--layers", "2", f"--link={value}"], capsys)
    assert rc == 2 and out == ""
    assert len(err.strip().splitlines()) == 1 and "--link" in err and words in err and "Traceback" not in err
    with pytest.raises(UserError, match="^--link .*" + words):
        parse_link(value)  # direct calls (linkmodel_main without argparse) name the flag too


@pytest.mark.parametrize("value,gen,width", [("5x12", 5, 12), ("gen6x32", 6, 32), ("1x1", 1, 1), ("4x16", 4, 16)])
def test_real_links_are_accepted(value, gen, width):
    assert parse_link(value) == (gen, width)


def test_bad_link_is_refused_beside_ceiling_gbps(capsys):
    rc, out, err = _cli(
        ["linkmodel", "--hidden", "64", "--layers", "2", "--link", "5x3", "--ceiling-gbps", "10"], capsys
    )
    assert rc == 2 and out == "" and "--link" in err and "x3 is not a PCIe link width" in err
