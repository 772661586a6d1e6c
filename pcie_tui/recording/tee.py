"""A source that also records: every tick it yields, and the events its source drains, go to a writer."""

from __future__ import annotations

from typing import Any


class TeeSource:
    """Wraps a source and writes every tick it yields to a recording."""

    def __init__(self, source: Any, writer: Any) -> None:
        self.source, self.writer = source, writer
        self.header, self.live = source.header, source.live

    def read(self) -> Any:
        s = self.source.read()
        if s is not None:
            self.writer.write(s)
            for ev in getattr(self.source, "drain_events", list)():
                self.writer.write_event(ev.pop("event", "event"), ev.pop("t", s.t), **ev)
        return s

    def close(self) -> None:
        try:
            self.source.close()
        finally:
            self.writer.close()
