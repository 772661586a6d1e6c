"""Recording reader: tolerant of a truncated last line or gzip stream."""

from __future__ import annotations

import json
import os
import sys
import zlib
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pcie_tui.errors import UserError
from pcie_tui.model import Sample, SessionHeader

FORMAT = "pcie-tui/recording"
SUPPORTED_VERSIONS = (1,)


def _read_bytes(path: Path) -> tuple[bytes, str | None]:
    """Whole file, decompressed if gzip. Returns (data, warning)."""
    try:
        raw = path.read_bytes()
    except FileNotFoundError:
        raise UserError(f"no such recording: {path}") from None
    except IsADirectoryError:
        raise UserError(f"{path} is a directory, not a recording") from None
    except OSError as e:
        raise UserError(f"cannot read {path}: {e.strerror}") from None
    if raw[:2] != b"\x1f\x8b":
        return raw, None
    # Decompress member by member; a killed writer leaves a stream without its
    # end marker, and everything flushed before the kill is still readable.
    out: list[bytes] = []
    warning = None
    data = raw
    while data:
        d = zlib.decompressobj(wbits=31)
        try:
            out.append(d.decompress(data))
        except zlib.error as e:
            warning = f"gzip data corrupt after {sum(map(len, out))} bytes ({e}); read what came before"
            break
        if not d.eof:
            warning = "gzip stream ends early (writer was stopped); read every complete line"
            break
        data = d.unused_data
    return b"".join(out), warning


@dataclass
class Recording:
    """A whole recording in memory: header, samples, and non-tick event lines."""

    path: Path
    header: SessionHeader
    samples: list[Sample]
    events: list[dict[str, Any]] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)

    @property
    def duration_s(self) -> float:
        return self.samples[-1].t - self.samples[0].t if len(self.samples) > 1 else 0.0


def parse_header(obj: object, path: Path) -> SessionHeader:
    if not isinstance(obj, dict) or obj.get("format") != FORMAT:
        raise UserError(f'{path} is not a pcie-tui recording (first line has no "format": "{FORMAT}")')
    if obj.get("version") not in SUPPORTED_VERSIONS:
        raise UserError(f"{path}: recording version {obj.get('version')!r} is not supported (this build reads 1)")
    return SessionHeader.from_json(obj)


def iter_lines(path: str | os.PathLike[str]) -> tuple[SessionHeader, Iterator[dict[str, Any]], list[str]]:
    """Header plus an iterator over raw tick/event dicts. Warnings list fills as it goes."""
    p = Path(path)
    data, warning = _read_bytes(p)
    warnings: list[str] = [warning] if warning else []
    lines = data.split(b"\n")
    if not lines or not lines[0].strip():
        raise UserError(f"{p} is empty, not a recording")
    try:
        first = json.loads(lines[0])
    except ValueError:
        raise UserError(f"{p} is not a pcie-tui recording (first line is not JSON)") from None
    header = parse_header(first, p)
    last_idx = len(lines) - 1

    def gen() -> Iterator[dict[str, Any]]:
        loads = json.loads
        for i in range(1, len(lines)):
            line = lines[i]
            if not line.strip():
                continue
            try:
                obj = loads(line)
            except ValueError:
                # The last line may be cut short by a crash; anything else is damage.
                trailing = i == last_idx or all(not x.strip() for x in lines[i + 1 :])
                what = "truncated last line" if trailing else f"unreadable line {i + 1}"
                warnings.append(f"{p}: skipped {what}")
                continue
            if isinstance(obj, dict):
                yield obj

    return header, gen(), warnings


def read_recording(path: str | os.PathLike[str], *, warn: bool = True) -> Recording:
    """Load a recording; warnings (truncation, damage) go to stderr when ``warn``."""
    header, rows, warnings = iter_lines(path)
    samples: list[Sample] = []
    events: list[dict[str, Any]] = []
    from_json = Sample.from_json
    for obj in rows:
        if "gpus" in obj and "t" in obj:
            try:
                samples.append(from_json(obj))
            except (KeyError, TypeError, ValueError):
                warnings.append(f"{path}: skipped a malformed tick at t={obj.get('t')!r}")
        elif "event" in obj:
            events.append(obj)
    rec = Recording(Path(path), header, samples, events, warnings)
    if warn:
        for w in warnings:
            print(f"pcie-tui: warning: {w}", file=sys.stderr)
    return rec
