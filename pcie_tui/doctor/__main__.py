"""``python -m pcie_tui.doctor {doctor,calibrate,linkmodel} ...``: the same subcommands without the main CLI."""

from __future__ import annotations

import argparse
import sys
from typing import NoReturn

from pcie_tui.core.errors import UserError
from pcie_tui.doctor.cli import register


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> NoReturn:
        # One line, like the main CLI, not argparse's usage block.
        self.exit(2, f"{self.prog}: error: {message} (see {self.prog} --help)\n")


def main(argv: list[str] | None = None) -> int:
    ap = _Parser(prog="python -m pcie_tui.doctor")
    sub = ap.add_subparsers(dest="command", required=True)
    register(sub)
    args = ap.parse_args(argv)
    try:
        return int(args.func(args))
    except UserError as e:
        print(f"pcie-tui: {e}", file=sys.stderr)
        return e.exit_code


if __name__ == "__main__":
    sys.exit(main())
