"""--liger-decode in our engine: where Liger cannot run (CPU) the model is left as it is; where it
does, its module-level names are in place only inside the engine's passes (a real Llama, a real
patch of its modelling module with counting stand-ins for Liger's kernels: tests/learner/
test_kernels.py's), so a forward outside the engine (a log-prob pass, another model of the type)
runs Hugging Face's. Liger's kernels themselves are checked on a GPU (test_liger_decode_gpu.py)."""
from __future__ import annotations

import torch
from ligerutil import liger_like_patch, tiny_llama
from transformers.models.llama import modeling_llama

from grpo.generate.engine import RolloutEngine, decode_layers
from grpo.model.liger import scoped_patch

CPU = torch.device("cpu")


def test_on_cpu_the_engine_keeps_hugging_faces_layers():
    model = tiny_llama()
    before = {n: m.forward for n, m in model.named_modules()}
    assert decode_layers(model, True, CPU) is None
    eng = RolloutEngine(model, 2, 0, cuda_graphs=False)
    assert eng.layers is None and {n: m.forward for n, m in model.named_modules()} == before


def test_the_patchs_names_are_in_place_only_inside_the_engines_passes():
    calls = {"rope": 0, "norm": 0}
    hf_rope = modeling_llama.apply_rotary_pos_emb
    apply, rope, _ = liger_like_patch(calls)
    model = tiny_llama()
    want = RolloutEngine(tiny_llama(), 2, 0, cuda_graphs=False).generate([[5, 6, 7], [9]], 6, greedy=True).token_ids
    eng = RolloutEngine(model, 2, 0, cuda_graphs=False)
    eng.layers = scoped_patch(apply, model)
    assert modeling_llama.apply_rotary_pos_emb is hf_rope      # scoped at once
    got = eng.generate([[5, 6, 7], [9]], 6, greedy=True).token_ids
    # the prefill and 5 decode steps, 3 layers each, through the patched rotary function
    assert calls["rope"] == 6 * 3 and got == want
    assert modeling_llama.apply_rotary_pos_emb is hf_rope
    calls["rope"] = calls["norm"] = 0
    with torch.no_grad():
        model(input_ids=torch.tensor([[5, 6, 7]]))            # outside the engine: Hugging Face's rotary
    assert calls["rope"] == 0 and calls["norm"] == 3           # the instance's norms stay patched
    with eng.passes():
        assert modeling_llama.apply_rotary_pos_emb is rope
    assert modeling_llama.apply_rotary_pos_emb is hf_rope


def test_the_samplers_pass_over_its_policy_runs_the_decodes_layers_and_the_references_does_not():
    """RolloutWorkflow._logprobs (old log-probs by a teacher-forced pass): over the policy, inside the
    engine's layers' scope (the patched rotary function); over another model (the reference), outside
    it. The stand-ins compute what Hugging Face's layers do, so the values are token_logprobs'."""
    from types import SimpleNamespace

    from grpo.model.logprobs import right_pad, token_logprobs
    from grpo.sampler.workflow import RolloutWorkflow

    calls = {"rope": 0, "norm": 0}
    apply, _, _ = liger_like_patch(calls)
    policy, ref = tiny_llama(), tiny_llama()
    eng = RolloutEngine(policy, 2, 0, cuda_graphs=False)
    eng.layers = scoped_patch(apply, policy)
    wf = RolloutWorkflow.__new__(RolloutWorkflow)
    wf.policy, wf.engine, wf.device = policy, eng, CPU
    wf.tok = SimpleNamespace(pad_token_id=0)
    wf.cfg = SimpleNamespace(rollout=SimpleNamespace(logprob_batch_size=2, temperature=1.0))
    whole, plens = [[5, 6, 7, 8, 9], [4, 3, 2], [7, 7, 7, 7]], [2, 1, 3]
    got = wf._logprobs(policy, whole, plens)
    assert calls["rope"] == 2 * 3                              # two micro-batches, three layers
    ids, mask = right_pad(whole, 0, CPU)
    with torch.no_grad():
        want = token_logprobs(policy, ids, mask, 1.0)
    for i, (w, p) in enumerate(zip(whole, plens)):
        torch.testing.assert_close(torch.from_numpy(got[i]), want[i, p - 1:len(w) - 1])
    calls["rope"] = 0
    wf._logprobs(ref, whole, plens)
    assert calls["rope"] == 0 and modeling_llama.apply_rotary_pos_emb.__name__ == "apply_rotary_pos_emb"


