"""--model FILE.gguf: any GGUF whose architecture transformers reads converts once into the cache
(keyed by the file's size and content hash), to a folder whose model gives the source model's
logits, whose tokenizer carries the chat template and whose generation config stops on every end
token; one transformers cannot read is refused in one line. Tiny random files (tests/ggufutil.py)."""
import json
import shutil
from pathlib import Path

import pytest
import torch

from ggufutil import SPECIALS, tiny_model, write_gguf, write_other_arch
from grpo.model.gguf import convert as G
from grpo.model.gguf.cache import GGUF_DIGESTS
from grpo.model.gguf.header import ModelUnavailable, end_ids, gguf_config, read_gguf
from grpo.model.load import BUILD_STAMP, build_is_current, eos_ids, load_causal_lm, load_tokenizer
from grpo.model.zoo import resolve_model

CPU = torch.device("cpu")


@pytest.fixture
def cache(tmp_path, monkeypatch):
    folder = tmp_path / "cache"
    monkeypatch.setenv("GRPO_CACHE", str(folder))
    return folder


def ids_of(tok, text: str) -> torch.Tensor:
    return torch.tensor([tok(text)["input_ids"]])


TEXT = "<|im_start|>user\nwhat is 2 + 3?<|im_end|>\n<|im_start|>assistant\nthe answer is 5<|im_end|>"


def converted_logits(path: str, text: str = TEXT):
    tok = load_tokenizer(path)
    model = load_causal_lm(path, CPU, torch.float32).eval()
    ids = ids_of(tok, text)
    with torch.no_grad():
        return tok, model, ids, model(ids).logits


@pytest.mark.parametrize("arch,tie", [("qwen2", False), ("llama", True)])
def test_a_float32_gguf_converts_to_the_source_model(tmp_path, cache, arch, tie):
    source = tiny_model(arch, tie=tie)
    gguf = tmp_path / f"{arch}.gguf"
    tokens = write_gguf(gguf, source, arch)
    path = resolve_model(str(gguf))
    assert path.startswith(str(cache / "gguf-")) and build_is_current(Path(path))
    tok, model, ids, logits = converted_logits(path)
    assert type(model).__name__ == type(source).__name__
    with torch.no_grad():
        torch.testing.assert_close(logits, source(ids).logits, rtol=1e-5, atol=1e-5)
    # the end tokens: the file's EOS (<|im_end|>) is the tokenizer's, its pad <|endoftext|>; generation
    # stops on both, as the hub's generation config of a Qwen2.5 instruct model does
    im_end, endoftext = tokens.index("<|im_end|>"), tokens.index("<|endoftext|>")
    assert (tok.eos_token, tok.eos_token_id) == ("<|im_end|>", im_end)
    assert (tok.pad_token, tok.pad_token_id) == ("<|endoftext|>", endoftext)
    assert sorted(model.generation_config.eos_token_id) == sorted([im_end, endoftext])
    assert eos_ids(tok, model) == sorted([im_end, endoftext])
    assert (model.config.eos_token_id, model.config.pad_token_id) == (im_end, endoftext)
    assert tok.chat_template and "<|im_start|>" in tok.chat_template
    text = tok.apply_chat_template([{"role": "user", "content": "hi"}], tokenize=False, add_generation_prompt=True)
    assert text == "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n"
    assert ids[0].tolist().count(im_end) == 2   # the chat tokens stay whole
    stamp = json.loads((Path(path) / BUILD_STAMP).read_text())
    assert stamp["source"]["size"] == gguf.stat().st_size and path.endswith(stamp["source"]["sha256"][:16])


def test_a_quantised_gguf_gives_the_de_quantised_weights(tmp_path, cache):
    from gguf.constants import GGMLQuantizationType as Q
    from gguf.quants import dequantize, quantize
    from safetensors.torch import load_file

    source = tiny_model("llama", seed=1)
    gguf = tmp_path / "q8.gguf"
    write_gguf(gguf, source, "llama", qtype=Q.Q8_0, pre="smollm")
    path = resolve_model(str(gguf))
    got = load_file(str(Path(path) / "model.safetensors"))
    for name, w in source.state_dict().items():
        want = w if w.dim() == 1 else torch.from_numpy(dequantize(quantize(w.numpy(), Q.Q8_0), Q.Q8_0).copy())
        assert torch.equal(got[name], want.float()), name   # the permutation undone exactly, row for row
    _, _, ids, logits = converted_logits(path)
    with torch.no_grad():
        torch.testing.assert_close(logits, source(ids).logits, rtol=0, atol=0.05)   # Q8_0's rounding only


