"""One learner step on every rank (one policy version), and its figures by name.

  plan      each minibatch (--ppo-minibatches): this rank's token-balanced share, packed into
            micro-steps; every rank computes every rank's plan alike (plan_shard)
  forward   token log-probs (and the entropy, with --entropy-coef) of each micro-batch
  loss      grpo.loss.compute_loss with the run's LossConfig (the --loss-type registry)
  backward  ZeRO-2 reduces gradients at every micro-step on every rank           (sync point)
  update    one optimizer step per minibatch
  figures   what each rank measured, reduced across ranks name by name (RANK_FIGURES says how
            each combines) into the step record's fields (step_record)           (sync point)
"""
from __future__ import annotations

import contextlib
import time

import torch
import torch.distributed as dist

from grpo.config import LearnerConfig
from grpo.learner.batch import (Batch, balanced_split, length_buckets, micro_batch, minibatches, padded_tokens,
                                real_token_buckets, token_buckets)
from grpo.loss import LossConfig, Norms, compute_loss
from grpo.model.liger import FusedLayers
from grpo.model.logprobs import token_logprobs
from grpo.model.packed import packable

# How the ranks' values of one figure combine: added up, the largest, the mean over ranks, or
# each rank's value kept (a list in rank order).
SUM, MAX, MEAN, EACH = "sum", "max", "mean", "each"
KINDS = (SUM, MAX, MEAN, EACH)

# What one rank measures in a step, by name, and how the ranks' values combine.
RANK_FIGURES: dict[str, str] = {
    "loss": SUM,            # each micro-step's share of its update's loss, added over updates
    "kl": SUM,              # per-token KL estimates over the loss tokens
    "clipped": SUM,         # loss tokens whose clipped branch was taken
    "tokens": SUM,          # loss tokens (generated tokens inside the mask)
    "ratio": SUM,           # pi / pi_base over the loss tokens
    "sequences": SUM,       # sequences trained
    "is_weight_sum": SUM,   # behaviour importance weights over the loss tokens
    "is_weight_max": MAX,   # the largest of those weights (0 for a rank with no sequences)
    "is_limited": SUM,      # loss tokens whose weight was capped (--tis-cap) or masked (--is-mask-*)
    "entropy": SUM,         # the policy's entropy over the loss tokens (0 without --entropy-coef)
    "model_tokens": SUM,    # prompt + completion tokens through the model
    "padded_tokens": SUM,   # the token slots those took once right-padded per micro-batch
    "tokens_per_s": EACH,   # model tokens over this rank's time in the step
    "peak_mem_gb": EACH,    # this rank's peak device memory (0 off CUDA)
}


def combine(per_rank: list[dict[str, float]], kinds: dict[str, str]) -> dict[str, float | list[float]]:
    """The ranks' figures (rank order) combined name by name as `kinds` says. Sums add in rank
    order from 0, so the result does not depend on a backend's reduction order."""
    out: dict[str, float | list[float]] = {}
    for name, kind in kinds.items():
        values = [r[name] for r in per_rank]
        if kind == SUM:
            out[name] = sum(values)
        elif kind == MAX:
            out[name] = max(values)
        elif kind == MEAN:
            out[name] = sum(values) / len(values)
        elif kind == EACH:
            out[name] = values
        else:
            raise ValueError(f"{name}: unknown reduction {kind!r}; choose one of {', '.join(KINDS)}")
    return out


