"""Recording writer: JSON Lines, one tick per line, flushed per line.

A crash or kill loses at most the line being written. ``.gz`` paths are
written as a gzip stream with a sync flush after every line, so even a
killed writer leaves a file whose complete lines all decompress.

A write that fails (disk full, file system gone) or a path that no longer names the file being written
(removed or replaced; checked every CHECK_EVERY lines) stops the recording with an OutputError that says
why and how much was kept; a last ``recording_stopped`` line is tried (a full disk may refuse it).
"""

from __future__ import annotations

import contextlib
import gzip
import json
import os
import stat
import time
import zlib
from pathlib import Path
from typing import IO, Any

from pcie_tui.core.errors import OutputError, UserError
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


CHECK_EVERY = 10  # lines between checks that the path still names the file being written


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
        self.failed: str | None = None  # why writing stopped, once it did
        self._gz: gzip.GzipFile | None = None
        if self.path.suffix == ".gz":
            self._gz = gzip.GzipFile(fileobj=raw, mode="wb", compresslevel=6)
        try:
            self._write_obj(header.to_json())
        except OutputError:
            self.close()
            raise

    def _write_obj(self, obj: dict[str, Any]) -> None:
        data = (_dumps(_clean(obj)) + "\n").encode()
        if self.failed is not None:
            raise OutputError(self.failed)
        try:
            self._put(data)
        except OSError as e:
            why = e.strerror or str(e)
            raise self._fail(why[:1].lower() + why[1:]) from None
        self.lines += 1
        if self.lines % CHECK_EVERY == 0 and not self._same_file():
            raise self._fail(f"{self.path} was removed or replaced while recording")

    def _put(self, data: bytes) -> None:
        """One line out to the disk (a sync flush through gzip, then the file's buffer)."""
        if self._gz is not None:
            self._gz.write(data)
            self._gz.flush(zlib.Z_SYNC_FLUSH)
        else:
            self._raw.write(data)
        self._raw.flush()

    def _same_file(self) -> bool:
        """Whether the path still names the file being written (a removed file takes every later tick with it)."""
        try:
            st, own = os.stat(self.path), os.fstat(self._raw.fileno())
        except OSError:
            return False
        return (st.st_dev, st.st_ino) == (own.st_dev, own.st_ino) or not stat.S_ISREG(own.st_mode)

    def _fail(self, why: str) -> OutputError:
        """Stop: say why and how much was kept; try to leave a last line saying so (a full disk may refuse)."""
        kept = max(0, self.lines - 1)
        self.failed = f"recording stopped: {why} ({kept} ticks and events written to {self.path} before it are kept)"
        with contextlib.suppress(OSError, ValueError):
            self._put((_dumps({"t": time.time(), "event": "recording_stopped", "reason": why}) + "\n").encode())
        return OutputError(self.failed)

    def write(self, sample: Sample) -> None:
        self._write_obj(sample.to_json())

    def write_event(self, kind: str, t: float, **fields: Any) -> None:
        """A non-tick line (e.g. an engine gap marker); readers skip lines without ``gpus``."""
        self._write_obj({"t": t, "event": kind, **fields})

    def close(self) -> None:
        try:
            if self._gz is not None:
                gz, self._gz = self._gz, None
                gz.close()
        except OSError:
            pass  # the gzip trailer did not fit: every line before it was flushed whole (readers allow for it)
        finally:
            try:
                if not self._raw.closed:
                    self._raw.close()
            except OSError:
                pass

    def __enter__(self) -> RecordingWriter:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
