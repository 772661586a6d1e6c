"""``report`` reads a block as typed ticks (recording/typed.py) only where that reads it exactly as the raw
dicts would: a recording with any odd line or value reports the same with typed reading on or off."""

from __future__ import annotations

import gzip
import json
from pathlib import Path
from typing import Any

import orjson
import pytest

from pcie_tui.recording import reader, typed
from pcie_tui.recording.reader import RowStream
from pcie_tui.report.text import report_file

DEMO = Path(__file__).resolve().parents[1] / "pcie_tui" / "data" / "h200-pageable.jsonl.gz"


def _base() -> tuple[dict[str, Any], list[dict[str, Any]]]:
    with gzip.open(DEMO) as f:
        lines = [orjson.loads(x) for x in f]
    one = [d for d in lines[1:] if "t" in d and "gpus" in d]
    span = one[-1]["t"] - one[0]["t"] + 0.1
    ticks = []
    for k in range(4):  # the session four times over, times shifted (as bench/longfile.py writes it)
        for d in one:
            e = dict(d, t=d["t"] + k * span)
            if isinstance(e.get("engine"), dict):
                e["engine"] = {key: v for key, v in e["engine"].items() if key != "requests"}
            ticks.append(e)
    return lines[0], ticks


def _gpu(d: dict[str, Any], **kv: Any) -> dict[str, Any]:
    return dict(d, gpus=[dict(d["gpus"][0], **kv)])


# Each edits the tick at position 700 (lines and values the typed reading must leave to the raw one).
EDITS: dict[str, Any] = {
    "clean": lambda d: d,
    "int rate": lambda d: _gpu(d, pcie_tx_Bps=5),
    "integral float bytes": lambda d: _gpu(d, mem_used_bytes=4431151104.0),
    "fraction clamped": lambda d: _gpu(d, dram_bw_util=1.03),
    "fraction out of range": lambda d: _gpu(d, sm_util=1.5),
    "width not allowed": lambda d: _gpu(d, link_width=3),
    "width as float": lambda d: _gpu(d, link_width=16.0),
    "bool rate": lambda d: _gpu(d, pcie_rx_Bps=True),
    "string power": lambda d: _gpu(d, power_W="129"),
    "unknown GPU field": lambda d: _gpu(d, foo_C=40.0),
    "heat fields": lambda d: _gpu(d, temp_C=61.0, clock_events=4, pcie_replays=2, power_limit_W=700.0),
    "float index": lambda d: _gpu(d, index=0.0),
    "GPU not in header": lambda d: _gpu(d, index=5),
    "GPU twice": lambda d: dict(d, gpus=d["gpus"] * 2),
    "gpus null": lambda d: dict(d, gpus=None),
    "tick label": lambda d: dict(d, label="warmup"),
    "no engine": lambda d: {k: v for k, v in d.items() if k != "engine"},
    "engine not a dict": lambda d: dict(d, engine="up"),
    "engine wide int": lambda d: dict(d, engine=dict(d["engine"], slots=1 << 64)),
    "engine negative wide int": lambda d: dict(d, engine=dict(d["engine"], slots=-(1 << 63) - 1)),
    "engine deep value": lambda d: dict(d, engine=dict(d["engine"], x=[[[[[[[[1]]]]]]]])),
    "engine counter negative": lambda d: dict(d, engine=dict(d["engine"], prompt_tokens_total=-1)),
    "engine up not bool": lambda d: dict(d, engine=dict(d["engine"], up=1)),
    "engine up null": lambda d: dict(d, engine=dict(d["engine"], up=None)),
    "engine no up": lambda d: dict(d, engine={k: v for k, v in d["engine"].items() if k != "up"}),
    "engine no counters": lambda d: dict(d, engine={"kind": "llamacpp", "up": True}),
    "engine counter a string": lambda d: dict(d, engine=dict(d["engine"], requests_waiting="0")),
    "engine counter a bool": lambda d: dict(d, engine=dict(d["engine"], requests_running=True)),
    "engine counter at 1e18 (int)": lambda d: dict(d, engine=dict(d["engine"], prompt_tokens_total=10**18)),
    "engine counter past 1e18 (int)": lambda d: dict(d, engine=dict(d["engine"], prompt_tokens_total=10**18 + 1)),
    "engine counter past 1e18 (float)": lambda d: dict(d, engine=dict(d["engine"], generation_tokens_total=1.5e18)),
    "engine kind a number": lambda d: dict(d, engine=dict(d["engine"], kind=3)),
    "engine phase null": lambda d: dict(d, engine=dict(d["engine"], phase=None)),
    "engine error a list": lambda d: dict(d, engine=dict(d["engine"], error=["x"])),
    "engine null": lambda d: dict(d, engine=None),
    "time goes back": lambda d: dict(d, t=d["t"] - 1000),
    "time as int": lambda d: dict(d, t=int(d["t"])),
    "time huge": lambda d: dict(d, t=1e12),
}
RAW_LINES: dict[str, bytes] = {
    "NaN": b'{"t": 1, "gpus": [{"index": 0, "pcie_tx_Bps": NaN}]}',
    "1e400": b'{"t": 1, "gpus": [{"index": 0, "pcie_tx_Bps": 1e400}]}',
    "event": b'{"event": "note", "t": 1}',
    "cut": b'{"t": 1, "gpus": [{"ind',
    "blank": b"   ",
}


