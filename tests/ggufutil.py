"""Tiny random GGUF files, written as llama.cpp's convert_hf_to_gguf.py writes them: a gpt2-style
byte-level BPE vocabulary with merges, the chat tokens, a chat template, and a small random
Hugging Face model's tensors under llama.cpp's names (a Llama's q/k rows permuted for its rotary
layout), in float32 or a quantised type."""
from __future__ import annotations

import json
from functools import lru_cache

import numpy as np
import torch

SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
CHAT_TEMPLATE = ("{% for message in messages %}{{'<|im_start|>' + message['role'] + '\n' + message['content'] + "
                 "'<|im_end|>' + '\n'}}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}"
                 "{% endif %}")
TEXT = ["the quick brown fox jumps over the lazy dog", "hello world, hello there", "what is 2 + 3? the answer is 5",
        "assistant user system message content"]


@lru_cache(maxsize=1)
def bpe_vocab(n_merges: int = 40) -> tuple[tuple[str, ...], tuple[str, ...]]:
    """(tokens, merges): the 256 byte-level symbols and n_merges merges learned on TEXT."""
    from tokenizers import Tokenizer, models, pre_tokenizers, trainers
    from transformers.convert_slow_tokenizer import bytes_to_unicode

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    alphabet = sorted(bytes_to_unicode().values())
    trainer = trainers.BpeTrainer(vocab_size=len(alphabet) + n_merges, initial_alphabet=alphabet,
                                  show_progress=False)
    tok.train_from_iterator(TEXT * 20, trainer)
    model = json.loads(tok.to_str())["model"]
    tokens = sorted(model["vocab"], key=model["vocab"].get)
    merges = [m if isinstance(m, str) else " ".join(m) for m in model["merges"]]
    return tuple(tokens), tuple(merges)


def vocab_size() -> int:
    return len(bpe_vocab()[0]) + len(SPECIALS)


def tiny_model(kind: str = "qwen2", tie: bool = False, seed: int = 0):
    """A 2-layer random model (hidden 64, 4 heads, 2 KV heads) of `kind` (qwen2, llama, mistral) over
    the vocabulary above; norms and biases moved off their 1/0 start so that a mix-up shows."""
    import transformers

    names = {"qwen2": "Qwen2", "llama": "Llama", "mistral": "Mistral"}[kind]
    cfg = getattr(transformers, f"{names}Config")(
        vocab_size=vocab_size(), hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, max_position_embeddings=256, tie_word_embeddings=tie, rms_norm_eps=1e-6,
        rope_theta=10000.0)
    torch.manual_seed(seed)
    model = getattr(transformers, f"{names}ForCausalLM")(cfg).eval()
    with torch.no_grad():
        for p in model.parameters():
            if p.dim() == 1:
                p.add_(torch.randn_like(p) * 0.1)
    return model


_BLOCK = {"input_layernorm": "attn_norm", "post_attention_layernorm": "ffn_norm", "self_attn.q_proj": "attn_q",
          "self_attn.k_proj": "attn_k", "self_attn.v_proj": "attn_v", "self_attn.o_proj": "attn_output",
          "mlp.gate_proj": "ffn_gate", "mlp.up_proj": "ffn_up", "mlp.down_proj": "ffn_down"}
_TOP = {"model.embed_tokens": "token_embd", "model.norm": "output_norm", "lm_head": "output"}


def permute(w: np.ndarray, n_head: int) -> np.ndarray:
    """llama.cpp's rotary permutation of a Llama's q/k rows (convert_hf_to_gguf.py, LlamaModel.permute)."""
    return w.reshape(n_head, 2, w.shape[0] // n_head // 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def write_gguf(path, model, arch: str = "qwen2", qtype=None, name: str = "tiny", eos: str = "<|im_end|>",
               pad: str | None = "<|endoftext|>", bos: str = "<|endoftext|>", pre: str = "qwen2") -> list[str]:
    """Write `model` as a GGUF of `arch` at `path`; its tokens. qtype: a gguf GGMLQuantizationType for the
    2-D weights (norms and biases stay float32). A Llama's (and a Mistral's, which llama.cpp writes as
    'llama') q/k rows are permuted as llama.cpp permutes them."""
    import gguf
    from gguf.quants import quantize

    cfg = model.config
    vocab, merges = bpe_vocab()
    tokens = list(vocab) + SPECIALS
    w = gguf.GGUFWriter(str(path), arch)
    w.add_name(name)
    for key, value in (("block_count", cfg.num_hidden_layers), ("context_length", cfg.max_position_embeddings),
                       ("embedding_length", cfg.hidden_size), ("feed_forward_length", cfg.intermediate_size),
                       ("attention.head_count", cfg.num_attention_heads),
                       ("attention.head_count_kv", cfg.num_key_value_heads),
                       ("rope.dimension_count", cfg.hidden_size // cfg.num_attention_heads)):
        w.add_uint32(f"{arch}.{key}", value)
    w.add_float32(f"{arch}.rope.freq_base", 10000.0)
    w.add_float32(f"{arch}.attention.layer_norm_rms_epsilon", cfg.rms_norm_eps)
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre(pre)
    w.add_token_list(tokens)
    w.add_token_types([1] * len(vocab) + [3] * len(SPECIALS))   # 1 normal, 3 control
    w.add_token_merges(list(merges))
    w.add_bos_token_id(tokens.index(bos))
    w.add_eos_token_id(tokens.index(eos))
    if pad is not None:
        w.add_pad_token_id(tokens.index(pad))
    w.add_add_bos_token(False)
    w.add_chat_template(CHAT_TEMPLATE)
    for hf, t in model.state_dict().items():
        if hf == "lm_head.weight" and cfg.tie_word_embeddings:
            continue
        stem, _, suffix = hf.rpartition(".")
        parts = stem.split(".")
        g = _TOP[stem] if stem in _TOP else f"blk.{parts[2]}.{_BLOCK['.'.join(parts[3:])]}"
        arr = t.detach().float().numpy()
        if arch == "llama" and suffix == "weight" and g.endswith(("attn_q", "attn_k")):
            arr = permute(arr, cfg.num_attention_heads if g.endswith("attn_q") else cfg.num_key_value_heads)
        if qtype is not None and arr.ndim == 2:
            w.add_tensor(f"{g}.{suffix}", quantize(arr, qtype), raw_dtype=qtype)
        else:
            w.add_tensor(f"{g}.{suffix}", np.ascontiguousarray(arr, dtype=np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return tokens


def write_other_arch(path, arch: str = "rwkv6") -> None:
    """A small GGUF of an architecture with its own layout (one tensor, a tokenizer): for refusals."""
    import gguf

    vocab, merges = bpe_vocab()
    w = gguf.GGUFWriter(str(path), arch)
    w.add_name("tiny-other")
    w.add_uint32(f"{arch}.block_count", 1)
    w.add_uint32(f"{arch}.embedding_length", 32)
    w.add_tokenizer_model("gpt2")
    w.add_token_list(list(vocab) + SPECIALS)
    w.add_eos_token_id(len(vocab) + 2)
    w.add_tensor("token_embd.weight", np.zeros((len(vocab) + len(SPECIALS), 32), dtype=np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
