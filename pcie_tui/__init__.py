"""pcie-tui: is the PCIe link, GPU memory or compute the bottleneck of your LLM inference?"""

__version__ = "0.1.0"
