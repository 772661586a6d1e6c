"""Baselines and ``doctor --since``: change one fact at a time, check the exact line and the exit code."""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
import time
from datetime import datetime, timezone
from pathlib import Path

import pytest
from test_doctor_standin import Gpu, StandInLoad, StandInNvml

from pcie_tui.doctor import fingerprint as fpm
from pcie_tui.doctor import retest
from pcie_tui.doctor.run import run_doctor

REPO = Path(__file__).resolve().parents[1]
FIX = Path(__file__).parent / "fixtures"
SYSFS = FIX / "sysfs"
DAY = datetime(2026, 12, 3, 10, 0, tzinfo=timezone.utc).timestamp()
fakenvml = pytest.importorskip("fakenvml", reason="tests/fakenvml (replaying H200 stand-in) not present")


@pytest.fixture
def proc(tmp_path) -> Path:
    """This machine's real cpuinfo and meminfo, in a tree a test may edit."""
    d = tmp_path / "proc"
    d.mkdir()
    for f in ("cpuinfo", "meminfo"):
        shutil.copy(f"/proc/{f}", d / f)
    return d


def pair(gpu1_loaded=(4, 16), gpu1_uuid=None, gpu1_numa=0) -> StandInNvml:
    return StandInNvml(
        [
            Gpu(
                "00000000:01:00.0", "NVIDIA RTX A6000", idle=(1, 16), loaded=(4, 16), max=(4, 16), gpu_max_gen=4, numa=0
            ),
            Gpu(
                "00000000:41:00.0",
                "NVIDIA RTX A6000",
                idle=(1, 16),
                loaded=gpu1_loaded,
                max=(4, 16),
                gpu_max_gen=4,
                numa=gpu1_numa,
                uuid=gpu1_uuid,
            ),
        ]
    )


def fingerprint(nv, proc: Path, load=True, sysfs=SYSFS / "x16x16-cpu", t=None):
    r = run_doctor(
        nvml=nv,
        sysfs_root=str(sysfs),
        proc_root=str(proc),
        load_s=0.3,
        backend_factory=(lambda: StandInLoad(nv)) if load else None,
    )
    if t is not None:
        r["time"] = t
    return fpm.from_report(r, fpm.host_facts(proc, r["driver_version"]))


def lines(result):
    return [c["line"] for c in result["changes"]]


def test_a_baseline_is_a_sorted_indented_file_that_reads_back(proc, tmp_path):
    fp = fingerprint(pair(), proc, t=DAY)
    path = fpm.write(fp, tmp_path / "b")
    assert path.name == f"baseline-{fp['host']['hostname']}-20261203T100000Z.json"
    text = path.read_text()
    assert text == json.dumps(fp, indent=1, sort_keys=True) + "\n"
    back = fpm.load(path)
    assert back["gpus"] == fp["gpus"] and back["host"] == fp["host"]
    g1 = back["gpus"][1]
    assert g1["under_load"] == {"gen": 4, "width": 16, "how": "generated"}
    assert g1["link"] == {"max_gen": 4, "max_width": 16, "gpu_max_gen": 4, "idle_gen": 1, "idle_width": 16}
    assert g1["chain"]["narrowest"] == {"hop": "0000:40:01.1 -> 0000:41:00.0", "max_gen": 4, "max_width": 16}
    assert back["host"]["driver_version"] == "580.159.04" and back["host"]["cpu_count"] >= 1
    assert back["host"]["memory_bytes"] > 0 and back["host"]["cpu_model"]
    # A folder means its newest baseline.
    assert fpm.load(tmp_path / "b")["path"] == str(path)
    res = retest.compare(back, fingerprint(pair(), proc))
    assert res["changes"] == [] and not res["retest"]
    assert retest.render(res).endswith("no retest due: nothing changed since the baseline (2026-12-03)")


def test_x16_to_x8_under_load_is_a_retest(proc):
    base = fingerprint(pair(), proc, t=DAY)
    res = retest.compare(base, fingerprint(pair(gpu1_loaded=(4, 8)), proc))
    assert lines(res) == ["GPU 1 trained x8 instead of x16 under load since the baseline (2026-12-03): retest"]
    assert res["retest"]
    assert "GPU 1 link compared by max and under load (baseline: generated, now: generated)" in res["compared"]


