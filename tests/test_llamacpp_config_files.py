"""llama.cpp b11434's config files (issue 20, "config presets"): /etc/llama.cpp/config.ini, then
${XDG_CONFIG_HOME:-$HOME/.config}/llama.cpp/config.ini, applied before the environment and the command line
(common/arg.cpp ``common_params_apply_system_config``, common/preset.cpp ``load_from_ini``). pcie-tui reads them
from the server's own environment at attach, keeps only the offload and loading options, records them, and
says where each fact came from. The last test runs a real llama-server with such a file."""

from __future__ import annotations

import os
import subprocess
import time
import urllib.request
from pathlib import Path

import pytest
from engines.gguf_model import write_llama_gguf
from engines.llama_server import free_port, llama_available, server_binary

from pcie_tui.engines.llamacpp import advice, flags
from pcie_tui.engines.llamacpp.client import LlamaCppClient

INI = """\
; llama.cpp config
version = 1
[*]
lm = mlock
cache-ram = 2048
api-key = never-recorded
[default]
n-gpu-layers = 4
no-op-offload = true
LLAMA_ARG_N_PARALLEL = 3
[some/other-model:Q4_K_M]
ngl = 99
"""


def test_the_files_are_read_from_the_servers_environment_and_only_offload_options_kept(tmp_path: Path):
    cfg = tmp_path / "xdg" / "llama.cpp" / "config.ini"
    cfg.parent.mkdir(parents=True)
    cfg.write_text(INI)
    assert flags.config_paths({"HOME": "/home/u"}) == [
        "/etc/llama.cpp/config.ini",
        "/home/u/.config/llama.cpp/config.ini",
    ]
    got = [c for c in flags.read_configs({"XDG_CONFIG_HOME": str(tmp_path / "xdg")}) if c["path"] == str(cfg)]
    assert got == [
        {
            "path": str(cfg),
            "options": [
                ("lm", "mlock"),
                ("cache-ram", "2048"),
                ("n-gpu-layers", "4"),
                ("no-op-offload", "true"),
                ("LLAMA_ARG_N_PARALLEL", "3"),
            ],
        }
    ]  # fmt: skip  ([*] then [default]; the api key and another model's preset are not the server's options)


def test_config_then_environment_then_command_line_each_with_its_source():
    configs = [
        {"path": "/etc/llama.cpp/config.ini", "options": [["lm", "mlock"], ["ngl", "4"], ["op-offload", "false"]]}
    ]
    vals, src = flags.parse(["llama-server", "-ngl", "8"], {"LLAMA_ARG_LOAD_MODE": "none"}, configs)
    assert vals["n_gpu_layers"] == 8 and src["n_gpu_layers"] == "flag -ngl 8"
    assert vals["load_mode"] == "none" and src["load_mode"] == "env LLAMA_ARG_LOAD_MODE=none"
    assert (
        vals["no_op_offload"] is True and src["no_op_offload"] == "config /etc/llama.cpp/config.ini: op-offload = false"
    )
    vals, src = flags.parse(["llama-server"], {}, configs)
    assert (vals["load_mode"], src["load_mode"]) == ("mlock", "config /etc/llama.cpp/config.ini: lm = mlock")
    assert flags.parse(["llama-server"], {}, [{"path": "x", "options": [["ngl"], "junk", ["ngl", "2", "3"]]}])[0] == {}


_why = llama_available()


@pytest.mark.engine
@pytest.mark.skipif(_why is not None, reason=_why or "")
def test_a_real_llama_server_applies_its_config_file_and_the_facts_say_so(tmp_path: Path):
    model = tmp_path / "tiny.gguf"
    write_llama_gguf(model, n_embd=256, n_ff=768, n_layer=4, n_head=8)
    home = tmp_path / "home"
    cfg = home / ".config" / "llama.cpp" / "config.ini"
    cfg.parent.mkdir(parents=True)
    cfg.write_text("[*]\ncache-ram = 0\nlm = mlock\n")
    port = free_port()
    env = {"PATH": os.environ.get("PATH", ""), "HOME": str(home)}
    log = tmp_path / "server.log"
    argv = [server_binary(), "-m", str(model), "--host", "127.0.0.1", "--port", str(port), "-t", "2", "-ngl", "0"]
    with open(log, "wb") as out:
        proc = subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, env=env)
    try:
        for _ in range(600):
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=1) as r:
                    if r.status == 200:
                        break
            except OSError:
                time.sleep(0.1)
        text = log.read_text(errors="replace")
        assert f"using config file: {cfg}" in text  # the server says it applied the file
        client = LlamaCppClient(f"http://127.0.0.1:{port}", pid=proc.pid, log_path=str(log))
        info = client.describe()
        assert info["config_files"] == [{"path": str(cfg), "options": [("cache-ram", "0"), ("lm", "mlock")]}]
        fx = advice.facts(info)
        cache = next(f for f in fx.runtime if f.name == "prompt_cache_mib")
        assert (cache.value, cache.source) == (0, f"config {cfg}: cache-ram = 0")
    finally:
        proc.terminate()
        proc.wait(15)
