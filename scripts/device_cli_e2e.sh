#!/usr/bin/env bash
# On the H200: the real CLI end to end. `pcie-tui record --headless` (NvmlCollector via the
# CLI's live source) while bench/traffic.py drives known phases, then `pcie-tui report --json`.
# Results under $OUT: cli-e2e.jsonl.gz, cli-e2e-report.json, cli-e2e-log.txt.
set -u
OUT=${OUT:-device_out}
mkdir -p "$OUT"
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1
{
  python3 -m pcie_tui record --out "$OUT/cli-e2e.jsonl.gz" --headless --no-engine --interval 0.1 &
  REC=$!
  python3 - <<'PY'
import json, sys, time
sys.path.insert(0, "bench")
from traffic import Traffic
tr = Traffic()
truth = {}
for phase, secs in (("idle", 3), ("h2d_pinned", 5), ("idle", 2), ("d2h_pinned", 5), ("d2d_copy", 5), ("matmul_bf16", 5), ("idle", 2)):
    t0 = time.time()
    r = tr.run(phase, secs)
    truth.setdefault(phase, []).append({"start": t0, "end": time.time(), **{k: v for k, v in r.items() if isinstance(v, (int, float, str))}})
json.dump(truth, open(sys.argv[1] if len(sys.argv) > 1 else "/tmp/truth.json", "w"))
print("phases done")
PY
  cp /tmp/truth.json "$OUT/cli-e2e-truth.json" 2>/dev/null
  kill -TERM $REC; wait $REC; echo "record exit $?"
  python3 -m pcie_tui report "$OUT/cli-e2e.jsonl.gz" --json >"$OUT/cli-e2e-report.json"; echo "report exit $?"
  python3 -m pcie_tui report "$OUT/cli-e2e.jsonl.gz"
  python3 -m pcie_tui report /nonexistent.jsonl; echo "bad input exit $?"
} >"$OUT/cli-e2e-log.txt" 2>&1
tail -60 "$OUT/cli-e2e-log.txt"
