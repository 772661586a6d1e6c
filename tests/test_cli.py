"""The command line as a user meets it: exit codes, one-line errors, report output."""

from __future__ import annotations

import io
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).parent.parent


def run(*args: str, cwd: Path = REPO) -> subprocess.CompletedProcess:
    # An explicit environment without COLUMNS/LINES: something in the test process putenv()s
    # COLUMNS=80 (not visible in os.environ), and a piped report follows COLUMNS when set.
    env = {k: v for k, v in os.environ.items() if k not in ("COLUMNS", "LINES")}
    return subprocess.run(
        [sys.executable, "-m", "pcie_tui", *args], capture_output=True, text=True, cwd=cwd, timeout=120, env=env
    )


def assert_one_line_error(p: subprocess.CompletedProcess, needle: str) -> None:
    assert p.returncode != 0
    assert "Traceback" not in p.stderr
    lines = [x for x in p.stderr.splitlines() if x.strip()]
    assert len(lines) == 1, p.stderr
    assert needle in lines[0]


def test_report_json_contract(probe_recording_path):
    p = run("report", str(probe_recording_path), "--json")
    assert p.returncode == 0, p.stderr
    rep = json.loads(p.stdout)
    g = rep["gpus"][0]
    assert g["index"] == 0
    segs = g["verdicts"]
    assert {s["saturated"] for s in segs} <= {"link", "memory", "compute", "none"}
    first_t = json.loads(probe_recording_path.read_text().splitlines()[1])["t"]
    assert segs[0]["start"] == first_t
    assert segs[-1]["end"] == rep["end"]
    assert any(s["saturated"] == "link" for s in segs)
    assert g["link_Bps"]["peak"] > 55e9
    assert 0.85 < g["dram_util"]["peak"] < 0.90  # GPM DRAM_BW_UTIL 87.8 % on the D2D copy


def test_report_text_names_phases_and_events(probe_recording_path):
    p = run("report", str(probe_recording_path))
    assert p.returncode == 0, p.stderr
    assert "h2d_pinned" in p.stdout and "link" in p.stdout and "GB/s" in p.stdout


@pytest.mark.parametrize(
    "args,needle",
    [
        (("report", "/no/such/file.jsonl"), "no such recording"),
        (("report", "pyproject.toml"), "not a pcie-tui recording"),
        (("replay", "pyproject.toml"), "not a pcie-tui recording"),
        (("report",), "the following arguments are required"),
        (("bogus",), "invalid choice"),
        (("report", "x", "--frobnicate"), "unrecognized arguments"),
        (("replay", "x", "--speed", "-2"), "must be a number > 0"),
        (("watch", "--interval", "abc"), "not a number"),
        # nan and inf passed "> 0" checks once: a busy loop at 100 % CPU, or an OverflowError
        (("record", "--interval", "nan", "--out", "x.jsonl"), "must be a number > 0: 'nan'"),
        (("record", "--interval", "inf", "--out", "x.jsonl"), "must be a number > 0: 'inf'"),
        (("record", "--interval", "1e-9", "--out", "x.jsonl"), "must be >= 0.01"),
        (("watch", "--interval", "1e9"), "must be <= 60"),
        (("record", "--duration", "nan", "--out", "x.jsonl"), "must be a number > 0: 'nan'"),
        (("replay", "h200-pageable", "--speed", "nan"), "must be a number > 0: 'nan'"),
        (("demo", "h200-pageable", "--speed", "1e6"), "must be <= 1000"),
        (("export", "--prometheus", "--interval", "nan"), "must be a number > 0: 'nan'"),
        (("demo", "nope"), "no demo named"),
        (("demo", "h200-pagable"), "did you mean h200-pageable?"),
        (("record", "--out", "/"), "is a directory"),
        (("record", "--out", "/no/such/folder/x.jsonl"), "does not exist"),
        # a recording already there is never overwritten silently
        (("record", "--out", "pyproject.toml", "--no-engine"), "exists: give another name, or --force"),
        (("watch", "--gpus", "-1"), "expected GPU indices"),
        # the live view needs a terminal: a pipe gets a line naming what to run instead
        (("demo", "h200-pageable"), "; for the text report use `pcie-tui report h200-pageable`"),
        (("replay", "h200-pinned"), "replay draws a live view and "),
        (("record", "--out", "/tmp/pcie-tui-never-written.jsonl", "--no-engine"), "add --headless"),
        (("watch", "--no-engine"), "use `pcie-tui record --headless --out FILE`"),
    ],
)
def test_bad_input_is_one_line_and_nonzero(args, needle):
    assert_one_line_error(run(*args), needle)


