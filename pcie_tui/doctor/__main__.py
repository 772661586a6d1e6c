"""``python -m pcie_tui.doctor {doctor,calibrate,linkmodel} ...``: the same subcommands without the main CLI."""

from __future__ import annotations

import argparse
import sys

from pcie_tui.doctor.cli import register
from pcie_tui.errors import UserError


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m pcie_tui.doctor")
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