def _write(tmp_path: Path, edit: str | None, raw: str | None) -> Path:
    header, ticks = _base()
    out = [orjson.dumps(header)]
    for i, d in enumerate(ticks):
        out.append(json.dumps(EDITS[edit](d)).encode() if edit is not None and i == 700 else orjson.dumps(d))
        if raw is not None and i == 700:
            out.append(RAW_LINES[raw])
    p = tmp_path / "rec.jsonl"
    p.write_bytes(b"\n".join(out) + b"\n")
    return p


def _report(path: Path, typed_on: bool, monkeypatch: pytest.MonkeyPatch) -> tuple[bytes, int]:
    """The report's JSON, and how many blocks were read typed (blocks of ~100 ticks)."""
    defaults = dict(RowStream.__init__.__kwdefaults__ or {}, block_bytes=30_000)
    monkeypatch.setattr(RowStream.__init__, "__kwdefaults__", defaults)
    monkeypatch.setattr(reader, "READ_BYTES", 30_000)
    n = [0]
    real = typed.decode_block

    def decode(block: memoryview, newlines: Any = None) -> typed.TypedBlock | None:
        got = real(block, newlines) if typed_on else None
        n[0] += got is not None and bool(got.ticks)
        return got

    monkeypatch.setattr(reader, "decode_block", decode)
    out, *_ = report_file(path)
    return orjson.dumps(out, option=orjson.OPT_SORT_KEYS | orjson.OPT_NON_STR_KEYS), n[0]


@pytest.mark.parametrize("edit", list(EDITS))
def test_an_odd_tick_reports_the_same_typed_or_raw(tmp_path: Path, edit: str, monkeypatch: pytest.MonkeyPatch) -> None:
    p = _write(tmp_path, edit, None)
    raw, none = _report(p, False, monkeypatch)
    got, blocks = _report(p, True, monkeypatch)
    assert none == 0 and blocks >= 5  # most blocks typed: the comparison means something
    assert got == raw


@pytest.mark.parametrize("line", list(RAW_LINES))
def test_an_odd_line_reports_the_same_typed_or_raw(tmp_path: Path, line: str, monkeypatch: pytest.MonkeyPatch) -> None:
    p = _write(tmp_path, None, line)
    raw, _ = _report(p, False, monkeypatch)
    got, blocks = _report(p, True, monkeypatch)
    assert blocks >= 5
    assert got == raw


def test_a_typed_block_rejects_what_the_raw_check_would_clean() -> None:
    header, ticks = _base()
    good = json.dumps(ticks[0]).encode()
    assert typed.decode_block(b"\n".join([good])) is not None
    for edit in ("int rate", "heat fields", "time as int"):
        assert typed.decode_block(b"\n".join([json.dumps(EDITS[edit](ticks[0])).encode()])) is not None, edit
    for edit in ("integral float bytes", "fraction clamped", "width not allowed", "bool rate", "unknown GPU field"):
        assert typed.decode_block(b"\n".join([good, json.dumps(EDITS[edit](ticks[0])).encode()])) is None, edit
    for edit in ("engine wide int", "engine negative wide int", "engine deep value", "tick label", "gpus null"):
        assert typed.decode_block(b"\n".join([json.dumps(EDITS[edit](ticks[0])).encode()])) is None, edit