def test_an_idle_link_trained_down_is_not_a_change(proc):
    """Baseline under load (Gen4 x16), now idle (Gen1): only the max is compared, and the output says so."""
    base = fingerprint(pair(), proc, t=DAY)
    now = fingerprint(pair(), proc, load=False)
    assert now["gpus"][1]["link"]["idle_gen"] == 1 and now["gpus"][1]["under_load"] is None
    res = retest.compare(base, now)
    assert res["changes"] == [] and not res["retest"]
    assert res["compared"][1] == (
        "GPU 1 link compared by max and not under load (no under-load reading now; idle links train down, "
        "so the idle state is not compared)"
    )


def test_a_replaced_gpu_is_a_retest(proc):
    base = fingerprint(pair(), proc, t=DAY)
    res = retest.compare(base, fingerprint(pair(gpu1_uuid="GPU-5e1f0000-new"), proc))
    assert lines(res) == [
        "GPU 0000:41:00.0 replaced (UUID changed: NVIDIA RTX A6000 GPU-standin-1 -> "
        "NVIDIA RTX A6000 GPU-5e1f0000-new): retest"
    ]


def test_driver_update_is_a_retest(proc):
    base = fingerprint(pair(), proc, t=DAY)
    nv = pair()
    nv.driver = "590.10"
    res = retest.compare(base, fingerprint(nv, proc))
    assert lines(res) == ["driver 580.159.04 -> 590.10: retest"]


def test_numa_node_change_is_a_retest(proc):
    base = fingerprint(pair(), proc, t=DAY)
    res = retest.compare(base, fingerprint(pair(gpu1_numa=1), proc))
    assert lines(res) == ["GPU 1 NUMA node 0 -> 1: retest"]


def set_proc(proc: Path, name: str, edit) -> None:
    (proc / name).write_text("\n".join(edit(ln) for ln in (proc / name).read_text().splitlines()) + "\n")


