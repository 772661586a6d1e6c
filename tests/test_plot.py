"""report --plot: the session timeline figure, drawn from the bundled real recordings."""

from __future__ import annotations

import gzip
import json
import struct
import subprocess
import sys
import xml.etree.ElementTree as ET
from pathlib import Path

import numpy as np
import pytest

from pcie_tui.analyze.attribution import BOUNDS, gpu_ceilings, tick_bounds
from pcie_tui.analyze.engine import hist_delta
from pcie_tui.cli.main import main
from pcie_tui.engines import facts_for
from pcie_tui.plot.figure import (
    STRIP,
    attribution_strip,
    check_plot_path,
    gpu_tracks,
    render_plot,
    strip_colour,
    verdict_strip,
)
from pcie_tui.recording import demos
from pcie_tui.recording.reader import read_recording
from pcie_tui.report.text import build_report

FIXTURES = Path(__file__).parent / "fixtures"
VLLM_CPU = FIXTURES / "vllm-cpu-session.jsonl"  # a real vLLM (CPU) session: an engine, no GPU
NS = "{http://www.w3.org/2000/svg}"


def _svg(path: Path) -> tuple[list[str], dict[str, list[str]]]:
    """All text of an SVG, and the text of each legend by its first entry."""
    root = ET.parse(path).getroot()  # raises on malformed XML
    assert root.tag == NS + "svg"
    texts = ["".join(t.itertext()) for t in root.iter(NS + "text")]
    legends = {}
    for g in root.iter(NS + "g"):
        if g.get("id", "").startswith("legend"):
            entries = ["".join(t.itertext()) for t in g.iter(NS + "text")]
            legends[entries[0]] = entries
    return texts, legends


def _plot(rec_path: Path, out: Path, capsys: pytest.CaptureFixture[str]) -> tuple[list[str], dict[str, list[str]]]:
    assert main(["report", str(rec_path), "--json", "--plot", str(out)]) == 0
    captured = capsys.readouterr()
    json.loads(captured.out)  # the report itself is unchanged by --plot
    assert f"wrote the timeline plot to {out}" in captured.err
    return _svg(out) if out.suffix == ".svg" else ([], {})


def _phases(rec_path: Path) -> list[str]:
    _, an = build_report(read_recording(rec_path, warn=False))
    return sorted({p for i in an.series for p in an.phase_summary(i)})


