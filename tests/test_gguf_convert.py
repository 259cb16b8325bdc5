"""The fast GGUF -> Hugging Face conversion of the default model gives the folder transformers' own
GGUF loading gives: the same tensors bit for bit, config, generation config and tokenizer."""
import functools
import logging
import random

import pytest
import torch

from grpo.model import zoo
from grpo.model.gguf import convert as G
from grpo.model.gguf.header import ModelUnavailable, find_gguf
from grpo.model.load import build_is_current, load_tokenizer

BOOKKEEPING = {"transformers_version", "_name_or_path", "quantization_config", "dtype", "torch_dtype"}


def _share_transformers_reads(m):
    """transformers' GGUF loading opens the file with gguf.GGUFReader three times (config, tokenizer,
    weights) and builds gguf's tensor-name table once per module of the model: pure reads of the same
    file and the same (architecture, blocks), so the reference conversion shares one of each. What
    transformers computes from them is its own code, unchanged."""
    import gguf

    readers = {}

    def reader(path, *args, **kwargs):
        key = (str(path), args, tuple(sorted(kwargs.items())))
        if key not in readers:
            readers[key] = real_reader(path, *args, **kwargs)
        return readers[key]

    real_reader = gguf.GGUFReader
    m.setattr(gguf, "GGUFReader", reader)
    m.setattr(gguf, "get_tensor_name_map", functools.lru_cache(maxsize=None)(gguf.get_tensor_name_map))


@pytest.fixture(scope="module")
def folders(tmp_path_factory):
    """(fast folder, transformers folder, warnings logged by the fallback conversion)."""
    try:
        find_gguf()
    except ModelUnavailable as exc:
        pytest.skip(f"no SmolLM2 GGUF here: {exc}")
    cache = tmp_path_factory.mktemp("cache")
    mp = pytest.MonkeyPatch()
    mp.setenv("GRPO_CACHE", str(cache))
    try:
        # The fast path, with the fallback made to fail: the folder must come from the fast path.
        def no_fallback(*args, **kwargs):
            raise AssertionError("the fast GGUF conversion fell back to transformers' loader")

        with pytest.MonkeyPatch.context() as m:
            m.setattr(G, "_gguf_to_hf_transformers", no_fallback)
            zoo._convert_smollm2(cache / "fast")
        # The reference: the fast path made to fail, so _convert_smollm2 falls back to transformers.
        def broken(*args, **kwargs):
            raise RuntimeError("simulated API change")

        records = []
        handler = logging.Handler(logging.WARNING)
        handler.emit = records.append
        G.log.addHandler(handler)
        try:
            with pytest.MonkeyPatch.context() as m:
                m.setattr(G, "_gguf_to_hf_fast", broken)
                _share_transformers_reads(m)
                zoo._convert_smollm2(cache / "reference")
        finally:
            G.log.removeHandler(handler)
        yield cache / "fast", cache / "reference", [r.getMessage() for r in records]
    finally:
        mp.undo()


def test_the_fallback_warns_once_and_still_builds_a_folder(folders):
    fast, ref, warnings = folders
    assert len(warnings) == 1 and "simulated API change" in warnings[0], warnings
    for folder in (fast, ref):
        assert build_is_current(folder)
        assert not list(folder.parent.glob(folder.name + ".tmp*"))
    assert sorted(p.name for p in fast.iterdir()) == sorted(p.name for p in ref.iterdir())


def test_same_tensors_bit_for_bit(folders):
    from safetensors.torch import load_file

    fast, ref, _ = folders
    a, b = load_file(str(fast / "model.safetensors")), load_file(str(ref / "model.safetensors"))
    assert sorted(a) == sorted(b)
    assert len(a) == 2 + 9 * 30   # SmolLM2-135M: embeddings, final norm, 30 blocks of 9; lm_head tied
    for name in a:
        assert a[name].dtype == b[name].dtype == torch.float32, name
        assert torch.equal(a[name], b[name]), name