def test_hostname_is_cosmetic_and_memory_needs_more_than_kernel_noise(proc, monkeypatch):
    set_proc(proc, "cpuinfo", lambda ln: ln.replace(" hypervisor", ""))  # bare metal
    base = fingerprint(pair(), proc, t=DAY)
    assert base["host"]["virtual_machine"] is False
    host = base["host"]["hostname"]
    monkeypatch.setattr(fpm.socket, "gethostname", lambda: "renamed")
    res = retest.compare(base, fingerprint(pair(), proc))
    assert lines(res) == [f"hostname {host} -> renamed: no retest (cosmetic)"] and not res["retest"]
    assert "only cosmetic changes" in retest.render(res)
    mem = base["host"]["memory_bytes"]
    for kb, trigger in ((mem // 1024 - 4096, False), (mem // 1024 * 2, True)):
        set_proc(proc, "meminfo", lambda ln, kb=kb: f"MemTotal:       {kb} kB" if ln.startswith("MemTotal:") else ln)
        res = retest.compare(base, fingerprint(pair(), proc))
        (mem_change,) = [c for c in res["changes"] if c["what"] == "memory"]
        assert mem_change["retest"] is trigger
        end = ": retest" if trigger else "(under 1%: kernel reservations): no retest (cosmetic)"
        assert mem_change["line"].endswith(end), mem_change
    # In a VM MemTotal follows the guest's use (Firecracker: 31 GiB at start, 255 GiB after filling 192 GiB).
    base["host"]["virtual_machine"] = True
    res = retest.compare(base, fingerprint(pair(), proc))
    (mem_change,) = [c for c in res["changes"] if c["what"] == "memory"]
    assert mem_change["line"].endswith("(a VM: MemTotal follows the guest's use): no retest (cosmetic)")


def test_narrower_bridge_link_is_a_retest(proc, tmp_path):
    base = fingerprint(pair(), proc, t=DAY)
    tree = tmp_path / "sysfs"
    shutil.copytree(SYSFS / "x16x16-cpu", tree, symlinks=True)
    (tree / "devices" / "pci0000:40" / "0000:40:01.1" / "max_link_width").write_text("8\n")
    res = retest.compare(base, fingerprint(pair(), proc, sysfs=tree))
    assert lines(res) == [
        "GPU 1 narrowest link on the bridge chain Gen4 x16 -> Gen4 x8 (0000:40:01.1 -> 0000:41:00.0): retest"
    ]


def test_gpu_added_and_no_gpu_now(proc):
    one = StandInNvml(pair().gpus[:1])
    base = fingerprint(one, proc, t=DAY)
    res = retest.compare(base, fingerprint(pair(), proc))
    assert lines(res) == ["GPU 1 added at 0000:41:00.0 (NVIDIA RTX A6000, GPU-standin-1): retest"]
    gone = fpm.no_gpu("NVML found no GPU on this machine", fpm.host_facts(proc, None))
    res = retest.compare(base, gone)
    assert lines(res)[0] == "no GPU visible now (NVML found no GPU on this machine); the baseline had 1: retest"
    assert "driver not compared (not recorded now)" in res["compared"]


# ---- engine layout --------------------------------------------------------------------


def test_engine_layout_from_recordings_and_no_prompt_text():
    data = REPO / "pcie_tui" / "data"
    full = fpm.engine_from_recording(str(data / "h200-llama-full.jsonl.gz"))
    partial = fpm.engine_from_recording(str(data / "h200-llama-ngl4.jsonl.gz"))
    assert full["kind"] == "llamacpp" and full["flags"]["-ngl"] == "999" and full["flags"]["-b"] == "512"
    assert full["model"] == {"name": "model.gguf", "size_bytes": None}  # the H200's file is not on this machine
    res = retest.compare({"host": {}, "gpus": [], "engine": full}, {"host": {}, "gpus": [], "engine": partial})
    assert lines(res) == ["llamacpp -ngl 999 -> 4: retest"]
    argv = [
        "llama-server",
        "-m",
        "/nope/m.gguf",
        "-p",
        "my secret prompt",
        "-ot",
        "blk\\.1[0-9]\\.ffn=CPU",
        "--override-tensor=exps=CPU",
        "-ngl",
        "99",
        "--prompt",
        "also secret",
        "-f",
        "prompt.txt",
        "--no-mmap",
    ]
    flags = fpm.layout_flags("llamacpp", argv)
    assert flags == {"-ot": ["blk\\.1[0-9]\\.ffn=CPU", "exps=CPU"], "-ngl": "99", "--no-mmap": True}
    assert "secret" not in json.dumps(fpm.engine_facts({"kind": "llamacpp", "cmdline": argv, "layout": {}}))
    vl = fpm.layout_flags("vllm", ["vllm", "serve", "m", "-tp", "2", "--max-model-len=8192", "--enforce-eager"])
    assert vl == {"-tp": "2", "--max-model-len": "8192", "--enforce-eager": True}


# ---- the H200 ---------------------------------------------------------------------------


def h200_now(proc):
    nv = fakenvml.FakeNvml(fakenvml.load_capture())
    r = run_doctor(nvml=nv, sysfs_root=str(SYSFS / "h200-vm"), proc_root=str(proc), load_s=0.0, backend_factory=None)
    return fpm.from_report(r, fpm.host_facts(proc, r["driver_version"]))


def test_the_h200_doctor_report_is_a_baseline(proc):
    """h200-doctor.json (doctor --json on the H200) lacks the host facts but has every GPU fact."""
    base = fpm.load(FIX / "h200-doctor.json")
    (g,) = base["gpus"]
    assert g["under_load"] == {"gen": 5, "width": 16, "how": "generated"}
    assert (g["link"]["max_gen"], g["link"]["max_width"], g["numa_node"]) == (5, 16, None)
    assert g["chain"] == {"found": True, "attach": "direct", "narrowest": None}
    assert base["host"] == {
        "hostname": "vm",
        "cpu_model": None,
        "cpu_count": None,
        "memory_bytes": None,
        "driver_version": None,
    }
    now = h200_now(proc)
    assert now["host"]["driver_version"] == "580.159.04"  # the capture's driver
    res = retest.compare(base, now)
    # The doctor run and the NVML capture were made on two different H200s at 0000:00:06.0.
    assert lines(res)[0] == (
        "GPU 0000:00:06.0 replaced (UUID changed: NVIDIA H200 GPU-0d7b2f3a-7834-687c-b586-38045902724b"
        " -> NVIDIA H200 GPU-0e0ede71-a903-5661-2b0f-b73e9eb0bce4): retest"
    )
    assert "driver not compared (not recorded in the baseline)" in res["compared"]


def test_calibrate_writes_a_baseline_with_the_under_load_link(proc, tmp_path, monkeypatch):
    from test_calibrate import _ReplayBackend

    import pcie_tui.doctor.copybench as copybench
    from pcie_tui.doctor.calibrate import calibrate_main

    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "cfg"))
    offset = [0.0]
    nv = fakenvml.FakeNvml(fakenvml.load_capture(), clock=lambda: offset[0] + time.monotonic())

    def jump(t):
        offset[0] += t - nv.now()

    monkeypatch.setattr(copybench, "load_backend", lambda name=None: _ReplayBackend(nv, jump))
    args = argparse.Namespace(
        gpu=None,
        size_mib=256,
        seconds=1.0,
        backend=None,
        no_save=False,
        json=True,
        sysfs_root=str(SYSFS / "h200-vm"),
        proc_root=str(proc),
    )
    assert calibrate_main(args, nvml=nv) == 0
    (path,) = (tmp_path / "cfg" / "pcie-tui").glob("baseline-*.json")
    assert (path.parent / "calibration.json").exists()
    fp = fpm.load(path)
    assert fp["source"] == "calibrate" and fp["gpus"][0]["under_load"] == {"gen": 5, "width": 16, "how": "calibrate"}
    assert nv.inits == 0
    now = h200_now(proc)
    res = retest.compare(fp, now)
    assert res["changes"] == []
    # The replay starts in a phase where the H200 computed: doctor counts that as the GPU's own load.
    how = (now["gpus"][0]["under_load"] or {}).get("how")
    assert res["compared"][0] == (
        "GPU 0 link compared by max and under load (baseline: calibrate, now: engine)"
        if how == "engine"
        else "GPU 0 link compared by max and not under load (no under-load reading now; idle links train down, "
        "so the idle state is not compared)"
    )


