"""The rollout section: how the samplers generate completions (groups, rounds, the decoder, behaviour log-probs)."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from grpo.config.bounds import at_least, positive

GenerationBackend = Literal["auto", "fast", "hf"]
OldLogprobs = Literal["auto", "sampling", "pass"]


@dataclass
class RolloutSection:
    """What both roles must agree on about a completion, and the decoder."""

    section = "rollout"

    num_generations: int = at_least(2, 8, "GRPO's advantage compares a prompt's completions with each other")
    """G: completions per prompt; the group is the unit of transfer."""
    max_new_tokens: int = at_least(1, 256)
    """Longest completion, in tokens."""
    temperature: float = positive(1.0, "sampling divides the logits by it")
    """Sampling temperature; the learner uses it too, so both sides score the same policy."""
    generation_backend: GenerationBackend = "auto"
    """'fast' (grpo/generate/engine.py: static KV cache, CUDA-graph decode, sampling on the GPU), 'hf' (Hugging Face generate), or 'auto' (fast on CUDA, hf on CPU). Samplers generate with it; every greedy evaluation (sampler 0's and the learner's final one) decodes with it, so the baseline and the final accuracy come from the same decoder."""


@dataclass
class SamplerRolloutSection:
    """How a sampler sizes and decodes its rounds."""

    section = "rollout"

    prompts_per_round: int = at_least(0, 0, "0 sizes each round")
    """Prompts generated together in one round; weights are swapped only between rounds (with --in-flight-rows also during one: --swap-in-flight). 0: sized each round so that the groups with signal it yields fill one learner step (its train batch over --num-generations, divided by the share of the last 64 groups scored that had signal under --filter-zero-signal), at least enough to fill the generation engine's smallest row bucket (64 rows with CUDA graphs, which a smaller round is padded to), within the learner's staleness budget, at most --max-prompts-per-round; round 0, before the learner's first answer, assumes a step of 8 groups: 24 prompts under --filter-zero-signal (a third assumed to have signal), 8 without."""
    max_prompts_per_round: int = at_least(1, 64)
    """--prompts-per-round 0: the most prompts a round may have (bounds the rows generated at once, so memory, when nearly every group has zero signal)."""
    in_flight_rows: int = at_least(0, 0, "0 for fixed rounds")
    """In-flight batching (--generation-backend fast): decode on this many rows, a row taking the next sample as soon as its own ends. With --swap-in-flight (ipc, nccl, tcp) there are no fixed rounds: a prompt starts whenever a row is free and the learner's budget allows, and groups leave as soon as the host check that ended them is over; a round ends only for an evaluation or a sync between rounds (or at --prompts-per-round prompts, when set). Without swaps each round's prompts stream through the rows and groups leave a learner step's worth at a time. Groups age while their longest completion is generated: a run that drops many as stale says at its end which --max-staleness their ages fit in. 0: each round is one batch that runs until its longest completion ends (run_distributed.py --gpus sets 320 where the samplers have GPUs of their own and the staleness bound can keep that many decoding: docs/configuration.md)."""
    swap_in_flight: bool = True
    """With --in-flight-rows: take a newer weights version as soon as the learner has announced it, between two decode steps, without draining the rows in flight (ipc, nccl and tcp copy it into the live weights in place; shared swaps only between rounds, since the learner steps its live weights only while no round holds them). Each token keeps the log-prob of the version that drew it, so the old log-probs are the sampling ones (--old-logprobs pass is refused with it), and a group carries the oldest version among its tokens, by which the staleness bound drops it."""
    old_logprobs: OldLogprobs = "auto"
    """Where the behaviour (old) log-probs come from: 'sampling' (each token's log-prob as the fast engine drew it: no extra pass), 'pass' (one batched teacher-forced pass after generation), or 'auto': 'sampling' where that is exact (the fast engine in float32), else 'pass'. In bf16 the two differ enough to move the clip (docs/configuration.md)."""
    logprob_batch_size: int = at_least(1, 64)
    """Sequences per teacher-forced forward pass when computing old and reference log-probs (the LM head runs in row chunks, so memory grows with this times length, not times vocabulary)."""
    max_rounds: int = at_least(0, 0, "0: until the learner says stop")
    """Stop after this many rounds (0: until the learner says stop)."""
    filter_zero_signal: bool = False
    """Drop groups whose rewards are all equal before their log-prob passes (the learner's flag of the same name, applied at the source); counted as sampler_zero_signal."""
    defer_zero_signal: bool = False
    """Pass over, once, a train prompt whose last group had no signal (every completion scored alike: the policy solved it every time, or never) when the prompt stream next reaches it; counted as prompts_deferred in each sampler's status."""
    cuda_graphs: bool = True
    """With the fast backend on CUDA, capture the decode step as a CUDA graph (--no-cuda-graphs: eager decode, for debugging)."""
    compile_decode: bool = False
    """With the fast backend, compile the decode step with torch.compile before capturing it (fewer, fused kernels; slower start): every shape's, evaluations' included (implies --compile-ring)."""
    compile_ring: bool = False
    """With --in-flight-rows on the fast backend, compile only the in-flight decode step (one shape, so one compilation at the first round) before capturing it; evaluations and fixed rounds keep their plain steps (docs/configuration.md: what it buys and costs)."""
    refill_behind: bool = True
    """With --in-flight-rows on the fast backend, queue each host check's decode steps before prefilling new prompts and refilling the rows that ended, so that the host's refill runs while the GPU decodes; the refilled rows start a check later (--no-refill-behind: refill first, with the GPU idle meanwhile; docs/configuration.md)."""
    attend_chunk: int = at_least(0, 64, "0: the whole cache at every step")
    """With the fast backend, a decode step attends only to the filled part of the cache: the prompt and the next multiple of this many generated slots, one captured graph per length (0: the whole cache at every step; why 64: docs/configuration.md). With --compile-decode, one compilation per length too."""
