"""``pcie-tui report``: the one analysis' answer as text or JSON."""
