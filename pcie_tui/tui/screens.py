"""The "where does this number come from" screen."""

from __future__ import annotations

from rich.console import Group
from rich.table import Table
from rich.text import Text
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import VerticalScroll
from textual.screen import ModalScreen
from textual.widgets import Static

from pcie_tui.model import SessionHeader
from pcie_tui.tui.sources import figure_sources


def sources_renderable(header: SessionHeader) -> Group:
    parts: list[Table | Text] = [
        Text("Where each number comes from", style="bold"),
        Text(
            "GB/s = 10^9 bytes/s, GiB = 2^30 bytes. Missing readings show as n/a, never 0. "
            "TX = leaving the GPU, RX = into the GPU.\n",
            style="dim",
        ),
    ]
    if not header.gpus:
        parts.append(Text("This source describes no GPUs."))
    for info in header.gpus:
        table = Table(
            title=f"GPU {info.index} · {info.name} · metrics source: {info.metrics_source or 'not stated'}",
            title_justify="left",
            expand=True,
            show_lines=False,
        )
        table.add_column("figure", no_wrap=True, style="bold")
        table.add_column("source")
        table.add_column("units")
        table.add_column("window")
        for row in figure_sources(header, info):
            table.add_row(row.figure, row.source, row.units, row.window)
        parts.append(table)
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
