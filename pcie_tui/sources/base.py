"""The Source protocol: anything that yields a header and then Samples.

Live collectors and recording replay implement the same interface, so the
TUI, the recorder and the report cannot tell them apart.
"""

from __future__ import annotations

from typing import Protocol, runtime_checkable

from pcie_tui.core.model import Sample, SessionHeader


@runtime_checkable
class Source(Protocol):
    header: SessionHeader
    live: bool

    def read(self) -> Sample | None:
        """Block until the next tick is due and return it; None at the end of the data."""
        ...

    def close(self) -> None: ...
