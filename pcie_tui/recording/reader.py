"""Recording reader: tolerant of a truncated last line or gzip stream."""

from __future__ import annotations

import gc
import json
import math
import os
import sys
import zlib
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from itertools import compress
from operator import itemgetter
from pathlib import Path
from typing import Any, overload

from pcie_tui.core import metrics
from pcie_tui.core.errors import UserError
from pcie_tui.core.model import TYPED_METRICS, EngineSample, GpuSample, Sample, SessionHeader
from pcie_tui.recording.timeline import check_ticks
from pcie_tui.recording.validate import Tally, clean_header_dict, scrub

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
            warning = f"{path}: gzip data corrupt after {sum(map(len, out))} bytes ({e}); read what came before"
            break
        if not d.eof:
            # The writer flushes after every line: a stopped writer leaves whole lines, a cut file need not.
            tail = out[-1][-1:] if out and out[-1] else b""
            why = "the writer was stopped before closing it" if tail == b"\n" else "the file is cut short or damaged"
            warning = f"{path}: gzip stream ends early ({why}); read every complete line"
            break
        data = d.unused_data
    return b"".join(out), warning


def _std_loads(line: bytes, bad: list[int] | None = None) -> Any:
    """stdlib json for what orjson refuses; NaN, infinities and out-of-float-range numbers read as NaN.

    Each such number appends to ``bad``; the reader then scrubs that line (NaN -> None, counted by key).
    """

    def const(_c: str) -> float:
        if bad is not None:
            bad.append(1)
        return math.nan

    def flt(x: str) -> float:
        f = float(x)
        if not math.isfinite(f):
            if bad is not None:
                bad.append(1)
            return math.nan
        return f

    def integer(x: str) -> int | float:
        return int(x) if len(x) < 19 else flt(x)

    return json.loads(line, parse_constant=const, parse_float=flt, parse_int=integer)


def _loads(line: bytes, bad: list[int] | None = None) -> Any:
    """orjson (never yields a non-finite number), else stdlib json with the same guarantee."""
    try:
        return _fast_loads(line)
    except ValueError:
        return _std_loads(line, bad)


# Sample.from_json with positional construction (keyword calls of these frozen dataclasses cost
# 3x more), built from the metrics table. Checked against from_json whenever the table is read;
# on any difference from_json is used.
_TICK_KEYS = ("t", "gpus", "engine")


def _gpu_positional() -> Callable[[dict[str, Any]], GpuSample]:
    """GpuSample.from_json for the table as it is now: positional, the typed rows in attribute order."""
    table = {m.name: m for m in metrics.table()}
    always = tuple(n for n in TYPED_METRICS if table[n].always)
    optional = TYPED_METRICS[len(always) :]  # the rows written only when known come last
    extra_names = tuple(n for n in table if n not in TYPED_METRICS)
    get_all = itemgetter(*TYPED_METRICS)
    get_always = itemgetter(*always) if always and always == TYPED_METRICS[: len(always)] else None

    def gpu(g: dict[str, Any]) -> GpuSample:
        try:
            vals = get_all(g)
        except KeyError:
            if get_always is None:
                return GpuSample.from_json(g)
            try:
                vals = (*get_always(g), *map(g.get, optional))
            except KeyError:
                return GpuSample.from_json(g)
        if extra_names:
            extra = {n: v for n in extra_names if (v := g.get(n)) is not None}
            return GpuSample(int(g["index"]), *(*vals, extra))  # the typed rows, then extra
        return GpuSample(int(g["index"]), *vals)

    return gpu if _fast_matches(gpu) else GpuSample.from_json


_gpu_reader = metrics.per_table(_gpu_positional)


def _sample_fast(d: dict[str, Any]) -> Sample:
    eng = d.get("engine")
    return Sample(
        float(d["t"]),
        tuple(map(_gpu_reader(), d.get("gpus") or ())),
        EngineSample.from_json(eng) if isinstance(eng, dict) else None,
        {k: v for k, v in d.items() if k not in _TICK_KEYS},
    )