@pytest.mark.parametrize("arch", ["qwen2", "llama"])
def test_the_fast_path_writes_the_folder_transformers_writes(tmp_path, arch):
    """The one-pass converter against transformers' own GGUF loading, tensor for tensor."""
    from safetensors.torch import load_file

    gguf = tmp_path / f"{arch}.gguf"
    write_gguf(gguf, tiny_model(arch), arch)

    def no_fallback(*args, **kwargs):
        raise AssertionError("the fast path fell back to transformers")

    with pytest.MonkeyPatch.context() as m:
        m.setattr(G, "_gguf_to_hf_transformers", no_fallback)
        G.convert_gguf(gguf, tmp_path / "fast", arch)
    with pytest.MonkeyPatch.context() as m:
        m.setattr(G, "fast_path_reads", lambda metadata: False)
        G.convert_gguf(gguf, tmp_path / "ref", arch)
    fast, ref = load_file(str(tmp_path / "fast" / "model.safetensors")), {}
    for f in (tmp_path / "ref").glob("*.safetensors"):
        ref.update(load_file(str(f)))
    assert sorted(fast) == sorted(ref)
    assert all(torch.equal(fast[k], ref[k]) for k in fast)
    for name in ("config.json", "generation_config.json"):
        a, b = (json.loads((tmp_path / d / name).read_text()) for d in ("fast", "ref"))
        assert a == b, name
    tok_fast, tok_ref = load_tokenizer(str(tmp_path / "fast")), load_tokenizer(str(tmp_path / "ref"))
    for text in (TEXT, "héllo  wörld\n\n 12345 <|endoftext|>", " the lazy dog"):
        assert tok_fast(text)["input_ids"] == tok_ref(text)["input_ids"]
    assert (tok_fast.eos_token, tok_fast.pad_token, tok_fast.chat_template) == \
        (tok_ref.eos_token, tok_ref.pad_token, tok_ref.chat_template)


def test_a_mistral_file_converts_as_transformers_converts_it(tmp_path, cache):
    """llama.cpp writes Mistral as 'llama', and transformers reads such a file as a Llama (the same
    layers at these lengths); so does the fast path."""
    source = tiny_model("mistral")
    gguf = tmp_path / "mistral.gguf"
    write_gguf(gguf, source, "llama", name="Mistral Tiny Instruct")
    with pytest.MonkeyPatch.context() as m:
        m.setattr(G, "fast_path_reads", lambda metadata: False)
        G.convert_gguf(gguf, tmp_path / "ref", "mistral")
    for path in (resolve_model(str(gguf)), str(tmp_path / "ref")):
        tok, model, ids, logits = converted_logits(path)
        assert type(model).__name__ == "LlamaForCausalLM"
        with torch.no_grad():
            torch.testing.assert_close(logits, source(ids).logits, rtol=1e-5, atol=1e-5)
        assert tok.eos_token == "<|im_end|>" and len(eos_ids(tok, model)) == 2


def test_the_second_call_reuses_the_folder_and_the_hash(tmp_path, cache, monkeypatch):
    import hashlib

    gguf = tmp_path / "m.gguf"
    write_gguf(gguf, tiny_model("qwen2"), "qwen2")
    first = resolve_model(str(gguf))

    def no(*args, **kwargs):
        raise AssertionError("converted or hashed again")

    monkeypatch.setattr(G, "convert_gguf", no)
    monkeypatch.setattr(hashlib, "file_digest", no)
    assert resolve_model(str(gguf)) == first
    index = json.loads((cache / GGUF_DIGESTS).read_text())
    assert list(index) == [str(gguf.resolve())]
    # the same bytes elsewhere: hashed (a new path), but the same folder, not converted again
    monkeypatch.undo()
    monkeypatch.setenv("GRPO_CACHE", str(cache))
    copy = tmp_path / "elsewhere" / "copy.gguf"
    copy.parent.mkdir()
    shutil.copy(gguf, copy)
    monkeypatch.setattr(G, "convert_gguf", no)
    assert resolve_model(str(copy)) == first
    # other bytes: a folder of their own
    monkeypatch.undo()
    monkeypatch.setenv("GRPO_CACHE", str(cache))
    write_gguf(gguf, tiny_model("qwen2", seed=5), "qwen2")
    assert resolve_model(str(gguf)) != first
    assert sorted(p.name for p in cache.iterdir() if p.is_dir()) == sorted(
        [Path(first).name, Path(resolve_model(str(gguf))).name])