def test_truncated_recording_reports_with_warning(tmp_path, probe_recording_path):
    data = probe_recording_path.read_bytes()
    cut = tmp_path / "cut.jsonl"
    cut.write_bytes(data[:-30])
    p = run("report", str(cut), "--json")
    assert p.returncode == 0
    assert "truncated last line" in p.stderr and "Traceback" not in p.stderr


def test_help_for_every_command():
    for cmd in ("watch", "record", "replay", "report", "demo"):
        p = run(cmd, "--help")
        assert p.returncode == 0 and "usage:" in p.stdout


def test_demo_list_names_bundled_sessions():
    p = run("demo", "--list")
    assert p.returncode == 0
    assert "h200-probe" in p.stdout


def test_gzip_cut_inside_the_header_says_so(tmp_path):
    src = REPO / "pcie_tui" / "data" / "h200-reference.jsonl.gz"
    cut = tmp_path / "cut.jsonl.gz"
    cut.write_bytes(src.read_bytes()[:100])
    assert_one_line_error(run("report", str(cut)), "cut short")


def test_report_into_a_closed_pipe_exits_quietly():
    """`pcie-tui report x | head -1`: the reader is gone before we write."""
    src = REPO / "pcie_tui" / "data" / "h200-reference.jsonl.gz"
    for args in (("report", str(src)), ("report", str(src), "--json")):
        r, w = os.pipe()
        os.close(r)  # every write now fails with EPIPE
        try:
            p = subprocess.run(
                [sys.executable, "-m", "pcie_tui", *args], stdout=w, stderr=subprocess.PIPE, cwd=REPO, timeout=120
            )
        finally:
            os.close(w)
        err = p.stderr.decode()
        assert p.returncode == 0 and "Traceback" not in err and "Exception" not in err, (args, p.returncode, err)


def test_piped_text_report_does_not_wrap_at_80_columns():
    p = run("report", str(REPO / "pcie_tui" / "data" / "h200-reference.jsonl.gz"))
    assert p.returncode == 0
    first = next(ln for ln in p.stdout.splitlines() if ln.endswith(" ticks"))  # after the two-line headline
    assert "ticks" in first and len(first) > 80


# ---- a bundled demo's name works wherever a recording path does ---------------------------

DEMO = "h200-llama-partial"
DEMO_FILE = REPO / "pcie_tui" / "data" / f"{DEMO}.jsonl.gz"


def test_report_takes_a_demo_name():
    p = run("report", DEMO, "--json")
    assert p.returncode == 0, p.stderr
    rep = json.loads(p.stdout)
    assert Path(rep["file"]).name == DEMO_FILE.name
    direct = json.loads(run("report", str(DEMO_FILE), "--json").stdout)
    assert rep["gpus"] == direct["gpus"] and rep["ticks"] == direct["ticks"] > 0
    text = run("report", DEMO)
    assert text.returncode == 0, text.stderr
    assert any(DEMO_FILE.name in ln for ln in text.stdout.splitlines()[:8]) and "GB/s" in text.stdout


def test_replay_takes_a_demo_name(monkeypatch):
    from pcie_tui.cli import main as cli

    seen = {}

    def fake_tui(source, recorder_factory=None, status=None):
        seen.update(source=source, status=status)
        source.close()
        return 0

    monkeypatch.setattr(cli, "_run_tui", fake_tui)
    monkeypatch.setattr(cli, "_need_terminal", lambda *a: None)  # pytest's stdin is not a terminal
    assert cli.main(["replay", DEMO, "--speed", "2"]) == 0
    src = seen["source"]
    assert src.recording.path == DEMO_FILE and len(src.samples) > 0 and src.speed == 2.0
    assert seen["status"] == f"replay of demo {DEMO}"
    assert cli.main(["demo", DEMO]) == 0
    assert seen["source"].recording.path == DEMO_FILE and seen["source"].loop


def test_a_real_file_wins_over_a_demo_of_the_same_name(tmp_path, probe_recording_path):
    (tmp_path / DEMO).write_bytes(probe_recording_path.read_bytes())
    p = run("report", DEMO, "--json", cwd=tmp_path)
    assert p.returncode == 0, p.stderr
    rep = json.loads(p.stdout)
    assert rep["file"] == DEMO  # the local file (the H200 probe), not the bundled llama session
    probe = json.loads(run("report", str(probe_recording_path), "--json").stdout)
    assert rep["ticks"] == probe["ticks"]