def _fast_matches(gpu: Callable[[dict[str, Any]], GpuSample] | None = None) -> bool:
    """Whether the positional reader (``gpu``, else the current one) equals from_json on every shape."""
    names = metrics.names()
    full: dict[str, Any] = {"index": 3, **{k: 1000.0 + i for i, k in enumerate(names)}}
    optional = {m.name for m in metrics.table() if not m.always}
    shapes: list[dict[str, Any]] = [
        full,
        {k: v for k, v in full.items() if k not in optional | {"power_W"}},
        dict(full, index="2"),
    ]
    shapes += [{k: v for k, v in full.items() if k != n} for n in optional]  # one optional row known
    try:
        if gpu is not None:
            return all(gpu(g) == GpuSample.from_json(g) for g in shapes)
        tick = {"t": 5, "gpus": shapes, "engine": {"kind": "x", "phase": "decode"}, "x": 1}
        return _sample_fast(tick) == Sample.from_json(tick) and _sample_fast(
            {"t": 1.5, "gpus": []}
        ) == Sample.from_json({"t": 1.5, "gpus": []})
    except Exception:  # noqa: BLE001 - any mismatch in shape means: use from_json
        return False


_sample = _sample_fast if _fast_matches() else Sample.from_json


class SampleList(Sequence[Sample]):
    """The ticks of a recording as Samples, built from the raw tick dicts on first use.

    ``len`` and truth need no Samples, so ``report`` (which feeds the raw dicts to the analyzer)
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

    def stream(self) -> Iterator[Sample]:
        """The Samples one at a time, none kept (a single pass over a long recording, in constant memory)."""
        return iter(self._samples) if self._samples is not None else map(_sample, self._rows)

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
    :func:`pcie_tui.analyze.session.analyze_rows` takes); ``samples`` then builds lazily.
    """

    path: Path
    header: SessionHeader
    samples: Sequence[Sample]
    events: list[dict[str, Any]] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)
    rows: list[dict[str, Any]] | None = None
    # Where the file breaks: a later header starts a segment; a hole of several intervals is a gap.
    segments: list[dict[str, Any]] = field(default_factory=list)
    gaps: list[dict[str, Any]] = field(default_factory=list)

    @property
    def duration_s(self) -> float:
        return self.samples[-1].t - self.samples[0].t if len(self.samples) > 1 else 0.0


def parse_header(obj: object, path: Path, tally: Tally | None = None) -> SessionHeader:
    if not isinstance(obj, dict) or obj.get("format") != FORMAT:
        raise UserError(f'{path} is not a pcie-tui recording (first line has no "format": "{FORMAT}")')
    if obj.get("version") not in SUPPORTED_VERSIONS or type(obj.get("version")) is not int:
        raise UserError(f"{path}: recording version {obj.get('version')!r:.40} is not supported (this build reads 1)")
    clean_header_dict(obj, tally if tally is not None else Tally(path))
    if obj.get("engine") is not None and not isinstance(obj["engine"], dict):
        obj["engine"] = None
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


def _open(path: str | os.PathLike[str]) -> tuple[Path, SessionHeader, list[bytes], list[str], Tally]:
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
    tally = Tally(p)
    bad: list[int] = []
    try:
        first = _loads(lines[0], bad)
    except (ValueError, RecursionError):
        raise UserError(f"{p} is not a pcie-tui recording (first line is not JSON)") from None
    if bad:
        scrub(first, tally, 1)
    return p, parse_header(first, p, tally), lines, warnings, tally


def _objects(p: Path, lines: list[bytes], warnings: list[str], tally: Tally | None = None) -> Iterator[tuple[int, Any]]:
    """(line number, parsed object) for every readable non-blank line after the header."""
    last_idx = len(lines) - 1
    for i in range(1, len(lines)):
        line = lines[i]
        if not line.strip():
            continue
        bad: list[int] = []
        try:
            obj = _loads(line, bad)
        except (ValueError, RecursionError):
            # The last line may be cut short by a crash; anything else is damage.
            trailing = i == last_idx or all(not x.strip() for x in lines[i + 1 :])
            what = "truncated last line" if trailing else f"unreadable line {i + 1}"
            warnings.append(f"{p}: skipped {what}")
            continue
        if bad:
            scrub(obj, tally if tally is not None else Tally(p), i + 1)
        yield i + 1, obj


