"""Where models are cached, and how one loads into a process: the cache folder and its build
stamps (a folder built by another version of this code is rebuilt), the tokenizer, the model on a
device in a dtype, the device and dtype the flags ask for, the ids that end a completion, and the
weights' fingerprint.

Several processes may start at once: a file lock (locked) makes one of them build a cached folder
while the others wait, and the folder appears by rename, so a half-written folder is never seen.
"""
from __future__ import annotations

import fcntl
import json
import logging
import os
import shutil
import time
from contextlib import contextmanager
from pathlib import Path

import torch
from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

from grpo.config.constants import NO_CUDA
from grpo.model.gguf.header import ModelUnavailable

log = logging.getLogger(__name__)


def cache_dir() -> Path:
    return Path(os.environ.get("GRPO_CACHE", Path.home() / ".cache" / "grpo"))


@contextmanager
def locked(path: Path):
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "w") as fh:
        fcntl.flock(fh, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(fh, fcntl.LOCK_UN)


# Bumped whenever a builder's output changes; a cached folder with another stamp is rebuilt.
BUILD_VERSION = 2
BUILD_STAMP = "grpo_build.json"


def write_build_stamp(folder: Path, source: dict | None = None) -> None:
    """The stamp build_is_current reads; `source`: what the folder was built from (a GGUF file's path, size, hash)."""
    stamp = {"build_version": BUILD_VERSION, **({"source": source} if source else {})}
    (folder / BUILD_STAMP).write_text(json.dumps(stamp) + "\n")


def build_is_current(folder: Path) -> bool:
    """A cached folder from this code's builders: a config and a stamp with BUILD_VERSION."""
    if not (folder / "config.json").is_file():
        return False
    try:
        return json.loads((folder / BUILD_STAMP).read_text()).get("build_version") == BUILD_VERSION
    except (OSError, ValueError, AttributeError):
        return False


def build_cached(folder: str, build) -> str:
    """cache_dir()/folder, built by build(dest) unless a current build is there (under a file lock)."""
    dest = cache_dir() / folder
    if not build_is_current(dest):
        with locked(cache_dir() / f"{folder}.lock"):
            if not build_is_current(dest):  # another process may have built it meanwhile
                if dest.exists():
                    log.info("rebuilding %s: it was built by an older version of this code", dest)
                    shutil.rmtree(dest)
                build(dest)
    return str(dest)


# Random-init models (grpo.model.zoo's random:qwen2.5-* folders hold a config, no weights): every
# process draws the same weights from this seed.
RANDOM_INIT_SEED = 1234


def eos_ids(tokenizer, model_or_generation_config=None) -> list[int]:
    """Every id that ends a completion: the tokenizer's EOS and the generation config's
    eos_token_id (an int or a list: Llama 3 and Qwen2.5 list several, e.g. <|im_end|> and
    <|endoftext|>), sorted, each once. model_or_generation_config: a model (its
    generation_config, else its config) or a GenerationConfig / PretrainedConfig; None: the
    tokenizer's only."""
    ids: set[int] = set()

    def add(value) -> None:
        if value is None:
            return
        if isinstance(value, (list, tuple, set)):
            for v in value:
                add(v)
        elif isinstance(value, torch.Tensor):
            add(value.tolist())
        else:
            ids.add(int(value))

    add(getattr(tokenizer, "eos_token_id", None) if tokenizer is not None else None)
    src = model_or_generation_config
    if src is not None:
        gen = getattr(src, "generation_config", None)
        cfg = getattr(src, "config", None)
        add(getattr(gen if gen is not None else src, "eos_token_id", None))
        if gen is None and cfg is not None:   # a model without a generation config: its config's
            add(getattr(cfg, "eos_token_id", None))
    return sorted(ids)


def load_tokenizer(path: str):
    try:
        tok = AutoTokenizer.from_pretrained(path)
    except (OSError, ValueError) as exc:
        raise ModelUnavailable(f"cannot load the tokenizer of --model {path}: {str(exc).splitlines()[0]}") from None
    if tok.pad_token_id is None:
        tok.pad_token = tok.eos_token
    return tok


def start_runtime(device: torch.device, times: dict[str, float], cudnn_attention: bool = False,
                  fused_logprobs: bool | None = None) -> None:
    """Make the first CUDA call on `device` (its context) now, timed into `times` as 'CUDA init',
    so that a start-up log tells it apart from loading the model: it can take seconds on a GPU
    machine, where a 135M model's weights load in a tenth of one. (transformers' import, seconds
    too, comes with this module's: a worker times it with its role's modules, grpo.workers.)

    On CUDA, scaled_dot_product_attention may use cuDNN's kernels only with `cudnn_attention`.
    torch prefers them on Hopper, but cuDNN builds a graph for every new shape of its inputs,
    and the learner's micro-batches and the sampler's log-prob passes change width every step, so
    the builds land on the host's time of every step (docs/benchmarks.md, "Where a learner step
    goes"). Without cuDNN, SDPA takes FlashAttention or the memory-efficient kernels, which need
    no such build.

    fused_logprobs: every log-prob pass of this process (grpo.model.logprobs) takes the Triton kernels
    of grpo.model.fused_logprobs where they run on `device` and agree with torch's ops (checked here;
    a failed check is said once, and the torch ops stay); None leaves the process's choice as it is."""
    if device.type == "cuda":
        torch.backends.cuda.enable_cudnn_sdp(cudnn_attention)
        t = time.perf_counter()
        torch.empty(1, device=device)
        torch.cuda.synchronize(device)
        times["CUDA init"] = time.perf_counter() - t
    if fused_logprobs is None:
        return
    from grpo.model import fused_logprobs as fused, logprobs
    on = fused_logprobs and fused.available(device)
    if on and (why := fused.check(device)) is not None:
        log.warning("the fused log-prob kernels cannot run here (%s): log-probs with torch's ops", why)
        on = False
    logprobs.use_fused_head(on)


def said_imports(import_s: float | None) -> str:
    """The start-up line's first part: the seconds a worker took to import its role (grpo.workers),
    which brings torch, transformers and this code; '' when no worker timed it (a role built in
    process)."""
    return "" if import_s is None else f"imports (torch, transformers, this code) {import_s:.1f} s, "


def load_causal_lm(path: str, device: torch.device, dtype: torch.dtype, times: dict[str, float] | None = None):
    """The model at `path` on `device` in `dtype`. `times`, when given, gets the seconds of
    'from_pretrained' (config, reading and building the model) and 'to device' (the copy)."""
    t = time.perf_counter()
    try:
        cfg = AutoConfig.from_pretrained(path)
        extra = {}
        if getattr(cfg.get_text_config(decoder=True), "attn_logit_softcapping", None):
            # Soft-capped attention (Gemma2) is exact only in eager attention: transformers' SDPA
            # path cannot cap and, in some versions (5.17), drops the cap without a word, which
            # would give the learner other log-probs than the sampler's engine (which caps).
            extra["attn_implementation"] = "eager"
        if getattr(cfg, "grpo_random_init", False):
            # Same seed, same device type -> the same weights in every process (learner and
            # samplers start from one policy); drawn on the device, where 3B params take ~1 s.
            torch.manual_seed(RANDOM_INIT_SEED)
            if device.type == "cuda":
                torch.cuda.manual_seed(RANDOM_INIT_SEED)
            with device:
                model = AutoModelForCausalLM.from_config(cfg, dtype=dtype, **extra)
        else:
            model = AutoModelForCausalLM.from_pretrained(path, dtype=dtype, **extra)
    except (OSError, ValueError) as exc:
        raise ModelUnavailable(f"cannot load --model {path}: {str(exc).splitlines()[0]}") from None
    t_built = time.perf_counter()
    model = model.to(device)   # (a no-op for random weights, drawn on the device)
    if times is not None:
        times["from_pretrained"] = t_built - t
        times["to device"] = time.perf_counter() - t_built
    return model


def pick_device(device: str, gpu_id: int) -> torch.device:
    """--device/--gpu-id to a torch.device; user mistakes raise ValueError with the fix."""
    if device == "cpu":
        return torch.device("cpu")
    if device not in ("auto", "cuda"):
        raise ValueError(f"--device {device}: choose auto, cuda or cpu")
    if not torch.cuda.is_available():
        if device == "cuda" or gpu_id >= 0:
            raise ValueError(NO_CUDA)
        return torch.device("cpu")
    index = max(gpu_id, 0)
    if index >= torch.cuda.device_count():
        raise ValueError(f"--gpu-id {gpu_id}: this machine has {torch.cuda.device_count()} visible GPU(s) "
                         f"(0..{torch.cuda.device_count() - 1}); pick one of those")
    torch.cuda.set_device(index)
    return torch.device("cuda", index)


def compute_dtype(device: torch.device) -> torch.dtype:
    return torch.bfloat16 if device.type == "cuda" else torch.float32


def weights_checksum(model: torch.nn.Module, dtype: torch.dtype | None = None) -> str:
    """An exact fingerprint of the parameters' bits, computed on their device (after a cast
    of floating-point parameters to `dtype`, when given: the bits a publisher would send).

    Each tensor's raw bits (as integers) are weighted by a position pattern and summed in
    int64, so two ranks agree iff (up to a negligible collision chance) every bit agrees;
    no 6 GB device-to-host copy as a byte hash would need.
    """
    ints = {1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}
    total = 0
    with torch.no_grad():
        for i, (name, p) in enumerate(sorted(model.named_parameters())):
            t = p.detach()
            if dtype is not None and t.is_floating_point():
                t = t.to(dtype)
            bits = t.contiguous().view(-1).view(ints[t.element_size()])
            total = (total * 1000003 + _position_weighted_sum(bits) + i) % (1 << 61)
    return f"{total:016x}"


CHECKSUM_PERIOD = 65521


def _position_weighted_sum(bits: torch.Tensor) -> int:
    """sum(bits[k] * (k % CHECKSUM_PERIOD + 1)) in wrapping int64 arithmetic; bits: [n] integers.

    The weights repeat every CHECKSUM_PERIOD positions, so the bits are summed column-wise over
    rows of that length first (one int64 pass, no n-long weight tensor) and the period's weights
    applied to the column sums: the same value modulo 2**64, as integer addition is associative."""
    n, period = bits.numel(), CHECKSUM_PERIOD
    full = n - n % period
    cols = torch.zeros(period, dtype=torch.int64, device=bits.device)               # [period]
    if full:
        cols += bits[:full].view(-1, period).sum(0, dtype=torch.int64)
    if full < n:
        cols[:n - full] += bits[full:].to(torch.int64)
    weights = torch.arange(1, period + 1, dtype=torch.int64, device=bits.device)   # [period]
    return int((cols * weights).sum())