def reduce_by_name(mine: dict[str, float], kinds: dict[str, str], world: int,
                   device: torch.device | None = None) -> dict[str, float | list[float]]:
    """Every rank's `mine` combined across the process group name by name (combine). A collective:
    every rank calls it with the same `kinds`. The values travel as one float64 all_gather in
    `kinds`' order (exact for Python floats) and each rank combines them alike, so all ranks hold
    the same result. With one rank (or no process group) there is no collective and each figure
    is the rank's own (EACH: a list of one)."""
    if set(mine) != set(kinds):
        raise ValueError(f"figures {sorted(set(mine) ^ set(kinds))}: measured but not declared, or declared "
                         f"but not measured; name each in both")
    names = list(kinds)
    if not (dist.is_initialized() and world > 1):
        return {n: [mine[n]] if kinds[n] == EACH else mine[n] for n in names}
    t = torch.tensor([float(mine[n]) for n in names], dtype=torch.float64, device=device)
    gathered = [torch.empty_like(t) for _ in range(world)]
    dist.all_gather(gathered, t)
    per_rank = [dict(zip(names, g.cpu().tolist())) for g in gathered]
    return combine(per_rank, kinds)


def step_record(r: dict, cfg: LearnerConfig, updates: int, grad_norm: float) -> dict:
    """The step record's training fields from the reduced figures `r` (RANK_FIGURES' names):
    means per loss token, the loss per update, and every rank's own rates."""
    toks = r["tokens"]
    return {"loss": r["loss"] / updates,
            # beta 0: samplers send no reference log-probs (zeros stand in), so there is no KL to report.
            "kl": r["kl"] / max(toks, 1) if cfg.loss.beta > 0 else None,
            "clip_frac": r["clipped"] / max(toks, 1), "ratio_mean": r["ratio"] / max(toks, 1),
            "is_weight_mean": r["is_weight_sum"] / max(toks, 1), "is_weight_max": r["is_weight_max"],
            "is_limited_frac": r["is_limited"] / max(toks, 1), "updates": updates,
            # the whole distribution's entropy per token, where --entropy-coef computes it
            "policy_entropy": r["entropy"] / max(toks, 1) if cfg.loss.entropy_coef else None,
            "tokens": int(toks), "sequences": int(r["sequences"]),
            "model_tokens": int(r["model_tokens"]),   # prompts and completions, every rank's (the bf16 peak share's)
            "grad_norm": grad_norm,
            # padding share of the model's input
            "pad_frac": 1.0 - r["model_tokens"] / r["padded_tokens"] if r["padded_tokens"] else 0.0,
            "rank_tokens_per_s": r["tokens_per_s"],
            "rank_peak_mem_gb": r["peak_mem_gb"]}


def plan_shard(lens: list[int], part: list[int], world: int, rank: int, micro_tokens: int,
               gas: int, packed: bool = False) -> tuple[list[int], list[list[int]]]:
    """This rank's share of one minibatch `part` (ranks: equal token loads) and its micro-steps
    (similar lengths together): `gas` of them, or with a token budget (`micro_tokens` > 0) as many
    as the budget needs on the rank that needs most, since ZeRO-2 reduces at every micro-step on
    every rank (a rank with fewer runs empty ones). The budget counts a micro-batch's padded slots
    (rows x its longest row), or with `packed` (padding-free passes, which hold no padding slot) its
    real tokens. Every rank computes every rank's plan alike.

    lens: every sequence's whole length (prompt + completion); part: the minibatch's indices into
    lens. Returns (indices into lens, micro-steps as lists of indices into that share)."""
    shares = balanced_split([lens[i] for i in part], world)
    mine = [part[i] for i in shares[rank]]
    if not micro_tokens:
        return mine, length_buckets([lens[i] for i in mine], gas)
    cut = real_token_buckets if packed else token_buckets
    plans = [cut([lens[part[i]] for i in share], micro_tokens) for share in shares]
    micro = plans[rank]   # indices into mine, as shares[rank] lists mine in order
    return mine, micro + [[] for _ in range(max(map(len, plans)) - len(micro))]


