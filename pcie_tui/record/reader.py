"""Recording reader: tolerant of a truncated last line or gzip stream."""

from __future__ import annotations

import gc
import json
import os
import sys
import zlib
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field, fields
from itertools import chain
from operator import itemgetter
from pathlib import Path
from typing import Any, overload

from pcie_tui.errors import UserError
from pcie_tui.model import EngineSample, GpuSample, Sample, SessionHeader

_fast_loads: Callable[[bytes], Any]
try:
    import orjson

    _fast_loads = orjson.loads
except ImportError:  # pragma: no cover - orjson is a dependency; stdlib json still reads everything
    _fast_loads = json.loads


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


def _loads(line: bytes) -> Any:
    """orjson, and stdlib json for whatever orjson refuses (NaN, huge integers), as before."""
    try:
        return _fast_loads(line)
    except ValueError:
        return json.loads(line)


# Sample.from_json with positional construction (keyword calls of these frozen dataclasses cost
# 3x more). Checked against Sample.from_json at import; on any difference from_json is used.
_GPU_KEYS = tuple(f.name for f in fields(GpuSample))[1:]
_gpu_all = itemgetter(*_GPU_KEYS)
_gpu_no_link = itemgetter(*_GPU_KEYS[:-2]) if _GPU_KEYS[-2:] == ("link_gen", "link_width") else None
_TICK_KEYS = ("t", "gpus", "engine")


def _gpu_fast(g: dict[str, Any]) -> GpuSample:
    try:
        return GpuSample(int(g["index"]), *_gpu_all(g))
    except KeyError:
        if _gpu_no_link is not None:
            try:
                return GpuSample(int(g["index"]), *_gpu_no_link(g))
            except KeyError:
                pass
        return GpuSample.from_json(g)


def _sample_fast(d: dict[str, Any]) -> Sample:
    eng = d.get("engine")
    return Sample(
        float(d["t"]),
        tuple(map(_gpu_fast, d.get("gpus") or ())),
        EngineSample.from_json(eng) if isinstance(eng, dict) else None,
        {k: v for k, v in d.items() if k not in _TICK_KEYS},
    )


def _fast_matches() -> bool:
    full = {"index": 3, **{k: 1000.0 + i for i, k in enumerate(_GPU_KEYS)}}
    part = {k: v for k, v in full.items() if k not in ("link_gen", "link_width", "power_W")}
    tick = {"t": 5, "gpus": [full, part, dict(full, index="2")], "engine": {"kind": "vllm", "phase": "decode"}, "x": 1}
    try:
        return _sample_fast(tick) == Sample.from_json(tick) and _sample_fast(
            {"t": 1.5, "gpus": []}
        ) == Sample.from_json({"t": 1.5, "gpus": []})
    except Exception:  # noqa: BLE001 - any mismatch in shape means: use from_json
        return False


_sample = _sample_fast if _fast_matches() else Sample.from_json


class SampleList(Sequence[Sample]):
    """The ticks of a recording as Samples, built from the raw tick dicts on first use.

    ``len`` and truth need no Samples, so ``report`` (which analyses the raw dicts in bulk)
    never pays for them; replay and anything that indexes or iterates gets a plain list.
    """

    __slots__ = ("_rows", "_samples")

    def __init__(self, rows: list[dict[str, Any]]) -> None:
        self._rows = rows
        self._samples: list[Sample] | None = None

    @property
    def built(self) -> bool:
        return self._samples is not None

    def as_list(self) -> list[Sample]:
        if self._samples is None:
            with gc_paused():
                self._samples = list(map(_sample, self._rows))
        return self._samples

    def __len__(self) -> int:
        return len(self._rows) if self._samples is None else len(self._samples)

    @overload
    def __getitem__(self, i: int) -> Sample: ...
    @overload
    def __getitem__(self, i: slice) -> list[Sample]: ...
    def __getitem__(self, i: int | slice) -> Sample | list[Sample]:
        return self.as_list()[i]

    def __iter__(self) -> Iterator[Sample]:
        return iter(self.as_list())

    def __eq__(self, other: object) -> bool:
        if isinstance(other, SampleList):
            other = other.as_list()
        return self.as_list() == other if isinstance(other, list) else NotImplemented

    __hash__ = None  # type: ignore[assignment]

    def __repr__(self) -> str:
        return f"SampleList({len(self)} ticks)"


@dataclass
class Recording:
    """A whole recording in memory: header, samples, and non-tick event lines.

    ``rows`` holds the raw tick dicts when the recording was read from a file (what
    :func:`pcie_tui.analyze.bulk.analyze_rows` takes); ``samples`` then builds lazily.
    """

    path: Path
    header: SessionHeader
    samples: Sequence[Sample]
    events: list[dict[str, Any]] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)
    rows: list[dict[str, Any]] | None = None

    @property
    def duration_s(self) -> float:
        return self.samples[-1].t - self.samples[0].t if len(self.samples) > 1 else 0.0