@pytest.mark.parametrize("cmd", ["report", "replay"])
def test_unknown_name_lists_the_demos(cmd):
    p = run(cmd, "h200-llama-nope")
    assert p.returncode == 2
    assert_one_line_error(p, "no such recording: h200-llama-nope")
    for name in ("h200-llama-partial", "h200-reference", "h200-probe"):
        assert name in p.stderr


def test_a_log_file_that_is_not_there_gets_one_warning_line(monkeypatch, capsys, tmp_path):
    """--log naming a missing file still attaches (the engine may create it), with one line saying so."""
    import argparse

    from pcie_tui.cli import main as cli
    from pcie_tui.core.errors import UserError
    from pcie_tui.engines import discover

    seen = {}

    def attach(pid=None, url=None, log_path=None, running_pids=None):
        seen["log_path"] = log_path
        raise UserError("stop here")

    monkeypatch.setattr(discover, "attach", attach)
    missing = tmp_path / "nope.log"
    args = argparse.Namespace(no_engine=False, pid=None, url="http://127.0.0.1:9", log=str(missing), stacks=False)
    with pytest.raises(UserError):
        cli.open_engine(args, None, interactive=False)
    err = capsys.readouterr().err.strip().splitlines()
    assert seen["log_path"] == str(missing)
    assert err == [f"pcie-tui: warning: --log {missing}: no such file (yet); per-request timings start once it appears"]
    missing.write_text("")
    with pytest.raises(UserError):
        cli.open_engine(args, None, interactive=False)
    assert capsys.readouterr().err == ""


def test_a_missing_path_is_not_answered_with_the_demo_list():
    p = run("report", "/no/such/dir/run.jsonl.gz")
    assert_one_line_error(p, "no such recording: /no/such/dir/run.jsonl.gz")
    assert "bundled demo" not in p.stderr
    assert "nor a bundled demo" in run("report", "nodemo").stderr  # a bare name may have meant one


def test_the_cli_keeps_numpys_blas_to_one_thread_unless_told():
    """numpy's bundled OpenBLAS starts a spinning thread per core at import: 2.3 s of CPU at start-up
    on the H200's 16-core host. pcie-tui does no BLAS work: the CLI asks for one thread, and a
    user's own OPENBLAS_NUM_THREADS wins."""
    tasks = "import os, numpy; print(len(os.listdir('/proc/self/task')), os.environ.get('OPENBLAS_NUM_THREADS'))"
    via_cli = f"from pcie_tui.cli import main as cli; cli.main(['report', 'h200-pinned', '--json']); {tasks}"  # report loads numpy
    blas_env = ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "GOTO_NUM_THREADS")
    env = {k: v for k, v in os.environ.items() if k not in blas_env}

    def run_py(code: str, **extra: str) -> list[str]:
        p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env={**env, **extra}, cwd=REPO)
        assert p.returncode == 0, p.stderr
        return p.stdout.split("\n")[-2].split()

    # The main thread alone; and main() gives the caller's environment back (None after it).
    assert run_py(via_cli) == ["1", "None"]
    openblas = (
        "openblas"
        in run_py("import numpy; print(numpy.show_config(mode='dicts')['Build Dependencies']['blas']['name'])")[0]
    )
    if openblas and len(os.sched_getaffinity(0)) >= 2:
        assert int(run_py(tasks)[0]) > 1  # what numpy does without it: the test can fail
    assert run_py(via_cli, OPENBLAS_NUM_THREADS="2")[1] == "2"


def test_the_terminal_check_steps_aside_for_textual_drivers(monkeypatch):
    """`textual serve "pcie-tui demo"` runs the app over pipes with TEXTUAL_DRIVER set: not refused."""
    from pcie_tui.cli.args import need_terminal
    from pcie_tui.core.errors import UserError

    monkeypatch.delenv("TEXTUAL_DRIVER", raising=False)
    monkeypatch.setattr(sys, "__stdin__", io.StringIO())  # a pipe: no terminal
    with pytest.raises(UserError, match="stdin"):
        need_terminal("demo", "x")
    monkeypatch.setenv("TEXTUAL_DRIVER", "textual.drivers.web_driver:WebDriver")
    need_terminal("demo", "x")
