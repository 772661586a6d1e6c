#!/usr/bin/env bash
# One device call on the H200 (run from the repo root; results under $OUT):
# raw NVML capture for tests/fakenvml, the bundled reference session, tests/test_gpu.py,
# and the sampler bench (pcie-tui vs nvitop). Steps are independent: one failing
# does not stop the next. STEPS picks a subset: "capture reference test bench" (default all).
set -u
STEPS=${STEPS:-capture reference test bench}
has() { case " $STEPS " in *" $1 "*) return 0;; esac; return 1; }
OUT=${OUT:-device_out}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1
if ls .whl/*.whl >/dev/null 2>&1; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl
fi
export PYTHONPATH="$PWD:/tmp/site"
{
  echo "== env"; date -u; nvidia-smi --query-gpu=name,driver_version,pcie.link.gen.current,pcie.link.width.current --format=csv
  python3 -c 'import torch, pynvml; print("torch", torch.__version__, "cuda", torch.cuda.is_available())'
  python3 -m pip show nvidia-ml-py nvitop 2>/dev/null | grep -E '^(Name|Version)'
  if has capture; then echo "== capture"; time python3 tests/fakenvml/capture.py "$OUT/h200-nvml-capture.json" 3; fi
  if has reference; then echo "== reference session"; time python3 scripts/make_reference_session.py "$OUT/h200-reference.jsonl.gz" 7; fi
  if has test; then echo "== test_gpu"; time PCIE_TUI_GPU_REPORT="$OUT/test_gpu_report.txt" python3 -m pytest --noconftest -p no:cacheprovider \
      -o addopts="" -m gpu tests/test_gpu.py -v -s 2>&1 | tee "$OUT/test_gpu_output.txt"; fi
  if has bench; then echo "== bench"; time python3 bench/run.py --sampler --results "$OUT/bench-results.md"; fi
} 2>&1 | tee "$OUT/device_log.txt"
