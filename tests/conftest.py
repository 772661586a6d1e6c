"""Shared fixtures. Engine fixtures live in tests/engines/."""

from __future__ import annotations

from pathlib import Path

import pytest

FIXTURES = Path(__file__).parent / "fixtures"
REPO = Path(__file__).parent.parent


@pytest.fixture
def probe_recording_path() -> Path:
    """Real H200 readings (shared/data probe) converted to a recording."""
    return FIXTURES / "h200-probe.jsonl"


# ---- engine fixtures (real engines; helpers in tests/engines/) --------------------


@pytest.fixture(scope="session")
def vllm_model() -> tuple[Path, int]:
    """The tiny random Llama + tokenizer for vLLM (written once, cached in .engines/models/)."""
    from engines.vllm_server import ensure_model, vllm_available

    why = vllm_available()
    if why:
        pytest.skip(why)
    d = REPO / ".engines" / "models" / "vllm-tiny-llama"
    return d, ensure_model(d)


@pytest.fixture(scope="session")
def vllm_server(vllm_model, tmp_path_factory):
    """ONE real vLLM API server per test session on 127.0.0.1 (about 50 s to start on 2 cores)."""
    from engines.vllm_server import VllmServer, free_port

    model_dir, vocab = vllm_model
    srv = VllmServer(model_dir, free_port(), tmp_path_factory.mktemp("vllm") / "vllm.log")
    srv.vocab = vocab  # type: ignore[attr-defined]
    try:
        srv.ready_s = srv.start()  # type: ignore[attr-defined]
    except RuntimeError as e:
        srv.stop()
        pytest.fail(f"vLLM did not start: {e}")
    yield srv
    srv.stop()


@pytest.fixture(autouse=True)
def _no_stored_calibration(tmp_path_factory, monkeypatch):
    """Reports and the live source read this machine's stored calibration: tests start from none."""
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path_factory.mktemp("config")))


def pytest_collection_modifyitems(config, items):
    """Run the tests of the real vLLM server first.

    On this project's current 2-core CI machine (Intel Xeon, 2026-12-03), the vLLM engine tests fail
    when they run after the Textual live-app test in the same process (the engine's TTFT and py-spy
    states then look idle; seen with the project's code from before this change too) and pass when
    they run first. The cause is not found yet; the order keeps the suite meaningful meanwhile.
    Both symptoms match flakes fixed since (2026-12-03, later: vLLM scrapes now wait 2 s, not 0.3 s; the
    stacks test dumps over 20 s, not 30 dumps back to back), and with those fixes the vLLM tests
    passed after the live-app test in one process here; the order stays until CI confirms it.
    """
    items.sort(key=lambda item: 0 if "vllm_server" in getattr(item, "fixturenames", ()) else 1)