def test_same_config_and_generation_config(folders):
    from transformers import AutoConfig, GenerationConfig

    fast, ref, _ = folders

    def fields(cfg):
        return {k: v for k, v in cfg.to_dict().items() if k not in BOOKKEEPING}

    cfg_fast, cfg_ref = AutoConfig.from_pretrained(fast), AutoConfig.from_pretrained(ref)
    assert fields(cfg_fast) == fields(cfg_ref)
    assert (cfg_fast.eos_token_id, cfg_fast.pad_token_id, cfg_fast.tie_word_embeddings) == (2, 2, True)
    gen_fast, gen_ref = GenerationConfig.from_pretrained(fast), GenerationConfig.from_pretrained(ref)
    assert fields(gen_fast) == fields(gen_ref)
    assert (gen_fast.eos_token_id, gen_fast.pad_token_id) == (2, 2)


def _strings() -> list[str]:
    fixed = [
        "", " ", "  ", "\n", "\n\n", "\t", " \t \n  x", "Hello, world!", "hello world", " Hello", "Hello ",
        "12345", "3.14159", "1,000,000", "2024-06-01T12:00:00Z", "x = 3 * (4 + 5) / 6 - 7", "0x1F 0b1010 1e-9",
        "The quick brown fox jumps over the lazy dog.", "don't won't I'm you're they've we'll she'd",
        "def f(x):\n    return x ** 2\n", "for (int i = 0; i < n; ++i) { a[i] = i; }",
        "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n", "<|endoftext|>", "<|im_end|><|im_end|>",
        "<repo_name>grpo<file_sep>model.py", "<|im_start|", "im_end|>", "<|IM_END|>",
        "héllo wörld", "naïve café", "Привет, мир", "你好，世界", "こんにちは", "안녕하세요", "مرحبا بالعالم",
        "🙂🚀👍🏽", "e\u0301", "\u00a0nbsp\u2003em", "zero\u200bwidth", "a" * 300, "ab " * 100,
        "     leading", "trailing     ", "mid     dle", "\r\n\r\n", "$$\\frac{a}{b}$$", "<think>x</think>",
        "#### 42", "Answer: 7\n\nSo the answer is 7.", "!!!???...", "~!@#$%^&*()_+`-=[]{}|;':\",./<>?",
    ]
    rng = random.Random(1234)
    pool = (list("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789") + [" ", "  ", "\n", "\t", "   "]
            + list(".,;:!?'\"()[]{}-_+=*/\\<>@#$%^&|~`") + list("éüßøçñあ中я€😀\u200d\u0301")
            + ["<|im_start|>", "<|im_end|>", "<|endoftext|>", " the", "ing", "tion", "123", "0.5"])
    generated = ["".join(rng.choice(pool) for _ in range(rng.randint(1, 40))) for _ in range(250)]
    return fixed + generated


def test_same_tokenizer(folders):
    fast, ref, _ = folders
    tok_fast, tok_ref = load_tokenizer(str(fast)), load_tokenizer(str(ref))
    assert type(tok_fast) is type(tok_ref)
    assert len(tok_fast) == len(tok_ref) == 49152
    assert (tok_fast.eos_token_id, tok_fast.pad_token_id) == (tok_ref.eos_token_id, tok_ref.pad_token_id) == (2, 2)
    assert (tok_fast.bos_token_id, tok_fast.unk_token_id) == (tok_ref.bos_token_id, tok_ref.unk_token_id)
    assert tok_fast.all_special_tokens == tok_ref.all_special_tokens
    assert tok_fast.chat_template == tok_ref.chat_template and tok_fast.chat_template
    strings = _strings()
    ids_fast, ids_ref = tok_fast(strings)["input_ids"], tok_ref(strings)["input_ids"]
    assert ids_fast == ids_ref
    for ids, s in zip(ids_fast, strings):
        assert tok_fast.decode(ids) == tok_ref.decode(ids)
        assert tok_fast.decode(ids, skip_special_tokens=True) == tok_ref.decode(ids, skip_special_tokens=True)
    assert tok_fast("<|im_end|>")["input_ids"] == [2]
    for messages in ([{"role": "user", "content": "What is 2 + 3?"}],
                     [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "héllo 🙂\n\n  x"},
                      {"role": "assistant", "content": "Hi! 42"}]):
        for gen in (False, True):
            text_fast = tok_fast.apply_chat_template(messages, tokenize=False, add_generation_prompt=gen)
            assert text_fast == tok_ref.apply_chat_template(messages, tokenize=False, add_generation_prompt=gen)
            assert tok_fast(text_fast)["input_ids"] == tok_ref(text_fast)["input_ids"]
            assert 2 in tok_fast(text_fast)["input_ids"]