@pytest.mark.parametrize("name", list(demos.available()))
def test_every_demo_plots_to_svg(name: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = demos.available()[name]
    texts, legends = _plot(path, tmp_path / f"{name}.svg", capsys)
    rec = read_recording(path, warn=False)
    info = rec.header.gpus[0]
    for label in (
        "PCIe (GB/s)",
        "use (%)",
        "time since session start (s)",
        "PCIe RX (into GPU)",
        "SM busy (of all SMs)",
    ):
        assert label in texts
    assert texts.count(f"GPU 0 {info.name} (PCIe Gen{info.link.gen} x{info.link.width})") == 1
    title = next(t for t in texts if t.startswith(path.name))
    assert info.name in title and f"PCIe Gen{info.link.gen} x{info.link.width}" in title
    # The ceiling's value is the recording's, with where it came from.
    _, an0 = build_report(rec)
    c = gpu_ceilings(an0, 0).pinned
    assert c.Bps is not None and c.source == ("calibrated" if info.link.measured_Bps else c.source)
    assert c.source in ("calibrated", "default", "observed")
    assert f"PCIe ceiling {c.Bps / 1e9:.1f} GB/s per direction ({c.detail})" in texts
    # The phase legend names exactly the phases the analyzer sees in this recording.
    # A recording with neither an engine nor labels (h100-heat) has no phase legend.
    phase_legend = legends.get("phase (engine phase, else the recording's label)", [None])[1:]
    assert sorted(phase_legend) == _phases(path)
    # The strip's legend names exactly the bounds that occur (the attribution of each tick).
    _, an = build_report(rec)
    strip = legends[next(k for k in legends if k in BOUNDS)]
    assert sorted(strip) == sorted({BOUNDS[c] for c in tick_bounds(an, 0, facts_for(rec.header.engine)).tolist()})


def test_png_is_a_real_image(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "partial.png"
    _plot(demos.resolve("h200-llama-partial"), out, capsys)
    data = out.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n"
    width, height = struct.unpack(">II", data[16:24])  # IHDR
    assert width == 12 * 120 and 600 < height < 1200
    assert len(data) > 40_000  # lines, bands and text, not an empty canvas
    assert not list(tmp_path.glob(".*.tmp"))


def test_pdf(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "ref.PDF"
    _plot(demos.resolve("h200-reference"), out, capsys)
    assert out.read_bytes()[:5] == b"%PDF-" and out.stat().st_size > 10_000


def test_llama_first_tokens_are_marked_with_their_ttft(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = demos.resolve("h200-llama-partial")
    texts, legends = _plot(path, tmp_path / "p.svg", capsys)
    # The 8000-token prefill's server-side TTFT, from the request the log timed.
    rows = _rows(path)
    reqs = {(r["t"], r["seq"]): r for d in rows if d.get("engine") for r in d["engine"].get("requests") or ()}
    big = max(reqs.values(), key=lambda r: r["prompt_n"])
    assert big["prompt_n"] == 8000
    assert f"{big['prompt_ms'] / 1e3:.2f} s" in texts
    assert any(k.startswith("first token, with its TTFT") for k in legends["PCIe RX (into GPU)"])


def test_engineless_recording_has_no_first_token_marks(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    texts, legends = _plot(demos.resolve("h200-reference"), tmp_path / "r.svg", capsys)
    assert not any("first token" in t for t in texts)
    assert "llama-server" not in texts[0] and "vLLM" not in " ".join(texts)


def test_gpuless_vllm_recording_plots_engine_and_histogram_first_tokens(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    texts, legends = _plot(VLLM_CPU, tmp_path / "v.svg", capsys)
    assert "no GPU in this recording: engine only" in texts and "requests" in texts
    assert "PCIe (GB/s)" not in texts
    assert sorted(legends["phase (engine phase, else the recording's label)"][1:]) == sorted(
        {d["engine"]["phase"] for d in _rows(VLLM_CPU) if d.get("engine") and d["engine"].get("phase")}
    )
    # vLLM knows first tokens only per scrape: the first mark is the first TTFT-count increase.
    prev = None
    for d in _rows(VLLM_CPU):
        cur = ((d.get("engine") or {}).get("hist") or {}).get("ttft_s")
        if cur is None:
            continue
        delta = hist_delta(prev, cur) if prev is not None else None
        prev = cur
        if delta and delta["count"] > 0:
            first = f"{delta['count']:g} x {delta['sum'] / delta['count'] * 1e3:.0f} ms"
            break
    assert first in texts
    assert "first tokens since the previous scrape" in legends["requests running"]


def _lines(path: Path) -> list[bytes]:
    data = path.read_bytes()
    return (gzip.decompress(data) if path.suffix == ".gz" else data).splitlines()


def _rows(path: Path) -> list[dict]:
    return [json.loads(x) for x in _lines(path)[1:] if x.strip()]


def test_measured_ceiling_and_two_gpus_with_nvlink(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """The reference session reshaped: the calibrated ceiling of the H200 (tests/fixtures), and a
    second GPU whose NVLink carries what GPU 0's PCIe read (H200 NVLink: 18 links x 25 GB/s)."""
    src = demos.resolve("h200-reference")
    lines = _lines(src)
    header = json.loads(lines[0])
    measured = json.loads((FIXTURES / "h200-calibrate.json").read_text())["gpus"][0]["counter_Bps"]
    g0 = header["gpus"][0]
    g0["link"]["measured_Bps"] = measured
    header["gpus"].append(dict(g0, index=1, nvlink_capacity_Bps=18 * 25e9, nvlink_count=18))
    out_lines = [json.dumps(header)]
    for raw in lines[1:]:
        d = json.loads(raw)
        g = dict(d["gpus"][0], index=1)
        g["nvlink_rx_Bps"], g["nvlink_tx_Bps"] = g["pcie_rx_Bps"], g["pcie_tx_Bps"]
        d["gpus"].append(g)
        out_lines.append(json.dumps(d))
    rec_path = tmp_path / "two.jsonl"
    rec_path.write_text("\n".join(out_lines) + "\n")
    texts, legends = _plot(rec_path, tmp_path / "two.svg", capsys)
    assert any(t.startswith("PCIe ceiling ") and ("(calibrated pinned)" in t or "(observed: " in t) for t in texts)
    assert "GPU 1 NVIDIA H200 (PCIe Gen5 x16, NVLink x18)" in texts
    assert texts.count("NVLink (GB/s)") == 1 and texts.count("PCIe (GB/s)") == 2
    assert "NVLink ceiling 450.0 GB/s per direction (theoretical)" in texts
    assert any(t.startswith("two.jsonl: 2 x NVIDIA H200") for t in texts)


def test_memory_duty_cycle_is_labelled_a_proxy(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """The reference session as an NVML-only GPU shows it: GPM fields gone, the memory duty cycle left."""
    lines = _lines(demos.resolve("h200-reference"))
    header = json.loads(lines[0])
    header["gpus"][0]["metrics_source"] = "nvml"
    out_lines = [json.dumps(header)]
    for raw in lines[1:]:
        d = json.loads(raw)
        d["gpus"][0]["dram_bw_util"] = None
        out_lines.append(json.dumps(d))
    rec_path = tmp_path / "nvml.jsonl"
    rec_path.write_text("\n".join(out_lines) + "\n")
    texts, legends = _plot(rec_path, tmp_path / "nvml.svg", capsys)
    assert legends["DRAM busy (proxy)"][1:] == ["NVML duty cycle, not bandwidth", "SM busy (of all SMs)"]
    assert not any(t.startswith("DRAM bandwidth") for t in texts)


def test_a_retrained_link_steps_the_ceiling(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    lines = _lines(demos.resolve("h200-reference"))
    out_lines = [lines[0].decode()]
    for raw in lines[1:]:
        d = json.loads(raw)
        if d.get("label") == "idle":  # an idle link trained down to Gen1 x16 (4.0 GB/s)
            d["gpus"][0]["link_gen"] = 1
        out_lines.append(json.dumps(d))
    rec_path = tmp_path / "retrain.jsonl"
    rec_path.write_text("\n".join(out_lines) + "\n")
    texts, legends = _plot(rec_path, tmp_path / "retrain.svg", capsys)
    assert "ceiling per tick (retrained or observed)" in legends["PCIe RX (into GPU)"]
    assert any(t.startswith("PCIe ceiling ") and "above the default 56.7 GB/s" in t for t in texts)


def test_missing_readings_stay_gaps_not_zeros() -> None:
    path = demos.resolve("h200-probe")  # half its GPM windows are void
    rec = read_recording(path, warn=False)
    tr = gpu_tracks(rec.rows or [], 0, rec.header.gpu(0))
    raw = [g.get("pcie_rx_Bps") for d in _rows(path) for g in d["gpus"] if g["index"] == 0]
    assert len(tr["rx"]) == len(raw) and raw.count(None) > 10
    assert np.isnan(tr["rx"]).sum() == raw.count(None)
    assert [v for v in tr["rx"].tolist() if not np.isnan(v)] == [v for v in raw if v is not None]


def test_lone_readings_get_a_dot() -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from pcie_tui.plot.figure import _line

    fig, ax = plt.subplots()
    _line(ax, np.arange(6.0), np.array([1.0, np.nan, 3.0, 4.0, np.nan, np.nan]), color="k")
    line, dots = ax.get_lines()
    assert np.isnan(line.get_ydata()[1]) and list(dots.get_xdata()) == [0.0]
    plt.close(fig)


def test_the_strip_is_the_attribution() -> None:
    assert STRIP is attribution_strip
    _, an = build_report(read_recording(demos.resolve("h200-pageable"), warn=False))
    t, labels, colours = attribution_strip(an, 0)
    assert t == an.series[0].t and len(labels) == len(t) == len(colours)
    assert {"transfer", "host", "idle"} <= set(labels) and "link" not in labels
    assert attribution_strip(an, 7) == ([], [], [])


def test_verdict_strip_is_the_analyzers_timeline() -> None:
    _, an = build_report(read_recording(demos.resolve("h200-reference"), warn=False))
    t, labels, colours = verdict_strip(an, 0)
    assert t == an.series[0].t and len(labels) == len(t) == len(colours)
    assert set(labels) == {"link", "memory", "compute", "none"}
    segs = an.timeline(0)
    for s in segs:
        i = t.index(s["start"])
        assert labels[i] == s["saturated"] and colours[i] == strip_colour(s["saturated"])
    assert verdict_strip(an, 7) == ([], [], [])


@pytest.mark.parametrize(
    ("target", "message"),
    [
        ("out.jpg", "unknown extension '.jpg'; use .svg, .png or .pdf"),
        ("out", "unknown extension '(none)'"),
        ("nowhere/out.svg", "does not exist"),
        ("afile/out.svg", "is not a folder"),
        ("adir.svg", "is a directory"),
    ],
)
def test_bad_plot_paths_fail_first_with_one_line(
    target: str, message: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    (tmp_path / "afile").write_text("x")
    (tmp_path / "adir.svg").mkdir()
    # The recording does not exist either: the plot path is checked before it is read.
    rc = main(["report", str(tmp_path / "missing.jsonl"), "--plot", str(tmp_path / target)])
    err = capsys.readouterr().err
    assert rc == 2 and err.count("\n") == 1
    assert err.startswith("pcie-tui: error: --plot ") and message in err
    with pytest.raises(Exception, match="--plot"):
        check_plot_path(str(tmp_path / target))


def test_unwritable_folder_is_said_after_the_report(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch
) -> None:
    import pcie_tui.plot.figure as plot

    # Tests may run as root, for whom every folder is writable: ask os.access to answer as for a user.
    monkeypatch.setattr(plot.os, "access", lambda path, mode: Path(path) != tmp_path)
    rc = main(["report", str(demos.resolve(None)), "--plot", str(tmp_path / "x.png")])
    cap = capsys.readouterr()
    assert rc == 2 and cap.err == f"pcie-tui: error: --plot {tmp_path / 'x.png'}: no permission to write there\n"
    assert "What held each phase back" in cap.out and not list(tmp_path.iterdir())


@pytest.mark.parametrize("as_json", [False, True])
def test_a_bad_plot_path_never_loses_the_report(as_json: bool, capfd: pytest.CaptureFixture[str]) -> None:
    """`report FILE --plot /no/such/dir/x.svg`: the whole report (text or JSON) on stdout, then one
    line on stderr naming the path, exit 2; the same report as without --plot."""
    argv = ["report", "h200-llama-full"] + (["--json"] if as_json else [])
    assert main(argv) == 0
    plain = capfd.readouterr().out
    assert main([*argv, "--plot", "/no/such/dir/x.svg"]) == 2
    cap = capfd.readouterr()
    assert cap.out == plain and cap.out.strip()
    assert cap.err == "pcie-tui: error: --plot /no/such/dir/x.svg: /no/such/dir does not exist\n"
    if as_json:
        assert json.loads(cap.out)["linkmodel"]["available"] is True


def test_the_report_comes_before_the_error_line_in_one_stream() -> None:
    """Both streams into one pipe (`2>&1`): the report first, the error line last."""
    p = subprocess.run(
        [sys.executable, "-m", "pcie_tui", "report", "h200-llama-full", "--plot", "/no/such/dir/x.svg"],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    lines = p.stdout.rstrip("\n").splitlines()
    assert p.returncode == 2 and "Traceback" not in p.stdout
    assert lines[-1] == "pcie-tui: error: --plot /no/such/dir/x.svg: /no/such/dir does not exist"
    assert any("What held each phase back" in x for x in lines[:-1])


def test_unwritable_target_is_one_line(tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch) -> None:
    import pcie_tui.plot.figure as plot

    out = tmp_path / "x.svg"
    rec = read_recording(demos.resolve("h200-llama-full"), warn=False)
    _, an = build_report(rec)

    def refuse(*a: object, **k: object) -> None:
        raise PermissionError(13, "Permission denied")

    monkeypatch.setattr(plot.os, "replace", refuse)
    with pytest.raises(plot.UserError, match="cannot write: Permission denied"):
        render_plot(rec, an, out, "svg")
    assert not out.exists() and not list(tmp_path.iterdir())


def test_plain_report_does_not_import_matplotlib() -> None:
    code = (
        "import sys, io, contextlib; from pcie_tui.cli.main import main; from pcie_tui.recording import demos\n"
        "with contextlib.redirect_stdout(io.StringIO()): rc = main(['report', str(demos.resolve(None))])\n"
        "print(rc, 'matplotlib' in sys.modules)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.split() == ["0", "False"]
