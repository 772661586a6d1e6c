#!/usr/bin/env bash
# One short device call on the H200 after a refactor (results under $OUT; carry [".whl/dev"]):
# the real CLI records pinned host->GPU copies and a device copy (bench/traffic.py, torch) with
# `record --no-engine`, then `report` (text, --json), `calibrate --no-save` and `doctor` run on
# the real GPU. Checks the GPU side end to end: collector -> metrics table codec -> reader ->
# the one analyzer -> verdict and answer.
set -u
OUT=${OUT:-device_out}
mkdir -p "$OUT"
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site .whl/dev/*.whl
export PYTHONPATH="$PWD:/tmp/site" PATH="/tmp/site/bin:$PATH" PYTHONUNBUFFERED=1 XDG_CONFIG_HOME=/tmp/cfg
{
  date -u
  python3 - <<'PY' &
import sys, time
sys.path.insert(0, "bench")
from traffic import Traffic
tr = Traffic()
time.sleep(2)
for phase, secs in (("h2d_pinned", 5), ("idle", 1.5), ("d2d_copy", 4), ("idle", 2)):
    t = time.time()
    print(f"traffic {phase} {t:.3f} {tr.run(phase, secs).get('GBps')} GB/s", flush=True)
PY
  TPID=$!
  timeout -s TERM 19 python3 -m pcie_tui record --no-engine --headless --interval 0.1 --out "$OUT/smoke.jsonl.gz"
  echo "record rc=$? (124 = stopped by timeout's SIGTERM)"
  wait $TPID
  python3 -m pcie_tui report "$OUT/smoke.jsonl.gz"; echo "report rc=$?"
  python3 -m pcie_tui report --json "$OUT/smoke.jsonl.gz" >"$OUT/smoke-report.json"; echo "report --json rc=$?"
  timeout 90 python3 -m pcie_tui calibrate --no-save; echo "calibrate rc=$?"
  python3 -m pcie_tui doctor; echo "doctor rc=$?"
  date -u
} >"$OUT/smoke-log.txt" 2>&1
tail -120 "$OUT/smoke-log.txt"
