"""Recording reader: tolerant of a truncated last line or gzip stream."""

from __future__ import annotations

import gc
import json
import math
import os
import sys
import threading
import zlib
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from itertools import repeat
from operator import itemgetter
from pathlib import Path
from typing import Any, BinaryIO, overload

import numpy as np

from pcie_tui.core import metrics
from pcie_tui.core.errors import UserError
from pcie_tui.core.model import TYPED_METRICS, EngineSample, GpuSample, Sample, SessionHeader
from pcie_tui.recording.timeline import BlockColumns, TickChecker
from pcie_tui.recording.typed import decode_block
from pcie_tui.recording.validate import Tally, clean_header_dict, scrub

_fast_loads: Callable[[bytes], Any]
try:
    import orjson

    _fast_loads = orjson.loads
except ImportError:  # pragma: no cover - orjson is a dependency; stdlib json still reads everything
    _fast_loads = json.loads


FORMAT = "pcie-tui/recording"
SUPPORTED_VERSIONS = (1,)


READ_BYTES = 1 << 20  # read at a time (compressed bytes for gzip)
BLOCK_BYTES = 1 << 20  # about this much text is parsed and checked at a time (some 1,400 ticks of 1 GPU and an engine)


def _cannot_read(path: Path, e: OSError) -> UserError:
    if isinstance(e, FileNotFoundError):
        return UserError(f"no such recording: {path}")
    if isinstance(e, IsADirectoryError):
        return UserError(f"{path} is a directory, not a recording")
    return UserError(f"cannot read {path}: {e.strerror}")


def _read(f: BinaryIO, path: Path, n: int, progress: list[int]) -> bytes:
    """Up to ``n`` bytes; ``progress[0]`` counts the bytes of the file read so far."""
    try:
        b = f.read(n)
    except OSError as e:
        raise _cannot_read(path, e) from None
    progress[0] += len(b)
    return b


def _blocks(path: Path, warnings: list[str], progress: list[int]) -> Iterator[bytes]:
    """The file's bytes, decompressed if gzip, a block at a time; a damaged or cut gzip stream ends
    the blocks with a warning (in ``warnings``) after everything before it. ``progress[0]`` follows
    the bytes of the file read so far (compressed, for gzip)."""
    try:
        f = path.open("rb")
    except OSError as e:
        raise _cannot_read(path, e) from None
    with f:
        data = _read(f, path, READ_BYTES, progress)
        if data[:2] != b"\x1f\x8b":
            while data:
                yield data
                data = _read(f, path, READ_BYTES, progress)
            return
        yield from _gunzip(f, path, data, warnings, progress)


def _gunzip(f: BinaryIO, path: Path, data: bytes, warnings: list[str], progress: list[int]) -> Iterator[bytes]:
    # Member by member; a killed writer leaves a stream without its end marker, and everything
    # flushed before the kill is still readable.
    d = zlib.decompressobj(wbits=31)
    fed, produced, last = False, 0, b""
    while True:
        if not data:
            data = _read(f, path, READ_BYTES, progress)
            if not data:
                out = d.flush() if fed else b""  # output zlib still holds for input it has taken
                if out:
                    produced += len(out)
                    last = out[-1:]
                    yield out
                break
        try:
            out = d.decompress(data, BLOCK_BYTES)  # a block of text at most, however well it compressed
        except zlib.error as e:
            warnings.append(f"{path}: gzip data corrupt after {produced} bytes ({e}); read what came before")
            return
        fed = True
        if out:
            produced += len(out)
            last = out[-1:]
            yield out
        if d.eof:
            data = d.unused_data
            d, fed, last = zlib.decompressobj(wbits=31), False, b""
        else:
            data = d.unconsumed_tail
    if fed:
        # The writer flushes after every line: a stopped writer leaves whole lines, a cut file need not.
        why = "the writer was stopped before closing it" if last == b"\n" else "the file is cut short or damaged"
        warnings.append(f"{path}: gzip stream ends early ({why}); read every complete line")


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


