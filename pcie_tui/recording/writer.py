"""Recording writer: JSON Lines, one tick per line, flushed per line.

A crash or kill loses at most the line being written. ``.gz`` paths are
written as a gzip stream with a sync flush after every line, so even a
killed writer leaves a file whose complete lines all decompress.
"""

from __future__ import annotations

import gzip
import json
import os
import zlib
from pathlib import Path
from typing import IO, Any

from pcie_tui.core.errors import UserError
from pcie_tui.core.model import Sample, SessionHeader


def _dumps(obj: dict[str, Any]) -> str:
    return json.dumps(obj, separators=(",", ":"), allow_nan=False, default=_default)


def _default(o: object) -> object:
    raise TypeError(f"not JSON serialisable: {type(o).__name__}")


def _clean(v: Any) -> Any:
    """NaN/inf cannot be in JSON and never mean a real reading: they become null."""
    if isinstance(v, float) and (v != v or v in (float("inf"), float("-inf"))):
        return None
    if isinstance(v, dict):
        return {k: _clean(x) for k, x in v.items()}
    if isinstance(v, list | tuple):
        return [_clean(x) for x in v]
    return v


class RecordingWriter:
    """Append-only writer. Use as a context manager or call ``close``."""

    def __init__(self, path: str | os.PathLike[str], header: SessionHeader) -> None:
        self.path = Path(path)
        self.lines = 0
        try:
            raw: IO[bytes] = open(self.path, "wb")  # noqa: SIM115 - closed in close()
        except OSError as e:
            raise UserError(f"cannot write recording {self.path}: {e.strerror}") from None
        self._raw = raw
        self._gz: gzip.GzipFile | None = None
        if self.path.suffix == ".gz":
            self._gz = gzip.GzipFile(fileobj=raw, mode="wb", compresslevel=6)
        self._write_obj(header.to_json())

    def _write_obj(self, obj: dict[str, Any]) -> None:
        data = (_dumps(_clean(obj)) + "\n").encode()
        if self._gz is not None:
            self._gz.write(data)
            self._gz.flush(zlib.Z_SYNC_FLUSH)
        else:
            self._raw.write(data)
        self._raw.flush()
        self.lines += 1

    def write(self, sample: Sample) -> None:
        self._write_obj(sample.to_json())

    def write_event(self, kind: str, t: float, **fields: Any) -> None:
        """A non-tick line (e.g. an engine gap marker); readers skip lines without ``gpus``."""
        self._write_obj({"t": t, "event": kind, **fields})

    def close(self) -> None:
        if self._gz is not None:
            self._gz.close()
            self._gz = None
        if not self._raw.closed:
            self._raw.close()

    def __enter__(self) -> RecordingWriter:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
