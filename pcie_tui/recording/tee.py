"""A source that also records: every tick it yields, and the events its source drains, go to a writer."""

from __future__ import annotations

from typing import Any

from pcie_tui.core.errors import OutputError


class TeeSource:
    """Wraps a source and writes every tick it yields to a recording."""

    def __init__(self, source: Any, writer: Any) -> None:
        self.source, self.writer = source, writer
        self.header, self.live = source.header, source.live
        self.failed: str | None = None  # why the recording stopped (the watching goes on)

    def read(self) -> Any:
        s = self.source.read()
        if s is not None:
            events: list[dict[str, Any]] = getattr(self.source, "drain_events", list)()
            if self.failed is None:
                try:
                    self.writer.write(s)
                    for ev in events:
                        self.writer.write_event(ev.pop("event", "event"), ev.pop("t", s.t), **ev)
                except OutputError as e:
                    self.failed = str(e)  # the file keeps what came before; the source is still watched
        return s

    def close(self) -> None:
        try:
            self.source.close()
        finally:
            self.writer.close()