def sample_from_row(d: dict[str, Any]) -> Sample:
    """One checked raw tick dict as a Sample."""
    return _sample(d)


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
    # Set while a recording opened by open_progressively is still being read (None: read whole).
    loading: Loading | None = None

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


class RowStream:
    """A recording read a block at a time: the header at once, then :meth:`chunks` of checked raw tick
    dicts in file order, none kept by the reader. Event lines collect in ``events``; once the chunks
    are spent, ``warnings`` (damage, values left out, gaps), ``segments`` and ``gaps`` are complete.

    A line that cannot be read is named ("unreadable line N"), unless only blank lines follow it:
    then it is the cut last line a crash leaves ("truncated last line").
    """

    def __init__(
        self,
        path: str | os.PathLike[str],
        *,
        validate: bool = True,
        block_bytes: int = BLOCK_BYTES,
        typed: bool = False,
    ) -> None:
        self.path = Path(path)
        self.typed = typed  # blocks read as typed ticks where they can be (see chunks)
        self._typed_misses = 0  # blocks in a row that could not be read typed
        self.block_bytes = block_bytes
        self.events: list[dict[str, Any]] = []
        self.warnings: list[str] = []
        self.segments: list[dict[str, Any]] = []
        self.gaps: list[dict[str, Any]] = []
        self.tally = Tally(self.path)
        self._gz_warnings: list[str] = []
        self._parse_warnings: list[str] = []
        self.progress = [0]  # bytes of the file read so far
        self._blocks = _blocks(self.path, self._gz_warnings, self.progress)
        self._rest = b""
        self._eof = False
        self._line = 1  # number of the last line taken (the header's is 1)
        self._bad: int | None = None  # a line that could not be read, not yet known to be the last
        self.header = self._read_header()
        self.checker = TickChecker(self.header, self.tally, validate=validate)
        self.done = False

    def _more(self) -> bool:
        block = next(self._blocks, None)
        if block is None:
            self._eof = True
            return False
        self._rest += block
        return True

    def _read_header(self) -> SessionHeader:
        p = self.path
        while b"\n" not in self._rest and self._more():
            pass
        first, nl, self._rest = self._rest.partition(b"\n")
        cut = bool(self._gz_warnings) and self._eof
        if not first.strip():
            if cut and not nl:  # a gzip stream cut before its first line ended
                raise UserError(f"{p} is cut short before its first line ended: no recording to read")
            raise UserError(f"{p} is empty, not a recording")
        if not nl and cut:
            raise UserError(f"{p} is cut short inside its first line: no recording to read")
        bad: list[int] = []
        try:
            obj = _loads(first, bad)
        except (ValueError, RecursionError):
            raise UserError(f"{p} is not a pcie-tui recording (first line is not JSON)") from None
        if bad:
            scrub(obj, self.tally, 1)
        return parse_header(obj, p, self.tally)

    def _line_blocks(self) -> Iterator[tuple[memoryview, int, np.ndarray]]:
        """(whole lines joined by newlines, number of the first, the newlines' offsets in it) about
        ``block_bytes`` at a time; the text after the last newline is the file's last line. A block is a
        view of the text read (no copy of it is taken to cut it off), released before the next is read."""
        while not self._eof:
            while len(self._rest) < self.block_bytes and self._more():
                pass
            if self._eof:
                break
            cut = self._rest.rfind(b"\n")
            if cut < 0:  # one line longer than a block: read on to its end
                if not self._more():
                    break
                continue
            text, self._rest = self._rest, self._rest[cut + 1 :]  # after the last newline: a line the next block ends
            block = memoryview(text)[:cut]
            del text
            newlines = _newlines(block)
            yield block, self._line + 1, newlines
            del block  # (before the next block is read: see chunks)
            self._line += newlines.size + 1
        block, self._rest = memoryview(self._rest), b""
        newlines = _newlines(block)
        yield block, self._line + 1, newlines
        self._line += newlines.size + 1

    def chunks(self) -> Iterator[list[dict[str, Any]]]:
        """The checked tick dicts, a block at a time (never an empty list); typed ticks instead
        (:mod:`pcie_tui.recording.typed`) for a block read that way, where the stream reads ``typed``."""
        with gc_paused():
            for block, first, newlines in self._line_blocks():
                typed = self._typed_block(block, first, newlines)
                if typed:
                    yield typed
                    del block, typed
                    self.checker.columns = None
                    continue
                lines = block.tobytes().split(b"\n")
                del block
                ticks, nums, heads = self._parse(lines, first)
                kept = self.checker.feed(ticks, lambda nums=nums: nums, heads)  # type: ignore[misc]
                if kept:
                    yield kept
                # Nothing of this block held while the next one is parsed: its memory is reused (warm, no
                # fresh pages to fault in) where two blocks alive at once would take new memory each time.
                del lines, ticks, nums, heads, kept
                self.checker.columns = None
        self._finish()

    def _typed_block(self, block: memoryview, first: int, newlines: np.ndarray) -> list[Any] | None:
        """The block as typed ticks, checked whole, when the stream reads typed and the block can be read
        so; else None (read raw). Two blocks in a row that cannot end the trying (a recording of another
        shape: no engine, event lines)."""
        if not self.typed or self._typed_misses >= 2 or self._bad is not None:
            return None
        typed = decode_block(block, newlines)
        if typed is None or not typed.ticks:
            self._typed_misses += typed is None
            return None
        n = len(typed.ticks)
        if not self.checker.feed_typed(typed, lambda: _line_numbers(block.tobytes().split(b"\n"), first, n)):
            self._typed_misses += 1
            return None
        self._typed_misses = 0
        return typed.ticks

    def columns_of(self, rows: list[dict[str, Any]]) -> BlockColumns | None:
        """The columns the check swept from ``rows``, the chunk :meth:`chunks` just gave (None: not kept whole)."""
        cols = self.checker.columns
        return cols if cols is not None and cols.rows is rows else None

    def _finish(self) -> None:
        if self._bad is not None:
            self._parse_warnings.append(f"{self.path}: skipped truncated last line")
            self._bad = None
        checked = self.checker.finish()
        self.segments, self.gaps = checked.segments, checked.gaps
        self.warnings = [*self._gz_warnings, *self._parse_warnings, *self.tally.warnings(), *checked.warnings]
        self.done = True

    def _parse(self, lines: list[bytes], first: int) -> tuple[list[dict[str, Any]], list[int], list[tuple[int, int]]]:
        """One block's lines: (tick dicts, their line numbers, (position, line) of later header lines);
        event lines go to ``events``."""
        try:  # every line whole and plain JSON (the usual case): one sweep
            loads = _fast_loads
            objs = [loads(x) for x in lines if x]
            nums = _line_numbers(lines, first, len(objs))
            if objs and self._bad is not None:
                self._unreadable()
        except (ValueError, RecursionError):  # a cut or damaged line, or something only stdlib json reads
            objs, nums = self._parse_each(lines, first)
        if _all_ticks(objs):
            return objs, nums, []
        ticks = [o for o in objs if type(o) is dict and "gpus" in o and "t" in o]
        if len(ticks) == len(objs):
            return ticks, nums, []
        ticks, tick_lines, heads = [], [], []
        for o, n in zip(objs, nums, strict=True):
            if not isinstance(o, dict):
                continue
            if "gpus" in o and "t" in o:
                ticks.append(o)
                tick_lines.append(n)
            elif o.get("format") == FORMAT:
                heads.append((len(ticks), n))
            elif "event" in o:
                self.events.append(o)
        return ticks, tick_lines, heads

    def _unreadable(self) -> None:
        self._parse_warnings.append(f"{self.path}: skipped unreadable line {self._bad}")
        self._bad = None

    def _parse_each(self, lines: list[bytes], first: int) -> tuple[list[Any], list[int]]:
        objs: list[Any] = []
        nums: list[int] = []
        for i, line in enumerate(lines):
            if not line.strip():
                continue
            if self._bad is not None:
                self._unreadable()
            bad: list[int] = []
            try:
                obj = _loads(line, bad)
            except (ValueError, RecursionError):
                self._bad = first + i  # the last line may be cut short by a crash; anything else is damage
                continue
            if bad:
                scrub(obj, self.tally, first + i)
            objs.append(obj)
            nums.append(first + i)
        return objs, nums


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
    st = RowStream(path, validate=validate)
    ticks: list[dict[str, Any]] = []
    with gc_paused():
        for ch in st.chunks():
            ticks.extend(ch)
    return Rows(st.header, ticks, st.events, st.warnings, st.segments, st.gaps)


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