def test_a_patch_that_fails_the_test_decode_is_undone_and_the_engine_keeps_hugging_faces(monkeypatch, caplog):
    """Where Liger's layers fail the engine's test decode (a Triton kernel that cannot compile on this
    GPU, say), the engine warns, undoes the instance's patch (every module's attributes as before)
    and decodes with Hugging Face's layers, not with Hugging Face generate."""
    from types import MethodType

    import grpo.generate.engine as engine_mod

    def broken(model):
        def forward(self, x):
            raise RuntimeError("triton: no kernel image for this GPU")
        for layer in model.model.layers:
            layer.input_layernorm.forward = MethodType(forward, layer.input_layernorm)
            layer.mlp.act_shape = "patched"
    monkeypatch.setattr(engine_mod, "decode_layers", lambda model, wanted, device: scoped_patch(broken, model))
    model = tiny_llama()
    before = [dict(m.__dict__) for m in model.modules()]
    eng = RolloutEngine(model, 2, 0, cuda_graphs=False)
    assert eng.layers is None and eng.fallback is None
    assert "Liger's failed a test decode" in caplog.text and "no kernel image" in caplog.text
    assert [m.__dict__.keys() for m in model.modules()] == [b.keys() for b in before]
    want = RolloutEngine(tiny_llama(), 2, 0, cuda_graphs=False, liger_layers=False)
    assert eng.generate([[5, 6, 7], [9]], 6, greedy=True).token_ids == \
        want.generate([[5, 6, 7], [9]], 6, greedy=True).token_ids


def test_fused_sampling_that_cannot_run_leaves_torchs_ops(monkeypatch, caplog):
    """A Triton that cannot compile the kernel here: one warning at start-up, and torch's sampling."""
    import grpo.generate.engine as engine_mod
    from grpo.generate import fused_sampling

    def no_triton():
        raise RuntimeError("0 active drivers ([]). There should only be one.")
    monkeypatch.setattr(engine_mod, "fused_available", lambda device: True)
    monkeypatch.setattr(fused_sampling, "_compile", no_triton)
    eng = RolloutEngine(tiny_llama(), 2, 0, cuda_graphs=False)
    assert not eng.fused and eng.seed is None and not eng.ring.fused
    assert "fused sampling cannot run here (RuntimeError: 0 active drivers" in caplog.text
    assert len(eng.generate([[5, 6, 7]], 4, greedy=True).token_ids[0]) == 4


def test_an_evaluation_that_decodes_the_training_module_itself_leaves_it_as_it_was(monkeypatch):
    """grpo.generate.greedy.decoding on a module it does not copy (already in the compute dtype): the
    engine's patch is on the module while it decodes, and taken off after (the learner trains on)."""
    import grpo.generate.engine as engine_mod
    from grpo.generate.greedy import decoding

    calls = {"rope": 0, "norm": 0}
    apply, _, _ = liger_like_patch(calls)
    monkeypatch.setattr(engine_mod, "decode_layers", lambda model, wanted, device: scoped_patch(apply, model))
    module = tiny_llama()
    norm = module.model.layers[0].input_layernorm
    tok = type("Tok", (), {"pad_token_id": 0, "eos_token_id": 2})()
    with decoding(module, tok, "fast", CPU) as (model, engine):
        assert model is module and engine.layers is not None and "forward" in norm.__dict__
        engine.generate([[5, 6, 7]], 3, greedy=True)
    assert calls["rope"] > 0 and "forward" not in norm.__dict__
