#!/usr/bin/env bash
# On a GPU machine: a ~4-minute sustained bf16 matmul load recorded by the real `pcie-tui record --headless`
# (scripts/heat_session.py), then `report` (text and --json). Run from a copy of the package that travels in
# an ignored folder (PKG, default .h1pkg: pcie_tui/ and scripts/), with pcie-tui's wheels in .whl/dev.
# Results under $OUT (NAME: h100-heat or h200-heat by the GPU): NAME.jsonl.gz, NAME.truth.json, NAME-heat.json,
# report.txt, report.json.
set -u
OUT=${OUT:-device_out}
PKG=${PKG:-.h1pkg}
GPU=$(nvidia-smi --query-gpu=name --format=csv,noheader | head -1)
case "$GPU" in *H200*) DEF=h200-heat ;; *H100*) DEF=h100-heat ;; *) DEF=gpu-heat ;; esac
NAME=${NAME:-$DEF}
mkdir -p "$OUT"
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/dev/*.whl || exit 1
export PYTHONPATH="$PWD/$PKG:/tmp/site" PYTHONUNBUFFERED=1
REPO=$PWD
mkdir -p /tmp/heat-run && cd /tmp/heat-run || exit 1  # not the checkout: `python -m pcie_tui` must find $PKG's
python3 -c 'import pcie_tui, sys; print("pcie_tui from", pcie_tui.__file__)'
nvidia-smi --query-gpu=name,driver_version,power.limit,clocks.max.sm,temperature.gpu --format=csv
python3 "$REPO/$PKG/scripts/heat_session.py" --out "$OUT" --name "$NAME" --idle "${IDLE:-5}" --load "${LOAD:-230}"
python3 -m pcie_tui report "$OUT/$NAME.jsonl.gz" >"$OUT/report.txt" 2>&1; echo "report exit $?"
python3 -m pcie_tui report "$OUT/$NAME.jsonl.gz" --json >"$OUT/report.json"; echo "report --json exit $?"
sed -n '/Heat and clocks/,/^GPU 0/p' "$OUT/report.txt"
head -12 "$OUT/report.txt"