START_LATEST_S = 2.0


@dataclass
class Loading:
    """How far a recording opened by :func:`open_progressively` has been read."""

    total_bytes: int
    progress: list[int]  # [bytes of the file read so far], moved by the reading thread
    done: bool = False
    error: str | None = None
    # Set by the replay once its first frame is out: reading on before that would slow the first frame
    # (both want the interpreter); the reader goes on by itself after START_LATEST_S anyway.
    go: threading.Event = field(default_factory=threading.Event)

    @property
    def fraction(self) -> float:
        return min(self.progress[0] / self.total_bytes, 1.0) if self.total_bytes > 0 else 1.0

    def text(self) -> str | None:
        """'loading 37 % of 200 MB' while it reads; the error if reading stopped; None once read."""
        if self.error:
            return f"read stopped: {self.error}"
        if self.done:
            return None
        return f"loading {self.fraction * 100:.0f} % of {self.total_bytes / 1e6:.0f} MB"


def open_progressively(path: str | os.PathLike[str], first_ticks: int = 2000) -> Recording:
    """A recording to replay at once: its header and first block read here, the rest by a background
    thread that appends Samples to ``samples`` (a plain list: a reader sees it grow) and reports its
    progress in ``loading``. Events, gaps and segments grow with it; warnings are complete once
    ``loading.done``. A bad file is named here, before anything is shown."""
    st = RowStream(path)
    size = os.stat(path).st_size
    samples: list[Sample] = []
    rec = Recording(Path(path), st.header, samples, st.events, [], None, [], st.checker.gaps)
    rec.loading = Loading(size, st.progress)
    chunks = st.chunks()
    while len(samples) < first_ticks:  # enough to draw from at once (the first block holds thousands)
        rows = next(chunks, None)
        if rows is None:
            _loaded(rec, st)
            return rec
        samples.extend(map(_sample, rows))

    def rest() -> None:
        rec.loading.go.wait(START_LATEST_S)  # type: ignore[union-attr]
        try:
            for rows in chunks:
                samples.extend(map(_sample, rows))
        except UserError as e:  # the file went away or could not be read further
            rec.loading.error = str(e)  # type: ignore[union-attr]
        except Exception as e:  # noqa: BLE001 - a thread's traceback would land on the screen: said in the bar
            rec.loading.error = f"{type(e).__name__}: {e}"[:160]  # type: ignore[union-attr]
        _loaded(rec, st)

    threading.Thread(target=rest, name="pcie-tui-load", daemon=True).start()
    return rec


def _loaded(rec: Recording, st: RowStream) -> None:
    if st.done:
        rec.warnings[:] = st.warnings
        rec.segments[:] = st.segments
    if rec.loading is not None:
        rec.loading.done = True


def _newlines(block: memoryview) -> np.ndarray:
    """The offsets of the newlines in ``block`` (a numpy sweep: bytes.count is a slow byte loop): the lines
    it holds are one more."""
    return np.flatnonzero(np.frombuffer(block, np.uint8) == ord("\n"))


def _line_numbers(lines: list[bytes], first: int, n: int) -> list[int]:
    """The line number of each of the ``n`` non-empty lines, the first line being ``first``."""
    if n == len(lines) or (n == len(lines) - 1 and not lines[-1]):
        return list(range(first, first + n))
    return [first + i for i, x in enumerate(lines) if x]


def _all_ticks(objs: list[Any]) -> bool:
    """Whether every object is a tick dict (one with "gpus" and "t"), in C-level sweeps."""
    return (
        set(map(type, objs)) == {dict}
        and all(map(dict.__contains__, objs, repeat("gpus")))
        and all(map(dict.__contains__, objs, repeat("t")))
    )