def iter_lines(path: str | os.PathLike[str]) -> tuple[SessionHeader, Iterator[dict[str, Any]], list[str]]:
    """Header plus an iterator over raw tick/event dicts. Warnings list fills as it goes."""
    p, header, lines, warnings, _ = _open(path)
    return header, (o for _, o in _objects(p, lines, warnings) if isinstance(o, dict)), warnings


@dataclass
class Rows:
    """What :func:`read_rows_full` returns: checked ticks plus where the recording breaks."""

    header: SessionHeader
    ticks: list[dict[str, Any]]
    events: list[dict[str, Any]]
    warnings: list[str]
    segments: list[dict[str, Any]] = field(default_factory=list)
    gaps: list[dict[str, Any]] = field(default_factory=list)


def read_rows_full(path: str | os.PathLike[str], *, validate: bool = True) -> Rows:
    """Header, checked raw tick dicts, event dicts, warnings, segments and gaps; no Samples built.

    ``validate=False`` skips the value rules (bench/run.py measures their cost with it); the
    structural checks that keep the analyzers safe (a number ``t``, GPU dicts with an integer
    index, time order) always run.
    """
    p, header, lines, warnings, tally = _open(path)
    with gc_paused():
        nums: list[int] | None = None
        try:  # every line whole and plain JSON (the usual case): one sweep
            loads = _fast_loads
            objs = [loads(x) for x in lines[1:] if x]
            if set(map(type, objs)) - {dict}:
                nums = [i + 1 for i in range(1, len(lines)) if lines[i]]
                keep = [isinstance(o, dict) for o in objs]
                objs = list(compress(objs, keep))
                nums = list(compress(nums, keep))
        except (ValueError, RecursionError):  # a cut or damaged line, or something only stdlib json reads
            pairs = [(n, o) for n, o in _objects(p, lines, warnings, tally) if isinstance(o, dict)]
            objs = [o for _, o in pairs]
            nums = [n for n, _ in pairs]

        def line_numbers() -> list[int]:
            return nums if nums is not None else [i + 1 for i in range(1, len(lines)) if lines[i]]

        ticks = [o for o in objs if "gpus" in o and "t" in o]
        events: list[dict[str, Any]] = []
        heads: list[int] = []  # positions in ticks where a later header starts a segment
        head_lines: list[int] = []
        if len(ticks) != len(objs):
            ticks, events = [], []
            ln = line_numbers()
            tick_lines = []
            for o, n in zip(objs, ln, strict=True):
                if "gpus" in o and "t" in o:
                    ticks.append(o)
                    tick_lines.append(n)
                elif o.get("format") == FORMAT:
                    heads.append(len(ticks))
                    head_lines.append(n)
                elif "event" in o:
                    events.append(o)
            nums = tick_lines
            line_numbers = lambda: tick_lines  # noqa: E731 - now lines of ticks only
        checked = check_ticks(header, ticks, line_numbers, heads, head_lines, tally, validate=validate)
    warnings.extend(tally.warnings())
    warnings.extend(checked.warnings)
    return Rows(header, checked.ticks, events, warnings, checked.segments, checked.gaps)


def read_rows(
    path: str | os.PathLike[str],
) -> tuple[SessionHeader, list[dict[str, Any]], list[dict[str, Any]], list[str]]:
    """Header, raw tick dicts (checked: see :mod:`pcie_tui.recording.validate`), event dicts and warnings."""
    r = read_rows_full(path)
    return r.header, r.ticks, r.events, r.warnings


def read_recording(path: str | os.PathLike[str], *, warn: bool = True, validate: bool = True) -> Recording:
    """Load a recording; warnings (truncation, damage) go to stderr when ``warn``.

    Samples are built on first use (see :class:`SampleList`); ``rows`` keeps the raw ticks.
    """
    r = read_rows_full(path, validate=validate)
    rec = Recording(Path(path), r.header, SampleList(r.ticks), r.events, r.warnings, r.ticks, r.segments, r.gaps)
    if warn:
        for w in r.warnings:
            print(f"pcie-tui: warning: {w}", file=sys.stderr)
    return rec
