"""Engine-only mode against the real CPU llama-server: this machine has no NVML, so `record --pid`
records the engine side alone, says why the GPU side is unavailable, and `report` works on the file."""

from __future__ import annotations

import json
import re
import subprocess
import sys
import time

import pytest
from engines.gguf_model import write_llama_gguf
from engines.llama_server import LlamaServer, llama_available, stream_completion
from test_export import Exporter

pytestmark = pytest.mark.engine

_why = llama_available()
if _why is not None:
    pytestmark = [pytest.mark.engine, pytest.mark.skip(reason=_why)]


def _nvml_works() -> bool:
    try:
        import pynvml

        pynvml.nvmlInit()
        pynvml.nvmlShutdown()
        return True
    except Exception:  # noqa: BLE001 - any failure means: no NVML here
        return False


@pytest.mark.skipif(_nvml_works(), reason="NVML works here: engine-only mode is for machines without it")
def test_record_pid_without_nvml_records_the_engine_alone(tmp_path):
    model = tmp_path / "tiny.gguf"
    write_llama_gguf(model, n_embd=256, n_ff=768, n_layer=4, n_head=8)
    srv = LlamaServer(model, tmp_path / "server.log", metrics=True, parallel=1).start()
    out = tmp_path / "engine-only.jsonl.gz"
    try:
        rec = subprocess.Popen(
            [sys.executable, "-m", "pcie_tui", "record", "--pid", str(srv.pid), "--headless",
             "--duration", "6", "--interval", "0.1", "--out", str(out)],
            stderr=subprocess.PIPE, text=True,
        )  # fmt: skip
        time.sleep(1.5)
        stream_completion(srv.url, "The quick brown fox jumps over the lazy dog " * 4, 40, 24)
        _, err = rec.communicate(timeout=60)
    finally:
        srv.stop()
    assert rec.returncode == 0, err
    assert "GPU side unavailable: " in err and "Traceback" not in err
    assert len([x for x in err.splitlines() if "GPU side unavailable" in x]) == 1
    header = json.loads(__import__("gzip").open(out, "rt").readline())
    assert header["gpus"] == [] and header["gpu_unavailable"] and header["engine"]["kind"] == "llamacpp"
    rep = subprocess.run(
        [sys.executable, "-m", "pcie_tui", "report", "--json", str(out)], capture_output=True, text=True
    )
    assert rep.returncode == 0, rep.stderr
    r = json.loads(rep.stdout)
    assert r["gpus"] == [] and r["gpu_unavailable"] == header["gpu_unavailable"]
    assert r["ticks"] > 30 and r["engine"]["kind"] == "llamacpp"
    assert r["engine"]["per_request"]["n"] >= 1  # the request was timed from the server log
    assert r["engine"]["prompt_tokens_per_s"] is None or r["engine"]["prompt_tokens_per_s"] > 0
    text = subprocess.run([sys.executable, "-m", "pcie_tui", "report", str(out)], capture_output=True, text=True)
    assert text.returncode == 0 and "GPU side unavailable: " in text.stdout and "Engine" in text.stdout
    # The exporter says so too: a fleet's dashboard tells "no GPU side" from "GPU idle".
    ex = Exporter("--replay", str(out), "--speed", "50")
    try:
        ex.wait_line(re.compile("the source ended"), 30)  # the first ticks may precede the first scrape
        fams = ex.scrape()
        (labels, v, _), *more = fams["pcie_gpu_side_available"]
        assert not more and v == 0 and labels["reason"] == header["gpu_unavailable"][:200]
        assert not any(n.startswith("pcie_link_") for n in fams)
        assert fams["pcie_engine_up"]
    finally:
        assert ex.stop() == 0
