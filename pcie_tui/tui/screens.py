"""The "where does this number come from" screen."""

from __future__ import annotations

from rich.console import Group
from rich.text import Text
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import VerticalScroll
from textual.screen import ModalScreen
from textual.widgets import Static

from pcie_tui.model import SessionHeader
from pcie_tui.tui.sources import figure_sources


def sources_renderable(header: SessionHeader) -> Group:
    """Per GPU, each figure: its source on one line, units and window indented below."""
    parts: list[Text] = [
        Text("Where each number comes from", style="bold"),
        Text(
            "GB/s = 10^9 bytes/s, GiB = 2^30 bytes. Missing readings show as n/a, never 0. "
            "TX = leaving the GPU, RX = into the GPU.",
            style="dim",
        ),
    ]
    if not header.gpus:
        parts.append(Text("\nThis source describes no GPUs."))
    for info in header.gpus:
        parts.append(
            Text(
                f"\nGPU {info.index} · {info.name} · metrics source: {info.metrics_source or 'not stated'}",
                style="bold underline",
            )
        )
        for row in figure_sources(header, info):
            line = Text()
            line.append(f"{row.figure:<17}", style="bold")
            line.append(row.source)
            line.append(f"\n{'':<17}units: {row.units} · window: {row.window}", style="dim")
            parts.append(line)
    parts.append(Text("\nescape, ? or i: back", style="dim"))
    return Group(*parts)


class SourcesScreen(ModalScreen[None]):
    """Lists each figure's NVML call or GPM metric, units and sampling window."""

    BINDINGS = [
        Binding("escape", "dismiss", "back"),
        Binding("question_mark", "dismiss", "back", show=False),
        Binding("i", "dismiss", "back", show=False),
    ]

    def __init__(self, header: SessionHeader) -> None:
        super().__init__(id="sources-screen")
        self.header = header

    def compose(self) -> ComposeResult:
        with VerticalScroll(id="sources-body"):
            yield Static(sources_renderable(self.header), id="sources-text")