def test_an_architecture_transformers_cannot_read_is_one_line(tmp_path, cache):
    gguf = tmp_path / "other.gguf"
    write_other_arch(gguf, "rwkv6")
    with pytest.raises(ModelUnavailable) as err:
        resolve_model(str(gguf))
    msg = str(err.value)
    assert "\n" not in msg and "'rwkv6'" in msg and "qwen2" in msg and "llama" in msg
    assert msg.startswith(f"--model {gguf}: GGUF architecture 'rwkv6' cannot be de-quantised by transformers")
    assert not [p for p in cache.iterdir() if p.is_dir()]   # nothing half-built left


def test_paths_that_are_no_model_are_one_line(tmp_path, cache, monkeypatch):
    not_gguf = tmp_path / "x.gguf"
    not_gguf.write_bytes(b"NOPE" + bytes(20))
    empty = tmp_path / "empty"
    empty.mkdir()
    for name, says in ((str(tmp_path / "missing.gguf"), "no such file or folder"), ("missing.gguf", "no such file"),
                       (str(not_gguf), "not a GGUF file"), (str(empty), "no config.json there")):
        with pytest.raises(ModelUnavailable, match=says) as err:
            resolve_model(name)
        assert "\n" not in str(err.value)
    # a hub id is no path: it passes to transformers as it is (the hub's own check, grpo.model.hub,
    # answered "loadable" here; tests/test_model_hub.py holds its other answers)
    monkeypatch.setattr("grpo.model.zoo.check_hub_model", lambda name: None)
    assert resolve_model("Qwen/Qwen2.5-0.5B-Instruct") == "Qwen/Qwen2.5-0.5B-Instruct"


def test_end_ids_follow_llama_cpp():
    tokens = ["a", "<|endoftext|>", "<|im_end|>", "<|eot_id|>", "</s>", "<end_of_turn>", "b"]
    assert end_ids({"tokenizer.ggml.tokens": tokens, "tokenizer.ggml.eos_token_id": 2}) == [2, 1, 3, 5]
    # eot/eom ids come after the EOS; </s> counts only as the file's EOS
    assert end_ids({"tokenizer.ggml.tokens": tokens, "tokenizer.ggml.eos_token_id": 4,
                    "tokenizer.ggml.eot_token_id": 6}) == [4, 6, 1, 2, 3, 5]
    assert end_ids({"tokenizer.ggml.tokens": ["x"]}) == []


def test_the_header_gives_the_plan_the_converted_shape(tmp_path, cache):
    """The launcher's memory plan reads a GGUF's shape from its header alone (no torch), before any
    conversion: the same parameter count as the converted model."""
    from grpo.launch import probe

    for arch, tie in (("qwen2", False), ("llama", True)):
        source = tiny_model(arch, tie=tie)
        gguf = tmp_path / f"{arch}.gguf"
        write_gguf(gguf, source, arch)
        header = gguf_config(gguf)
        assert (header["model_type"], header["attention_bias"], header["tie_word_embeddings"]) == \
            (arch, arch == "qwen2", tie)
        shape, note = probe.read_shape(str(gguf))
        assert note == "" and shape.params == sum(p.numel() for p in source.parameters())
        assert (shape.layers, shape.hidden, shape.vocab, shape.kv_dim) == (2, 64, source.config.vocab_size, 32)
    assert not cache.exists()   # read, not converted
    bad = tmp_path / "bad.gguf"
    bad.write_bytes(b"NOPE" + bytes(20))
    assert probe.read_shape(str(bad)) == (None, f"memory plan skipped: cannot read the GGUF header of {bad}: "
                                                 f"{bad} is not a GGUF file")


def test_the_launcher_refuses_a_missing_model_path_before_any_run_folder(tmp_path, monkeypatch, capsys):
    from grpo.launch import main as launch_main

    monkeypatch.chdir(tmp_path)
    missing = tmp_path / "nonexistent.gguf"
    assert launch_main.main(["--device", "cpu", "--model", str(missing), "--run-dir", str(tmp_path / "run")]) == 2
    err = capsys.readouterr().err.strip()
    assert err == f"run_distributed.py: error: --model {missing}: no such file or folder; pass an existing path, " \
                  f"a hub id, or a short name: smollm2, qwen2.5-coder-0.5b, qwen2.5-coder-1.5b"
    assert not (tmp_path / "run").exists() and not (tmp_path / "runs").exists()


def test_the_header_reader_reads_what_gguf_writes(tmp_path):
    gguf = tmp_path / "m.gguf"
    tokens = write_gguf(gguf, tiny_model("qwen2"), "qwen2")
    metadata, table, buf = read_gguf(gguf)
    buf.close()
    assert metadata["tokenizer.ggml.tokens"] == tokens and tokens[-3:] == SPECIALS
    assert metadata["tokenizer.chat_template"].startswith("{% for message in messages %}")
    assert {"blk.0.attn_q.bias", "output.weight"} <= {name for name, *_ in table}
