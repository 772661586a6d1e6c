#!/usr/bin/env bash
# On the H200: the live TUI (`pcie-tui watch --no-engine`) in a 170x45 pseudo-terminal while
# bench/traffic.py drives pinned copies and a device copy: a screenshot mid-copy (ptyshot.py,
# carried in .whl/tools), the app's CPU time, and a py-spy profile of where it goes.
# Needs carry [".whl/dev", ".whl/tools"]. Results under $OUT.
set -u
OUT=${OUT:-device_out}
mkdir -p "$OUT"
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site .whl/dev/*.whl
export PYTHONPATH="$PWD:/tmp/site" PATH="/tmp/site/bin:$PATH" PYTHONUNBUFFERED=1
python3 -m compileall -q pcie_tui /tmp/site >/dev/null 2>&1  # as pip install would: no compile at start
python3 - <<'PY' &
import sys, time
sys.path.insert(0, "bench")
from traffic import Traffic
tr = Traffic()
time.sleep(4)
for phase, secs in (("h2d_pinned", 8), ("idle", 2), ("d2d_copy", 6), ("idle", 20)):
    print(phase, tr.run(phase, secs).get("GBps"), flush=True)
PY
TPID=$!
python3 .whl/tools/ptyshot.py 9 "$OUT/watch-live-170x45.svg" 170 45 python3 -m pcie_tui watch --no-engine >"$OUT/ptyshot.txt" 2>&1 &
SPID=$!
sleep 2
APP=$(for p in /proc/[0-9]*; do c=$(tr '\0' ' ' <$p/cmdline 2>/dev/null); case "$c" in *ptyshot*) ;; *"pcie_tui watch"*) echo ${p#/proc/};; esac; done | head -1)
echo "app pid $APP"
py-spy record --pid "$APP" --rate 100 --format raw -o "$OUT/pyspy-watch.txt" --nonblocking >/dev/null 2>&1 &
wait $SPID; cat "$OUT/ptyshot.txt"
# A second run, 30 s, to measure steady CPU (no screenshot: TEXTUAL_SCREENSHOT off).
python3 - <<'PY' >"$OUT/watch-cpu.txt" 2>&1
import os, pty, resource, subprocess, time
m, s = pty.openpty()
t0 = time.time()
p = subprocess.Popen(["python3", "-m", "pcie_tui", "watch", "--no-engine"], stdin=s, stdout=s, stderr=s,
                     env=dict(os.environ, TERM="xterm-256color", COLUMNS="170", LINES="45"))
time.sleep(8)
c8 = sum(int(x) for x in open(f"/proc/{p.pid}/stat").read().rsplit(")", 1)[1].split()[11:13]) / os.sysconf("SC_CLK_TCK")
time.sleep(20)
c28 = sum(int(x) for x in open(f"/proc/{p.pid}/stat").read().rsplit(")", 1)[1].split()[11:13]) / os.sysconf("SC_CLK_TCK")
p.terminate(); p.wait(10)
print(f"watch --no-engine: start-up (first 8 s) {c8:.2f} s CPU; steady {100 * (c28 - c8) / 20:.2f} % of a core over 20 s")
PY
cat "$OUT/watch-cpu.txt"
wait $TPID
# The retest trigger and the exporter on the real GPU.
export XDG_CONFIG_HOME=/tmp/cfg
{ python3 -m pcie_tui doctor --save-baseline "$OUT"; echo "save rc=$?"
  python3 -m pcie_tui doctor --since "$OUT"; echo "since rc=$? (0 = same machine, no retest)"
  python3 -m pcie_tui export --prometheus --port 9842 --no-engine & EP=$!
  sleep 5; python3 -c "import urllib.request as u; print(\"\\n\".join(l for l in u.urlopen(\"http://127.0.0.1:9842/metrics\", timeout=5).read().decode().splitlines() if l.startswith((\"pcie_pcie\", \"pcie_link\", \"pcie_dram\", \"pcie_sm\", \"pcie_verdict\")))[:3000])"; kill $EP; wait $EP; echo "export rc=$?"
} >"$OUT/doctor-export.txt" 2>&1
cat "$OUT/doctor-export.txt"
ls -la "$OUT"
