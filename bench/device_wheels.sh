#!/usr/bin/env bash
# The wheels a GPU machine's image lacks, into .whl/ (git-ignored), for `carry` and
# bench/device_setup.sh: requirements.txt's pins the workers import, their dependencies the image
# does not hold (KINDS.md lists its packages), transformers' hub client and tokenizers at the
# versions .venv has, and DeepSpeed built as a pure-Python wheel. About 26 MiB; reasoning-gym
# (7 MiB, and its own dependencies) and pyarrow (55 MiB; the image has one) are left out.
#   bash bench/device_wheels.sh        # from the repo root, after `make install`
set -euo pipefail
cd "$(dirname "$0")/.."
PY=.venv/bin/python
[ -x $PY ] || { echo "device_wheels: no .venv; run make install first" >&2; exit 2; }
mkdir -p .whl
ver() { $PY -m pip show "$1" 2>/dev/null | sed -n 's/^Version: //p'; }
PLAT="--no-deps --only-binary=:all: --python-version 3.12 --implementation cp -d .whl"
for n in 17 24 26 27 28 31 34 35; do PLAT="$PLAT --platform manylinux_2_${n}_x86_64"; done
PLAT="$PLAT --platform manylinux2014_x86_64 --platform manylinux1_x86_64"
for pkg in transformers pyzmq hjson pydantic pydantic_core annotated-types typing-inspection gguf datasets dill \
           multiprocess fsspec math-verify latex2sympy2_extended antlr4-python3-runtime tokenizers huggingface_hub \
           httpx2 httpcore2 truststore click safetensors regex; do
    v=$(ver "$pkg"); [ -n "$v" ] || { echo "device_wheels: $pkg is not in .venv" >&2; exit 2; }
    python3 -m pip download -q $PLAT "$pkg==$v" 2>&1 | grep -v "^WARNING: Location" || true
done
$PY -m pip wheel -q --no-deps --no-build-isolation -w .whl "deepspeed==$(ver deepspeed)" 2>&1 | grep -v "^WARNING: Location" || true
# TRL for the benchmark's trl and trl-vllm rows (.venv does not hold it; the image has accelerate)
python3 -m pip download -q --no-deps --only-binary=:all: -d .whl trl==1.16.0 2>&1 | grep -v "^WARNING: Location" || true
# pycountry: vLLM's tar brings pydantic-extra-types, whose language codes transformers' import chain
# reaches once /tmp/site_vllm is on the path (converting a GGUF there failed without it)
python3 -m pip download -q --no-deps --only-binary=:all: -d .whl pycountry==26.2.16 2>&1 | grep -v "^WARNING: Location" || true
# Liger-Kernel for --liger-kernel and bench/learner_kernels.py (pure Python over the image's Triton)
python3 -m pip download -q --no-deps --only-binary=:all: -d .whl liger-kernel==0.8.5 2>&1 | grep -v "^WARNING: Location" || true
echo "device_wheels: $(ls .whl/*.whl | wc -l) wheels, $(du -sh .whl | cut -f1) in .whl/"