class TrainStep:
    """The training step, bound to this rank's engine: `step(batch)` trains one policy version and
    returns the step record's training fields (step_record), the same on every rank."""

    def __init__(self, cfg: LearnerConfig, engine, pad_token_id: int, device: torch.device, rank: int, world: int,
                 micro_tokens: int, autocast: bool, fused: FusedLayers | None = None):
        self.cfg, self.engine, self.pad_token_id, self.device = cfg, engine, pad_token_id, device
        self.rank, self.world, self.micro_tokens, self.autocast = rank, world, micro_tokens, autocast
        self.fused = fused   # Liger's layers (--liger-kernel): their module-level names only inside amp()
        # the passes run padding-free where the model allows (the rule grpo.model.logprobs applies), and
        # then a micro-batch's budget counts its real tokens (plan_shard)
        self.packed = cfg.training.padding_free and packable(engine.module) is None
        self.loss_cfg = LossConfig.of(cfg)

    @contextlib.contextmanager
    def amp(self):
        """Around every forward pass of the learner's: bf16 autocast (--precision autocast) and the
        fused layers' scope."""
        with (torch.autocast("cuda", dtype=torch.bfloat16) if self.autocast else contextlib.nullcontext()), \
                (self.fused.passes() if self.fused is not None else contextlib.nullcontext()):
            yield

    def __call__(self, batch: Batch) -> dict:
        """One learner step (one policy version): --ppo-minibatches optimizer updates on the batch.

        With an off-policy correction (--tis-cap, --is-mask-*) every token's proximal log-prob is
        its log-prob under the weights before the step's first update. For the first minibatch
        that is the forward pass it trains with; the later ones get a no-grad pass first, before
        any update, so their trust region is around the same policy."""
        cfg, module = self.cfg, self.engine.module
        t_start = time.perf_counter()
        module.train()
        lens = batch.whole_lens()
        parts = minibatches(batch.size // cfg.rollout.num_generations, cfg.rollout.num_generations,
                            cfg.training.ppo_minibatches)
        plans = [plan_shard(lens, part, self.world, self.rank, self.micro_tokens, self.engine.gas, self.packed)
                 for part in parts]
        decoupled = bool(cfg.loss.tis_cap or cfg.loss.is_mask_high)
        prox: dict[tuple[int, int], torch.Tensor] = {}
        if decoupled and len(plans) > 1:
            with torch.no_grad():
                for k, (mine, micro) in enumerate(plans[1:], start=1):
                    for j, piece in enumerate(micro):
                        if piece:
                            mb = micro_batch(batch, [mine[i] for i in piece], self.pad_token_id, self.device)
                            with self.amp():
                                prox[k, j] = token_logprobs(module, mb.input_ids, mb.attention, cfg.rollout.temperature,
                                                            first=mb.first, padding_free=cfg.training.padding_free)
        mine_figs = dict.fromkeys(("loss", "kl", "clipped", "tokens", "ratio", "sequences", "is_weight_sum",
                                   "is_weight_max", "is_limited", "entropy"), 0.0)
        for k, ((mine, micro), part) in enumerate(zip(plans, parts)):
            self._update(batch, k, part, mine, micro, prox, decoupled, mine_figs)
        # Per rank: tokens through the model (prompt + completion) over this step's train time,
        # peak device memory and padded token slots, gathered so rank 0 can log every rank's figures.
        model_tokens = float(sum(lens[i] for mine, _ in plans for i in mine))
        mine_figs["model_tokens"] = model_tokens
        mine_figs["tokens_per_s"] = model_tokens / max(time.perf_counter() - t_start, 1e-9)
        mine_figs["peak_mem_gb"] = (torch.cuda.max_memory_allocated(self.device) / 2**30
                                    if self.device.type == "cuda" else 0.0)
        mine_figs["padded_tokens"] = float(sum(padded_tokens(lens, [[mine[i] for i in p] for p in micro])
                                               for mine, micro in plans))
        figures = reduce_by_name(mine_figs, RANK_FIGURES, self.world, self.device)
        return step_record(figures, cfg, len(parts), self.engine.grad_norm())

    def _update(self, batch: Batch, k: int, part: list[int], mine: list[int], micro: list[list[int]],
                prox: dict, decoupled: bool, figs: dict[str, float]) -> None:
        """Update k of the step, on one minibatch: its micro-steps of forward, loss and backward,
        each adding to this rank's figures `figs`. prox holds the proximal log-probs of updates
        1.. by (k, micro-step)."""
        cfg, module = self.cfg, self.engine.module
        gen_lens = batch.meta[:, 1].tolist()
        total_tokens = int(sum(gen_lens[i] for i in part))
        # undo DeepSpeed's mean over ranks (and, with fixed micro-batches, its division by gas)
        scale = self.world * self.engine.loss_divisor
        # Every micro-batch's inputs built and on the device before the first forward: a copy from
        # host memory waits for the device's queue, which here is still short; between two
        # micro-steps it would wait for the whole backward before it.
        mbs = [micro_batch(batch, [mine[i] for i in piece], self.pad_token_id, self.device) if piece else None
               for piece in micro]
        stats = []   # per micro-step, its figures on the device: read once, after the last
        for j, (piece, mb) in enumerate(zip(micro, mbs)):
            if not piece:
                # This rank has fewer sequences than micro-steps. ZeRO-2 reduces gradients at
                # every micro-step on every rank, so it still runs one: a zero-weight forward.
                ids = torch.full((1, 2), self.pad_token_id, dtype=torch.long, device=self.device)
                with self.amp():
                    out = module(input_ids=ids, use_cache=False).logits
                self.engine.backward(out.float().sum() * 0.0)
                continue
            if cfg.loss.mask_truncated:
                # Completions cut at --max-new-tokens: no answer yet, so no reliable reward;
                # masked out, they still count in the normalisers (as in TRL).
                mb.gen_mask = mb.gen_mask * mb.finished.unsqueeze(1)
            entropy = None
            # Only the completions' positions (gen_mask's) are computed: the loss reads no other.
            with self.amp():
                if cfg.loss.entropy_coef:
                    logp, entropy = token_logprobs(module, mb.input_ids, mb.attention, cfg.rollout.temperature,
                                                   with_entropy=True, first=mb.first,
                                                   padding_free=cfg.training.padding_free)  # [b, L-1] each
                else:
                    logp = token_logprobs(module, mb.input_ids, mb.attention, cfg.rollout.temperature,
                                          first=mb.first, padding_free=cfg.training.padding_free)  # [b, L-1]
            # The first update's own forward pass runs on the weights before any update: it is the
            # proximal policy. Later minibatches use the pass made before the first update.
            base = None
            if decoupled:
                base = logp.detach() if k == 0 else prox.pop((k, j))
            share, tl = compute_loss(logp, mb.old_logp, mb.ref_logp, mb.advantages, mb.gen_mask, self.loss_cfg,
                                     Norms(len(part), total_tokens, cfg.rollout.max_new_tokens,
                                           self.world * len(micro)),
                                     prox_logp=base, entropy=entropy)
            self.engine.backward(share * scale)
            with torch.no_grad():
                stats.append(torch.stack([
                    share.detach().float(), tl.kl.sum(), tl.clipped.sum().float(), mb.gen_mask.sum(),
                    tl.ratio.sum(), tl.is_weight.sum(), tl.is_limited.sum().float(), tl.is_weight.max(),
                    tl.entropy.sum()]))
            figs["sequences"] += len(piece)
        # the update's one host sync for the figures it logs (one a micro-step would stall the queue between them)
        for loss_, kl_, clip_, toks_, ratio_, w_sum, limited, w_max, ent_ in (torch.stack(stats).tolist() if stats else []):
            for name, v in (("loss", loss_), ("kl", kl_), ("clipped", clip_), ("tokens", toks_), ("ratio", ratio_),
                            ("is_weight_sum", w_sum), ("is_limited", limited), ("entropy", ent_)):
                figs[name] += v
            figs["is_weight_max"] = max(figs["is_weight_max"], w_max)
        self.engine.step()