def test_a_block_read_in_one_call_gives_one_tick_a_line_or_nothing() -> None:
    """The one-call decoding of a block (every line ``{...}``) against line by line: the same ticks, and
    None wherever a line does not hold exactly one tick, as line by line gives."""
    _, ticks = _base()
    a, b = (json.dumps(t, separators=(",", ":")).encode() for t in ticks[:2])
    one_call = typed.decode_block(b"\n".join([a, b, a]))
    assert one_call is not None and len(one_call.ticks) == 3
    assert one_call == typed.decode_block(b"\n".join([a, b"", b, a]))  # a blank line: read line by line
    assert typed.decode_block(b"\r\n".join([a, b])) is not None  # CRLF: line by line
    for odd in (
        [a + b, b"   ", a],  # two ticks on one line, and a line of spaces: as many values as lines
        [a + b, a],  # two ticks on one line
        [a[:-1] + b"\n" + a[-1:], b],  # a tick cut over two lines
        [a, b"   "],
        [a, b"{}"],
    ):
        assert typed.decode_block(b"\n".join(odd)) is None, odd
        assert _by_line(odd) is None, odd


def _by_line(lines: list[bytes]) -> list[Any] | None:
    """Each non-empty line through typed.decode_block alone: None where any one is not a tick."""
    out = [typed.decode_block(x) for x in lines if x]
    return None if any(x is None or len(x.ticks) != 1 for x in out) else out


def test_engine_readings_repeated_byte_for_byte_are_decoded_once_and_read_the_same() -> None:
    """The engine readings of a typed block are what orjson reads of each line; a run of ticks that repeat
    a reading byte for byte shares one dict, and a reading equal in value but written otherwise (spaces)
    is decoded again, to the same value."""
    _, ticks = _base()
    lines = [orjson.dumps(t) for t in ticks[:300]]
    lines[150] = json.dumps(ticks[150]).encode()  # the same values, spaced: other bytes
    got = typed.decode_block(b"\n".join(lines))
    assert got is not None
    assert [t.engine for t in got.ticks] == [orjson.loads(x)["engine"] for x in lines]
    eng = [orjson.dumps(t["engine"]) for t in ticks[:300]]
    starts = {0} | {i for i in range(1, 300) if eng[i] != eng[i - 1]}
    assert len(starts) < 150  # the demo repeats most readings: the sharing is exercised
    assert len({id(t.engine) for t in got.ticks}) == len(starts | {150, 151})  # the spaced line and the next decoded
    wide = json.dumps(EDITS["engine wide int"](ticks[9]), separators=(",", ":")).encode()
    bad = [*lines[:10], wide]  # a reading after a run, out of the rules: decoded, so the block is read raw
    assert typed.decode_block(b"\n".join(bad)) is None


FIXTURES = Path(__file__).resolve().parent / "fixtures"


def _repeated_with_extras(source: Path, tmp_path: Path) -> Path:
    """``source``'s ticks three times over (times shifted, event lines left out, finished requests kept), the
    second time with the API server's HTTP counters added to every engine reading: blocks that hold a key and
    blocks that do not. The header's model metadata is left out: with it the report prices the link model,
    which reads every block raw."""
    opener: Any = gzip.open if source.suffix == ".gz" else open
    with opener(source, "rb") as f:
        lines = [orjson.loads(x) for x in f]
    header, ticks = lines[0], [d for d in lines[1:] if "t" in d and "gpus" in d]
    if isinstance(header.get("engine"), dict):
        header["engine"] = {k: v for k, v in header["engine"].items() if k != "model_meta"}
    span = ticks[-1]["t"] - ticks[0]["t"] + 0.1
    out = [orjson.dumps(header)]
    for k in range(3):
        for i, d in enumerate(ticks):
            e = dict(d, t=d["t"] + k * span)
            if k == 1 and isinstance(e.get("engine"), dict):
                e["engine"] = dict(e["engine"], http_seconds_total=0.01 * i, http_requests_total=float(i // 10))
            out.append(orjson.dumps(e))
    p = tmp_path / "rec.jsonl"
    p.write_bytes(b"\n".join(out) + b"\n")
    return p


@pytest.mark.parametrize(
    "source",
    [
        "vllm-cpu-session.jsonl",
        "h100-runs/session3-20261207/np4c4.jsonl.gz",
        "h100-runs/session3-20261207/np1c16.jsonl.gz",
    ],
)
def test_engine_keys_some_blocks_lack_report_the_same_typed_or_raw(
    tmp_path: Path, source: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A typed block's consumers skip their sweep for an engine key none of its readings holds (histograms,
    finished requests, preemptions, cached prompt tokens, the HTTP counters): real vLLM and llama-server
    sessions, where some blocks hold those keys and others do not, report the same as read raw."""
    p = _repeated_with_extras(FIXTURES / source, tmp_path)
    raw, none = _report(p, False, monkeypatch)
    got, blocks = _report(p, True, monkeypatch)
    assert none == 0 and blocks >= 3
    assert got == raw
