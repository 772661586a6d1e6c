"""doctor / calibrate flags are checked by argparse before anything touches NVML."""

from __future__ import annotations

import pytest

import pcie_tui.doctor.nvmlfacts as nvmlfacts
import pcie_tui.doctor.run as run


@pytest.fixture
def no_nvml(monkeypatch):
    def boom(*a, **k):
        raise AssertionError("NVML was reached before the flags were checked")

    monkeypatch.setattr(run, "run_doctor", boom)
    monkeypatch.setattr(nvmlfacts, "open_nvml", boom)


@pytest.mark.parametrize(
    "argv",
    [
        ["doctor", "--pid", "-1"],
        ["doctor", "--pid", "0"],
        ["doctor", "--pid", "x"],
        ["doctor", "--load-s", "-2"],
        ["calibrate", "--gpu", "-1"],
        ["calibrate", "--size-mib", "0"],
        ["calibrate", "--seconds", "-1"],
    ],
)
@pytest.mark.parametrize("entry", ["pcie-tui", "python -m pcie_tui.doctor"])
def test_bad_flags_are_one_line_before_nvml(argv, entry, no_nvml, capsys):
    if entry == "pcie-tui":
        from pcie_tui.cli.main import main
    else:
        from pcie_tui.doctor.__main__ import main
    with pytest.raises(SystemExit) as e:
        main(argv)
    assert e.value.code == 2
    err = capsys.readouterr().err
    assert len(err.strip().splitlines()) == 1 and argv[1] in err and "Traceback" not in err
