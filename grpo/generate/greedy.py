"""Greedy decoding for the held-out evaluation (grpo.evaluate picks the problems and scores what
this decodes): which decoder (eval_engine), a training module's copy in the compute dtype
(decode_copy, decoding), the decoding itself (decode), and the evaluate command's model
(load_to_decode).

grpo.evaluate imports this module only where it decodes: its command refuses a bad flag or
--dataset before torch loads (this module imports transformers at its top).
"""
from __future__ import annotations

import contextlib

import torch
from transformers import AutoModelForCausalLM, PreTrainedModel

from grpo.generate.backend import resolve_backend
from grpo.generate.engine import RolloutEngine
from grpo.generate.vllm_engine import VLLM, VllmEngine, check_vllm, plan_share
from grpo.model.load import compute_dtype, eos_ids, load_tokenizer, pick_device, start_runtime
from grpo.model.logprobs import left_pad
from grpo.model.saved import FoundModel, load_found
from grpo.obs.progress import Progress


def eval_engine(model, tok, backend: str, device: torch.device, liger: bool = True):
    """The decoder a greedy evaluation uses: the rollout engine where --generation-backend resolves
    to 'fast' (CUDA by default), else None (Hugging Face `generate`). Sampler 0 (the baseline),
    the learner (the final weights) and the evaluate command all decide by this one rule, so a
    run's accuracies before and after come from the same decoder: in learning run 7 the two
    decoders, on the same bf16 weights, differed by 2 of 500 problems. vLLM's engine lives in a
    sampler (grpo.generate.vllm_engine), beside whose memory the learner has no room for a second:
    a vllm run's learner decodes its final weights with our engine, the faster of the other two (sampler
    0's evaluations decode with vLLM's). liger: --liger-decode, Liger's layers in the engine where they
    run, as in the samplers' engines."""
    if resolve_backend(backend, device) == "hf":
        return None
    return RolloutEngine(model, eos_ids(tok, model), tok.pad_token_id, cuda_graphs=device.type == "cuda",
                         liger_layers=liger)


def decode_copy(module, dtype: torch.dtype):
    """A copy of a Hugging Face causal LM in `dtype` on the module's device, for decoding (None when
    the module already is in `dtype`, or is not a plain transformers model: a PEFT wrapper, say).
    Built from the module's config and filled from its state dict (copy_ casts each tensor), so the
    copy holds exactly the bits a sampler gets when these weights are published in `dtype`."""
    param = next(module.parameters())
    if param.dtype == dtype or not isinstance(module, PreTrainedModel) or hasattr(module, "peft_config"):
        return None
    with torch.device(param.device):
        copy = AutoModelForCausalLM.from_config(module.config, dtype=dtype,
                                                attn_implementation=module.config._attn_implementation)
    missing, unexpected = copy.load_state_dict(module.state_dict(), strict=False)
    # A tied head has no key of its own in some versions' state dicts; anything else missing is a bug.
    tied = {k for k in missing if k.endswith("lm_head.weight")} if module.config.tie_word_embeddings else set()
    if set(missing) - tied or unexpected:
        raise RuntimeError(f"decode_copy: the copy does not match the module (missing {sorted(missing)[:3]}, "
                           f"unexpected {sorted(unexpected)[:3]})")
    copy.generation_config = module.generation_config
    return copy.eval()


@contextlib.contextmanager
def decoding(module, tok, backend: str, device: torch.device, autocast: bool = False, liger: bool = True):
    """(model, engine) that decode a training module (the learner's final weights) as sampler 0
    decoded the baseline: the same decoder (eval_engine) in the same dtype (compute_dtype: bf16 on
    CUDA). A module that holds float32 weights (--precision autocast, the default for full
    fine-tuning) is decoded from a bf16 copy of them (decode_copy), so the result is that of the
    weights a sampler would run and of the checkpoint saved in that dtype; `autocast` is then moot.
    A module that cannot be copied so (LoRA adapters) decodes as it is, its fp32 matmuls under bf16
    autocast on Hugging Face `generate`. Our engine puts Liger's layers in the model it decodes
    (`liger`, --liger-decode); on the training module itself they are taken out again after."""
    module.config.use_cache = True
    copy = decode_copy(module, compute_dtype(device))
    model = copy if copy is not None else module
    engine = eval_engine(model, tok, backend, device, liger)
    amp = autocast and engine is None and copy is None
    try:
        with torch.autocast("cuda", dtype=torch.bfloat16) if amp else contextlib.nullcontext():
            yield model, engine
    finally:
        if copy is None and engine is not None and engine.layers is not None:
            engine.layers.remove()   # the training module itself was patched for the decode: as it was
        del engine, model, copy   # the copy's memory (and the engine's cache) go back before shutdown