# ---- the command ------------------------------------------------------------------------

RUNNER = """
import sys
sys.path.insert(0, "tests")
import fakenvml
sys.modules["pynvml"] = fakenvml.FakeNvml(fakenvml.load_capture())
from pcie_tui.cli.main import main
sys.exit(main(sys.argv[1:]))
"""


def pcie_tui(*args, standin=True):
    argv = [sys.executable, "-c", RUNNER] if standin else [sys.executable, "-m", "pcie_tui"]
    return subprocess.run([*argv, *args], cwd=REPO, capture_output=True, text=True, timeout=120)


def test_doctor_since_as_a_real_process(tmp_path, proc):
    common = ["--sysfs-root", str(SYSFS / "h200-vm"), "--proc-root", str(proc), "--load-s", "0"]
    p = pcie_tui("doctor", "--save-baseline", str(tmp_path), *common)
    assert p.returncode in (0, 1) and "baseline saved to" in p.stdout, p.stderr
    (base,) = tmp_path.glob("baseline-*.json")
    p = pcie_tui("doctor", "--since", str(base), *common)
    assert p.returncode == 0, p.stdout + p.stderr
    assert p.stdout.strip().splitlines()[-1].startswith("no retest due: nothing changed since the baseline (")
    p = pcie_tui("doctor", "--since", str(FIX / "h200-doctor.json"), *common)
    assert p.returncode == 1 and "GPU 0000:00:06.0 replaced (UUID changed" in p.stdout
    assert p.stdout.strip().splitlines()[-1] == "retest due: 1 change(s) since the baseline (2026-12-02)"
    # --now: two files, no NVML at all.
    changed = json.loads(base.read_text())
    changed["host"]["driver_version"] = "590.10"
    other = tmp_path / "other.json"
    other.write_text(json.dumps(changed))
    p = pcie_tui("doctor", "--since", str(base), "--now", str(other), "--json", standin=False)
    assert p.returncode == 1
    out = json.loads(p.stdout)
    assert [c["line"] for c in out["changes"]] == ["driver 580.159.04 -> 590.10: retest"] and out["retest"] is True


@pytest.mark.parametrize("case", ["missing", "not-json", "wrong-format", "bad-gpus", "now-alone", "both"])
def test_bad_baselines_are_one_line_and_exit_2(case, tmp_path):
    bad = tmp_path / "bad.json"
    argv = {
        "missing": ["--since", str(tmp_path / "nope.json")],
        "not-json": ["--since", str(bad)],
        "wrong-format": ["--since", str(bad)],
        "bad-gpus": ["--since", str(bad)],
        "now-alone": ["--now", str(FIX / "h200-doctor.json")],
        "both": ["--since", str(FIX / "h200-doctor.json"), "--save-baseline", str(tmp_path)],
    }[case]
    content = {"not-json": "{not json", "bad-gpus": json.dumps({"format": fpm.FORMAT, "host": {}, "gpus": [1]})}
    bad.write_text(content.get(case, json.dumps({"format": "pcie-tui/recording"})))
    p = pcie_tui("doctor", *argv, standin=False)
    assert p.returncode == 2, p.stdout + p.stderr
    err = p.stderr.strip().splitlines()
    assert len(err) == 1 and "Traceback" not in p.stderr and p.stdout == "", p.stderr
