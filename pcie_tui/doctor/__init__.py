"""``pcie-tui doctor``, ``calibrate`` and ``linkmodel``: topology checks and measured link ceilings."""