def decode(model, tok, ids: list[list[int]], max_new_tokens: int, batch_size: int, device: torch.device,
           engine=None) -> tuple[list[str], list[int], int]:
    """Greedy completions of the prompts `ids`: (each one's text, its length in tokens without the
    end token, how many ran out of tokens). By `engine` (the sampler's rollout engine, all at once),
    else by Hugging Face `generate` in batches of `batch_size`, the prompts sorted by length (less
    left padding); greedy decoding does not depend on the batch it runs in beyond float rounding, so
    the order does not change which problems are solved in any systematic way."""
    was_training = model.training
    model.eval()
    order = sorted(range(len(ids)), key=lambda i: len(ids[i]))
    texts = [""] * len(ids)
    lengths = [0] * len(ids)
    truncated = 0
    with torch.no_grad():
        if engine is not None:   # the sampler's rollout engine (grpo.generate.engine): same greedy tokens, faster
            out = engine.generate([ids[i] for i in order], max_new_tokens, greedy=True)
            for i, row, fin in zip(order, out.token_ids, out.finished):
                row = row[:-1] if fin else row    # drop the EOS the engine keeps
                truncated += not fin
                lengths[i] = len(row)
                texts[i] = tok.decode(row, skip_special_tokens=True)
            order = []
        bar = Progress("eval problems", total=len(ids), unit="problem")
        bar.update(len(ids) - len(order))   # the engine path did them all at once
        stop = eos_ids(tok, model)   # every EOS id: the tokenizer's and the generation config's
        for s in range(0, len(order), batch_size):
            rows = order[s:s + batch_size]
            x, attn = left_pad([ids[i] for i in rows], tok.pad_token_id, device)
            width = x.shape[1]
            out = model.generate(input_ids=x, attention_mask=attn, do_sample=False,
                                 max_new_tokens=max_new_tokens, pad_token_id=tok.pad_token_id,
                                 eos_token_id=stop, top_k=None, top_p=None, temperature=None)
            for j, row in enumerate(out[:, width:].cpu().tolist()):
                i = rows[j]
                cut = next((n for n, t in enumerate(row) if t in stop), None)
                if cut is not None:
                    row = row[:cut]
                else:
                    truncated += 1
                lengths[i] = len(row)
                texts[i] = tok.decode(row, skip_special_tokens=True)
            bar.update(len(rows))
        bar.close()
    if was_training:
        model.train()
    return texts, lengths, truncated


def load_to_decode(found: FoundModel, device_flag: str, gpu_id: int, backend: str, rows: int = 256,
                   max_new_tokens: int = 256):
    """The evaluate command's (device, tokenizer, model, engine): `found` on --device/--gpu-id in its
    compute dtype, with the decoder eval_engine picks, or vLLM's engine for --generation-backend vllm
    (vllm_decoder: `rows` sequences at once of up to `max_new_tokens`). User mistakes raise
    ValueError or ModelUnavailable (one line each)."""
    device = pick_device(device_flag, gpu_id)
    vllm = resolve_backend(backend, device) == VLLM
    if vllm:
        check_vllm(device.type, device.index)   # installed, on CUDA, the first visible GPU: before any loading
    # The workers' attention kernels (start_runtime turns cuDNN's off on CUDA): another kernel rounds
    # bf16 otherwise, and greedy decoding then parts from the learner's and samplers' on some problems.
    start_runtime(device, {})
    tok = load_tokenizer(found.tokenizer)
    model = load_found(found, device, compute_dtype(device))
    if vllm:
        return device, tok, model, vllm_decoder(found.model, model, tok, device, rows, max_new_tokens)
    return device, tok, model, eval_engine(model, tok, backend, device)


def vllm_decoder(path: str, model, tok, device: torch.device, rows: int, max_new_tokens: int) -> VllmEngine:
    """vLLM's engine for the evaluate command's greedy batches, as a sampler builds it: on `path` (the
    folder vLLM loads its architecture from; `model`'s weights, an adapter merged in, are copied into
    it before the first batch), its share of this GPU from the memory rule for `rows` sequences of a
    prompt and `max_new_tokens` (plan_share, the sampler's rule; the command holds only `model` beside it)."""
    share, _ = plan_share(model, device, rows, max_new_tokens,
                          remedy="decode with --generation-backend fast, which needs no share")
    return VllmEngine.build(path, model, eos_ids(tok, model), compute_dtype(device), share, seed=0, rows=rows,
                            cuda_graphs=device.type == "cuda")
