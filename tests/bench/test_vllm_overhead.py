"""bench/vllm_overhead.py's result names: one file per mode and model, so a 7B probe never
overwrites the 0.5B one of the same mode (it did, once, on the device)."""
from benchload import load_bench

from grpo.model.fetch import MODELS


def test_model_tag_names_registry_files_by_their_short_name_and_slugs_the_rest():
    v = load_bench("vllm_overhead")
    assert v.model_tag("/tmp/gguf/qwen2.5-coder-0.5b-instruct-q4_k_m.gguf") == "qwen2.5-coder-0.5b"
    assert v.model_tag(MODELS["qwen2.5-coder-1.5b"]["file"]) == "qwen2.5-coder-1.5b"
    assert v.model_tag("random:qwen2.5-7b") == "random-qwen2.5-7b"
    assert v.model_tag("Qwen/Qwen2.5-7B-Instruct") == "Qwen2.5-7B-Instruct"
    assert v.model_tag("/models/my model.gguf") == "my-model"
