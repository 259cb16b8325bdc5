"""The memory plan (grpo.rules.memory) of a RunPlan: logged one line a process, a default
micro-batch budget shrunk where that alone keeps it off its GPUs, and a run that will not fit
refused. Reads the model's config.json (or a GGUF header); never builds or fetches a model."""
from __future__ import annotations

import sys
from dataclasses import replace
from pathlib import Path

from grpo.launch import probe
from grpo.launch.plan import LaunchError
from grpo.launch.runplan import RunPlan
from grpo.rules import memory
from grpo.rules.backend import backend_for


def memory_inputs(rp: RunPlan, ranks: int, samplers: int) -> tuple[memory.Shape, memory.RunShape] | None:
    """The model's shape and the run's for `ranks` learner ranks and `samplers` samplers; None, said
    in one line, while neither the model's config.json nor (for the default model or a GGUF file)
    its GGUF is here to read."""
    shape, note = probe.read_shape(rp.launch.run.model)
    if shape is None:
        print(f"run_distributed.py: {note}", file=sys.stderr)
        return None
    ds = Path(rp.learner.training.deepspeed_config)
    ds = ds if ds.is_absolute() or ds.exists() else Path(__file__).resolve().parents[2] / ds
    return shape, probe.run_shape(rp.learner, rp.sampler, ranks, samplers, str(ds))


def memory_plan(rp: RunPlan, ranks: int, samplers: int) -> dict | None:
    """The memory plan; None when memory_inputs has none."""
    inputs = memory_inputs(rp, ranks, samplers)
    return None if inputs is None else memory.plan(*inputs)


def gpu_of(rp: RunPlan) -> dict[str, int]:
    """Each process's GPU: learner rank r on the r-th training GPU, sampler k on the first of its
    GPUs (Placement.sampler_gpus) and, where vLLM's workers are processes of their own (over several
    GPUs, or on one with --vllm-engine-process: grpo.rules.memory.workers_apart), vLLM's worker of
    rank i on its i-th (the plan's sampler{k}.tp{i}, grpo.rules.memory.plan)."""
    p = rp.placement
    rollout = rp.sampler.rollout
    apart = memory.workers_apart(backend_for(rollout.generation_backend, "cuda") == "vllm", p.tensor_parallel,
                                 rollout.vllm_engine_process)
    out = {f"learner{r}": g for r, g in enumerate(p.training_gpus)}
    for k in range(p.samplers):
        gpus = p.sampler_gpus(k)
        out[f"sampler{k}"] = gpus[0]
        if apart:
            out.update({memory.tp_worker(k, i): g for i, g in enumerate(gpus)})
    return out


def shares_a_gpu(placement: dict[str, int]) -> bool:
    """Whether a learner rank and a sampler run on one GPU (--share-gpus, --gpus 0)."""
    learners = {g for name, g in placement.items() if name.startswith("learner")}
    return any(g in learners for name, g in placement.items() if name.startswith("sampler"))


def shrunk_micro_tokens(rp: RunPlan, inputs, problem: str | None, tight: str | None, gpu_bytes,
                        placement) -> int | None:
    """Where the plan does not fit at the learner's default budget (sized for a GPU of its own; a
    learner sharing its GPU with a sampler, say), the budget that fits, said in one line: the learner
    packs smaller micro-batches instead. On a GPU a learner shares with a sampler the allocator's
    reserve counts too (`tight`): there both processes' caches grow into it, and 1.5B on one H200
    ran out with only the reserve over. A budget the user gave, or -1 (fixed micro-batches), stays."""
    shared = shares_a_gpu(placement)
    why = problem or (tight if shared else None)
    if not why or rp.launch.placement.no_memory_check or rp.learner.training.micro_batch_tokens != 0:
        return None
    shrink = (shared and memory.fitting_micro_tokens(*inputs, gpu_bytes, placement, with_reserve=True)) or \
        (problem and memory.fitting_micro_tokens(*inputs, gpu_bytes, placement))
    if shrink:
        said = why.split("; ")[0].replace("the memory plan does not fit", "at the default the plan does not fit") \
            .replace("the memory plan may not fit", "at the default the plan may not fit")
        print(f"run_distributed.py: learner micro-batches of at most {shrink} tokens, not the default "
              f"{inputs[1].micro_tokens}: {said} (--micro-batch-tokens sets it)", file=sys.stderr)
    return shrink or None


def check_memory(rp: RunPlan) -> RunPlan:
    """CUDA runs: log the memory plan, one line per process, and refuse one that will not fit its
    GPUs (shrunk_micro_tokens first); the plan with the budget the learner gets."""
    if not rp.placement.cuda:
        return rp   # CPU: no plan
    inputs = memory_inputs(rp, rp.placement.ranks, rp.placement.samplers)
    if inputs is None:
        return rp
    placement, gpu_bytes = gpu_of(rp), probe.gpu_total_bytes()
    p = memory.plan(*inputs)
    # float32 weights (autocast, the full fine-tuning default) may be all that keeps a plan off its
    # GPUs: the refusal then says that --precision bf16 fits
    problem = memory.check_fits(p, gpu_bytes, placement, bf16=memory.bf16_plan(*inputs))
    tight = None if problem else memory.check_tight(p, gpu_bytes, placement)
    if shrink := shrunk_micro_tokens(rp, inputs, problem, tight, gpu_bytes, placement):
        rp = replace(rp, learner=replace(rp.learner, training=replace(rp.learner.training, micro_batch_tokens=shrink)))
        inputs = (inputs[0], replace(inputs[1], micro_tokens=shrink))
        p = memory.plan(*inputs)
        problem = memory.check_fits(p, gpu_bytes, placement, bf16=memory.bf16_plan(*inputs))
    print(memory.format_plan(p), file=sys.stderr)
    if problem:
        if rp.launch.placement.no_memory_check:
            print(f"run_distributed.py: warning: {problem} (starting anyway: --no-memory-check)", file=sys.stderr)
        else:
            raise LaunchError(problem + "; or pass --no-memory-check to start anyway")
    elif tight := memory.check_tight(p, gpu_bytes, placement):
        print(f"run_distributed.py: warning: {tight}", file=sys.stderr)
    return rp