def parse_header(obj: object, path: Path) -> SessionHeader:
    if not isinstance(obj, dict) or obj.get("format") != FORMAT:
        raise UserError(f'{path} is not a pcie-tui recording (first line has no "format": "{FORMAT}")')
    if obj.get("version") not in SUPPORTED_VERSIONS:
        raise UserError(f"{path}: recording version {obj.get('version')!r} is not supported (this build reads 1)")
    return SessionHeader.from_json(obj)


@contextmanager
def gc_paused() -> Iterator[None]:
    """No cyclic GC while a burst of dicts is built (it rescans them over and over; 1.6x faster)."""
    was = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was:
            gc.enable()


def _open(path: str | os.PathLike[str]) -> tuple[Path, SessionHeader, list[bytes], list[str]]:
    p = Path(path)
    data, warning = _read_bytes(p)
    warnings: list[str] = [warning] if warning else []
    lines = data.split(b"\n")
    if not lines or not lines[0].strip():
        if warning:  # a gzip stream cut before its first line ended
            raise UserError(f"{p} is cut short before its first line ended: no recording to read")
        raise UserError(f"{p} is empty, not a recording")
    if len(lines) == 1 and warning:
        raise UserError(f"{p} is cut short inside its first line: no recording to read")
    try:
        first = _loads(lines[0])
    except ValueError:
        raise UserError(f"{p} is not a pcie-tui recording (first line is not JSON)") from None
    return p, parse_header(first, p), lines, warnings


def _objects(p: Path, lines: list[bytes], warnings: list[str]) -> Iterator[dict[str, Any]]:
    last_idx = len(lines) - 1
    loads = _loads
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


def iter_lines(path: str | os.PathLike[str]) -> tuple[SessionHeader, Iterator[dict[str, Any]], list[str]]:
    """Header plus an iterator over raw tick/event dicts. Warnings list fills as it goes."""
    p, header, lines, warnings = _open(path)
    return header, _objects(p, lines, warnings), warnings


def _tick_ok(d: dict[str, Any]) -> bool:
    """Whether Sample.from_json accepts this tick (a number t; gpus: dicts with an integer index)."""
    try:
        float(d["t"])
        for g in d.get("gpus") or ():
            if not isinstance(g, dict):
                return False
            int(g["index"])
    except (KeyError, TypeError, ValueError):
        return False
    return True


def read_rows(
    path: str | os.PathLike[str],
) -> tuple[SessionHeader, list[dict[str, Any]], list[dict[str, Any]], list[str]]:
    """Header, raw tick dicts (only well-formed ones), event dicts and warnings; no Samples built."""
    p, header, lines, warnings = _open(path)
    with gc_paused():
        try:  # every line whole and plain JSON (the usual case): one sweep
            loads = _fast_loads
            objs = [loads(x) for x in lines[1:] if x]
            if set(map(type, objs)) - {dict}:
                objs = [o for o in objs if isinstance(o, dict)]
        except ValueError:  # a cut or damaged line, or something only stdlib json reads
            objs = list(_objects(p, lines, warnings))
    ticks = [o for o in objs if "gpus" in o and "t" in o]
    events = [o for o in objs if "event" in o and not ("gpus" in o and "t" in o)] if len(ticks) != len(objs) else []
    try:  # the common case in one sweep; on any doubt check tick by tick
        list(map(float, map(itemgetter("t"), ticks)))
        gpus = [d.get("gpus") or () for d in ticks]
        if set(map(type, gpus)) - {list, tuple}:
            raise TypeError
        flat = list(chain.from_iterable(gpus))
        if set(map(type, flat)) - {dict}:
            raise TypeError
        list(map(int, map(itemgetter("index"), flat)))
    except (KeyError, TypeError, ValueError, AttributeError):
        good = []
        for d in ticks:
            if _tick_ok(d):
                good.append(d)
            else:
                warnings.append(f"{path}: skipped a malformed tick at t={d.get('t')!r}")
        ticks = good
    return header, ticks, events, warnings


def read_recording(path: str | os.PathLike[str], *, warn: bool = True) -> Recording:
    """Load a recording; warnings (truncation, damage) go to stderr when ``warn``.

    Samples are built on first use (see :class:`SampleList`); ``rows`` keeps the raw ticks.
    """
    header, ticks, events, warnings = read_rows(path)
    rec = Recording(Path(path), header, SampleList(ticks), events, warnings, ticks)
    if warn:
        for w in warnings:
            print(f"pcie-tui: warning: {w}", file=sys.stderr)
    return rec
