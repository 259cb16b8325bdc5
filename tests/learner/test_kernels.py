"""--liger-kernel: the choice worked by hand, the patch's module-level names scoped to the learner's
passes (a real Llama, a real patch of its modelling module), and the worker's one line where Liger
cannot run. Liger's own kernels are Triton kernels (CUDA): their values against Hugging Face's are
bench/learner_kernels.py's."""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import torch
from transformers.models.llama import modeling_llama

from grpo.generate.greedy import decode_copy
from grpo.model.liger import FusedLayers, liger_choice, scoped_patch
from ligerutil import liger_like_patch, tiny_llama
from grpo.learner.step import TrainStep
from grpo.model.logprobs import token_logprobs

REPO = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize("choice, cuda, installed, supported, want", [
    ("off", True, True, True, False),
    ("auto", True, True, True, True),
    ("on", True, True, True, True),
    ("auto", False, True, True, False),      # CPU: Triton kernels cannot run
    ("auto", True, False, True, False),      # not installed
    ("auto", True, True, False, False),      # a model type Liger has no kernels for
])
def test_liger_choice_by_hand(choice, cuda, installed, supported, want):
    use, why = liger_choice(choice, cuda, installed, supported)
    assert use is want and why


@pytest.mark.parametrize("cuda, installed, supported, says", [
    (False, True, True, "need a CUDA device"), (True, False, True, "pip install liger-kernel"),
    (True, True, False, "no kernels for this model type")])
def test_liger_on_where_it_cannot_run_names_the_fix(cuda, installed, supported, says):
    with pytest.raises(ValueError, match=says) as err:
        liger_choice("on", cuda, installed, supported)
    assert "--liger-kernel off" in str(err.value)
    with pytest.raises(ValueError, match="choose one of auto, on, off"):
        liger_choice("yes", True, True, True)


def test_the_patch_names_are_in_place_only_for_the_learners_passes():
    hf_rope, hf_norm = modeling_llama.apply_rotary_pos_emb, modeling_llama.LlamaRMSNorm
    calls = {"rope": 0, "norm": 0}
    apply, rope, norm_cls = liger_like_patch(calls)
    model, plain = tiny_llama(), tiny_llama()
    fused = scoped_patch(apply, model)
    # the module's names are Hugging Face's again; the two the patch changed are kept for the passes
    assert modeling_llama.apply_rotary_pos_emb is hf_rope and modeling_llama.LlamaRMSNorm is hf_norm
    assert sorted((n, new) for _, n, _, new in fused.names) == sorted([("apply_rotary_pos_emb", rope),
                                                                      ("LlamaRMSNorm", norm_cls)], key=str)
    ids = torch.randint(3, 300, (2, 9), generator=torch.Generator().manual_seed(1))
    mask = torch.ones_like(ids)
    mask[1, 6:] = 0
    step = TrainStep.__new__(TrainStep)
    step.autocast, step.fused = False, fused
    want = token_logprobs(plain, ids, mask, 1.0)                # [2, 8]
    with step.amp():
        assert modeling_llama.apply_rotary_pos_emb is rope
        got = token_logprobs(model, ids, mask, 1.0)
    assert calls == {"rope": 3, "norm": 3}                     # one of each per layer, in the scope
    assert modeling_llama.apply_rotary_pos_emb is hf_rope and modeling_llama.LlamaRMSNorm is hf_norm
    torch.testing.assert_close(got, want, rtol=0, atol=0)
    # outside the scope: the instance's own norms stay patched, the module's rotary function does not
    token_logprobs(model, ids, mask, 1.0)
    assert calls == {"rope": 3, "norm": 6}
    # an evaluation's decode copy is built from the config: Hugging Face's classes, no patched forward
    copy = decode_copy(model, torch.bfloat16)
    assert type(copy.model.layers[0].input_layernorm) is hf_norm
    assert "forward" not in vars(copy.model.layers[0].input_layernorm)
    # a patch that fails half-way leaves the module's names as they were
    def failing(m):
        modeling_llama.apply_rotary_pos_emb = rope
        raise RuntimeError("a patch that fails")
    with pytest.raises(RuntimeError, match="a patch that fails"):
        scoped_patch(failing, tiny_llama())
    assert modeling_llama.apply_rotary_pos_emb is hf_rope
    # an error inside the scope still puts the names back
    with pytest.raises(RuntimeError), fused.passes():
        raise RuntimeError("a failed pass")
    assert modeling_llama.apply_rotary_pos_emb is hf_rope


def test_no_fused_layers_is_plain_autocast_scope():
    step = TrainStep.__new__(TrainStep)
    step.autocast, step.fused = False, None
    before = modeling_llama.apply_rotary_pos_emb
    with step.amp():
        assert modeling_llama.apply_rotary_pos_emb is before
    assert FusedLayers().names == []


def test_the_learner_refuses_liger_on_on_cpu_in_one_line(tmp_path):
    r = subprocess.run([sys.executable, "training_worker.py", "--device", "cpu", "--model", "tiny-random",
                        "--liger-kernel", "on", "--run-dir", str(tmp_path / "run")],
                       cwd=REPO, capture_output=True, text=True, timeout=120)
    lines = r.stderr.strip().splitlines()
    assert r.returncode == 2 and len(lines) == 1, (r.returncode, r.stderr)
    assert "--liger-kernel on" in lines[0] and "CUDA" in lines[0] and "--liger-kernel off" in lines[0]
    assert not (tmp_path / "run" / "learner.ready").exists()   # refused before any port was bound
