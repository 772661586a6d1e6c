"""``pcie-tui export --prometheus``: the one analysis as Prometheus metrics."""
