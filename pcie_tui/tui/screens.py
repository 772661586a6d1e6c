"""The "where does this number come from" screen."""

from __future__ import annotations

from collections.abc import Collection, Mapping
from typing import Any

from rich.console import Group
from rich.table import Table
from rich.text import Text
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import VerticalScroll
from textual.screen import ModalScreen
from textual.widgets import Static

from pcie_tui.core.model import SessionHeader
from pcie_tui.tui.sources import FigureSource, engine_kind, engine_sources, figure_sources

FIGURE_WIDTH = 17


def _rows_table(rows: list[FigureSource]) -> Table:
    """Figure name in its own column, so wrapped lines keep their indent."""
    grid = Table.grid(padding=(0, 1), expand=True)
    grid.add_column(width=FIGURE_WIDTH, style="bold", overflow="fold")
    grid.add_column(ratio=1, overflow="fold")
    for row in rows:
        detail = Text(row.source)
        if row.units or row.window:
            detail.append(f"\nunits: {row.units} · window: {row.window}", style="dim")
        grid.add_row(Text(row.figure), detail)
    return grid


def sources_renderable(
    header: SessionHeader,
    engine: Any = None,
    engine_stats: dict[str, Any] | None = None,
    figures: Mapping[int, frozenset[str]] | None = None,
    figures_whole: bool = False,
    engine_figures: Collection[str] | None = None,
) -> Group:
    """Per GPU, each figure: its source, then units and window, indented under it; then the engine's.
    ``figures``: per GPU, the rows the session has a reading of (Frame.figures); the others are named as
    not in it. None: every figure's source is listed. ``engine_figures``: the same for the engine panel's
    figures (Frame.engine_figures), read so far."""
    parts: list[Any] = [
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
        seen = None if figures is None else figures.get(info.index, frozenset())
        parts.append(_rows_table(figure_sources(header, info, seen, figures_whole)))
    kind = engine_kind(engine, header)
    if engine is not None or kind:
        window = (engine_stats or {}).get("window_s")
        parts.append(Text(f"\nEngine panel · {kind or 'engine'}", style="bold underline"))
        parts.append(_rows_table(engine_sources(kind, engine_stats, window, engine_figures)))
    parts.append(Text("\nescape, ? or i: back · up/down: scroll", style="dim"))
    return Group(*parts)


class SourcesScreen(ModalScreen[None]):
    """Lists each figure's NVML call, GPM metric or engine metric, with units and window."""

    BINDINGS = [
        Binding("escape", "dismiss", "back"),
        Binding("question_mark", "dismiss", "back", show=False),
        Binding("i", "dismiss", "back", show=False),
    ]

    def __init__(self, text: Group) -> None:
        """``text``: :func:`sources_renderable` of the session as the frame shown has it."""
        super().__init__(id="sources-screen")
        self.text = text

    def compose(self) -> ComposeResult:
        with VerticalScroll(id="sources-body"):
            yield Static(self.text, id="sources-text")


def answer_renderable(frame: Any) -> Group:
    """The one analysis' findings, the lines ``report`` prints, under the headline."""
    final = bool(frame is not None and frame.answer_final)
    title = "What held each phase back" + ("" if final else " (so far)")
    parts: list[Any] = [Text(title, style="bold")]
    if frame is not None and frame.headline:
        parts.append(Text(frame.headline, style="bold"))
    lines = frame.findings if frame is not None else ()
    if lines:
        parts += [Text(ln) for ln in lines]
    else:
        parts.append(Text("No phase of work yet: nothing to attribute."))
    note = (
        "the same as `pcie-tui report` prints for this recording"
        if final
        else "medians over every tick of each phase so far; at the end of the source it is what `pcie-tui report` prints"
    )
    parts.append(Text(f"\n{note}\nescape or a: back · up/down: scroll", style="dim"))
    return Group(*parts)


class AnswerScreen(ModalScreen[None]):
    """Every finding of the one analysis: per GPU and phase the bound, shares, evidence, cause and fix."""

    BINDINGS = [Binding("escape", "dismiss", "back"), Binding("a", "dismiss", "back", show=False)]

    def __init__(self, frame: Any) -> None:
        super().__init__(id="answer-screen")
        self.frame = frame

    def compose(self) -> ComposeResult:
        with VerticalScroll(id="answer-body"):
            yield Static(answer_renderable(self.frame), id="answer-text")
