"""The rollout workflow: prompts in, scored groups out (the job of AReaL's RLVRWorkflow.arun_episode).

One round: take the next prompts of this sampler's shard, generate G completions each (one fixed
batch, or streamed through in-flight batching), score them, drop zero-signal groups
(--filter-zero-signal) before any log-prob pass, take or compute the behaviour (old) log-probs and
compute the reference ones when the run needs them, and build the wire's Groups.

Weights are swapped between rounds, and with --swap-in-flight (in flight on --in-flight-rows) also
between two decode steps of a round, as soon as the learner has announced a newer version
(swaps_in_flight, WeightsClient.apply_newer_now): the rows in flight are not drained. Each token's
sampled log-prob is then under the version that drew it, so those are the old log-probs (a pass at
the group's end would score every token with the newest weights), and a group carries the oldest
version among its tokens (the staleness bound's) and the newest. Without swaps every token of a
round was sampled by one version. Round 0 may be generated before the learner's first answer
(grpo.sampler.weights_client): nothing of it is scored or sent before that answer has come and the
run's facts are checked.
"""
from __future__ import annotations

import collections
import itertools
import logging
import time
from dataclasses import dataclass
from typing import Callable

import numpy as np
import torch

from grpo.config import SamplerConfig
from grpo.data.prompts import Deferrals, PromptStream, problem_prompt
from grpo.data.sources import load_problems, shard
from grpo.data.tasks import SuccessWindow, start_levels
from grpo.generate.backend import hf_generate
from grpo.generate.engine import RolloutEngine
from grpo.loss import has_signal
from grpo.model.load import compute_dtype, load_causal_lm
from grpo.model.logprobs import right_pad, token_logprobs
from grpo.obs.gpu import GpuMonitor, format_gpu
from grpo.sampler.counters import SamplerCounters
from grpo.sampler.weights_client import WeightsClient
from grpo.weights.methods import own_weights
from grpo.rules.staleness import (FIRST_STEP_GROUPS, SIGNAL_GROUPS, bucket_prompts, next_round_prompts, pool_room,
                                  signal_share)
from grpo.wire import messages as M

log = logging.getLogger(__name__)


def swaps_in_flight(swap_in_flight: bool, in_flight_rows: int, method: str, old_logprobs: str) -> bool:
    """Whether streams swap weights between decode steps: --swap-in-flight with --in-flight-rows
    (fixed rounds are one batch: nothing to swap into), unless the weights are shared (the learner
    steps those only while no round holds their guard). --old-logprobs pass is refused with it: the
    pass would score every token with the weights at the group's end, not those that drew it."""
    if not (swap_in_flight and in_flight_rows) or not own_weights(method):
        return False
    if old_logprobs == "pass":
        raise ValueError("--old-logprobs pass scores every token with the weights at the group's end, but with "
                         "--swap-in-flight its early tokens were drawn by older ones: use --old-logprobs sampling "
                         "(or auto), or --no-swap-in-flight")
    return True


def encode_prompts(tok, problems: list) -> tuple[list[str], list[list[int]]]:
    """The prompts of a round's problems, as text and token ids (what evaluation decodes too)."""
    prompts = [problem_prompt(tok, p) for p in problems]
    return prompts, [tok(p, add_special_tokens=False)["input_ids"] for p in prompts]


def stream_line(stats: dict, elapsed: float) -> str:
    """The run's in-flight decoding in one line, from the stream_* stats (empty without streams):
    steps and their device time, the share of the run's seconds they cover, the share of row-steps
    that had a sample, the host seconds asking for prompts, prefilling and refilling (with
    --refill-behind while a check's steps run, otherwise with none queued) and at the checks, and
    the host's wait for the queued work at the checks' syncs."""
    steps = stats.get("stream_steps", 0.0)
    if not steps:
        return ""
    dev = stats["stream_decode_s"]
    return (f"stream: {steps:,.0f} decode steps, {dev / steps * 1e3:.2f} ms each on the device ({dev:.0f} s, "
            f"{dev / max(elapsed, 1e-9):.0%} of {elapsed:.0f} s), rows busy {stats['stream_busy_row_steps'] / max(stats['stream_row_steps'], 1):.1%}; "
            f"{stats['stream_prompts']:,.0f} prompts prefilled and refilled in {stats['stream_refill_s']:.1f} s, "
            f"checks {stats['stream_check_s']:.1f} s, waiting at the syncs {stats['stream_sync_s']:.1f} s (host)")


class Prompts:
    """This sampler's shard of the train split as its prompt stream, at the curriculum's levels
    (--curriculum: every task starts at level 0; the learner's answers move the levels)."""

    def __init__(self, cfg: SamplerConfig):
        self.cfg = cfg
        self.levels = start_levels(cfg.dataset) if cfg.curriculum else None
        self.window = SuccessWindow(cfg.curriculum_window)
        # --defer-zero-signal: prompts whose last group had no signal, passed over once (kept across
        # curriculum reloads: a prompt is known by its text)
        self.deferrals = Deferrals() if cfg.defer_zero_signal else None
        self.mine = self._load()

    def _load(self) -> list:
        cfg = self.cfg
        problems = load_problems(cfg.dataset, "train", limit=cfg.dataset_limit or None, seed=cfg.seed,
                                 transform=cfg.dataset_transform, levels=self.levels)
        mine = shard(problems, cfg.sampler_id, cfg.num_samplers)
        if not mine:
            raise ValueError(f"sampler {cfg.sampler_id} of {cfg.num_samplers} got no prompts "
                             f"from {len(problems)} problems; use fewer samplers or more data")
        for task, level in (self.levels or {}).items():
            self.window.set_level(task, level)
        self.stream = PromptStream(mine, seed=cfg.seed + cfg.sampler_id, deferrals=self.deferrals)
        return mine

    def set_levels(self, levels: dict[str, int]) -> None:
        """The learner moved the curriculum: from the next round, prompts come from the new levels."""
        if self.levels is None or levels == self.levels:
            return
        moved = ", ".join(f"{t} {self.levels.get(t)} -> {lv}" for t, lv in levels.items() if self.levels.get(t) != lv)
        self.levels = {t: int(levels.get(t, lv)) for t, lv in self.levels.items()}
        self.mine = self._load()
        log.info("curriculum: %s (prompts regenerated at the new levels)", moved)


@dataclass
class RolloutModel:
    """What rounds are generated and scored with (built by grpo.sampler.setup)."""
    tok: object
    policy: torch.nn.Module
    engine: RolloutEngine | None   # None: Hugging Face generate for fixed rounds
    eos_ids: list[int]             # every id that ends a completion
    device: torch.device
    path: str                      # --model resolved: the reference model loads from it when a run needs one
    backend: str                   # 'fast' (our engine) or 'hf' (Hugging Face generate)
    old_source: str                # old log-probs from 'sampling' (as drawn) or a teacher-forced 'pass'
    swaps: bool = False            # streams swap weights in flight (swaps_in_flight; old_source is then 'sampling')


class RolloutWorkflow:
    """Prompts in, scored groups out (the module's docstring).

    The weights client gives the version the groups carry, the run's facts (reference log-probs
    needed? the step's size) and the budget, and holds a round back until the learner's first
    answer. Of the sampler's counters (grpo.sampler.counters), it writes the samples, tokens,
    timings, peaks, reward failures, deferrals, stream counts, the curriculum window and the groups
    filtered as zero-signal (dropped_zero_signal: offered and dropped at once, groups_sent included).
    """

    def __init__(self, cfg: SamplerConfig, prompts: Prompts, rewards, model: RolloutModel, client: WeightsClient,
                 counters: SamplerCounters, gpu: GpuMonitor, incarnation: int):
        self.cfg, self.prompts, self.rewards, self.model = cfg, prompts, rewards, model
        self.tok, self.policy, self.engine, self.eos_ids = model.tok, model.policy, model.engine, model.eos_ids
        self.old_source, self.device, self.swaps = model.old_source, model.device, model.swaps
        self.client, self.counters, self.gpu, self.incarnation = client, counters, gpu, incarnation
        # The frozen reference model is loaded only once the learner says the run needs its
        # log-probs (beta > 0; RunFacts.needs_ref_logprobs), or if it never says.
        self.ref = None
        # (kept, groups) per chunk finished: a chunk holds a group at least, so SIGNAL_GROUPS of them
        # hold the groups signal_share weighs
        self._signal: collections.deque[tuple[int, int]] = collections.deque(maxlen=SIGNAL_GROUPS)
        self._longest: tuple[list | None, int] = (None, 0)   # (the shard, its longest prompt): longest_prompt

    # ------------------------------------------------------------------ round size
    def round_prompts(self) -> int:
        """Prompts for the next round: --prompts-per-round, or fewer when the learner's queue is so
        long that more groups would reach it too stale to train on (the budget in its answer).
        --prompts-per-round 0: enough that the groups with signal fill one learner step, within the
        budget (grpo.rules.staleness.next_round_prompts). 0: wait."""
        facts = self.client.run_facts
        step = facts.groups_per_step if facts is not None else 0   # 0: not said yet
        return next_round_prompts(self.cfg.prompts_per_round, self.client.budget, step, self.signal_share(),
                                  self.cfg.max_prompts_per_round, self.bucket_prompts())

    def _first_round_prompts(self) -> int:
        """Round 0's prompts, before the learner has said its step's size (FIRST_STEP_GROUPS assumed)."""
        return next_round_prompts(0, -1, 0, self.signal_share(), self.cfg.max_prompts_per_round, self.bucket_prompts())

    def bucket_prompts(self) -> int:
        """grpo.rules.staleness.bucket_prompts for this sampler's engine (a round of a small step's worth,
        2 groups with the defaults, takes as long as this many)."""
        return bucket_prompts(self.engine.buckets if self.engine is not None else (), self.cfg.num_generations)

    def signal_share(self) -> float:
        """The share of the last SIGNAL_GROUPS groups scored that had signal (grpo.rules.staleness.signal_share)."""
        return signal_share(self._signal, self.cfg.filter_zero_signal)

    def longest_prompt(self) -> int:
        """The longest prompt of this sampler's shard, in tokens (at its curriculum levels): a stream's
        ring is made that wide at once, so that no later prompt makes it drain for a wider one."""
        mine = self.prompts.mine
        if self._longest[0] is not mine:
            self._longest = (mine, max(map(len, self.tok([problem_prompt(self.tok, p) for p in mine],
                                                         add_special_tokens=False)["input_ids"])))
        return self._longest[1]

    def _round_problems(self, n_prompts: int | None):
        if n_prompts is None:
            n_prompts = self.cfg.prompts_per_round or self._first_round_prompts()
        problems = self.prompts.stream.next_batch(n_prompts)
        return (problems, *encode_prompts(self.tok, problems))

    # ------------------------------------------------------------------ one round
    @torch.no_grad()
    def generate_round(self, round_idx: int, n_prompts: int | None = None) -> list[M.Group]:
        """One round as one fixed batch: every prompt's G rows decode until the longest ends."""
        cfg, tok, client = self.cfg, self.tok, self.client
        problems, prompts, prompt_ids = self._round_problems(n_prompts)
        G = cfg.num_generations
        t0 = time.perf_counter()
        rows = [p for p in prompt_ids for _ in range(G)]
        sampled_lp = None
        if self.engine is not None:
            out = self.engine.generate(rows, cfg.max_new_tokens, cfg.temperature, should_stop=client.stop_said)
            completions, sampled_lp = list(zip(out.token_ids, out.finished)), out.logprobs
        else:
            completions = list(zip(*hf_generate(self.policy, rows, cfg.max_new_tokens, cfg.temperature, False,
                                                self.eos_ids, tok.pad_token_id, should_stop=client.stop_said)))
        gen_s = time.perf_counter() - t0
        # Round 0 before the learner's first answer: the answer (the run's facts) before anything is scored or sent.
        if not client.first_answer() or client.stop is not None:
            return []   # cut short or abandoned: nothing of this round is scored, counted or sent
        return self._finish(round_idx, problems, prompts, prompt_ids, list(range(len(problems))), completions,
                            gen_s, sampled_lp)

    @torch.no_grad()
    def stream_round(self, round_idx: int, n_prompts: int, ends: Callable[[], bool] = lambda: False):
        """One round through in-flight batching (--in-flight-rows): yields lists of finished groups,
        scored and with their log-probs, as soon as a learner step's worth has ended (or the round
        has), while the engine gives the rows their samples freed to the round's next samples.

        Without self.swaps the round is n_prompts prompts, every token sampled by one version. With
        it the engine asks the weights client for a newer version at every host check
        (apply_newer_now), each group says the versions its tokens were drawn by, and the round has
        no fixed size: once the learner's first answer has come, a prompt starts whenever a row is
        free and the pool of groups not yet sent fits the learner's budget (pool_room on the
        client's live_budget), until `ends()` says so (an evaluation is due, a version waits for the
        sync between rounds; no version is swapped in from then on) or --prompts-per-round prompts
        when set. The round ends when its rows are free and no prompt may start: the budget is 0
        (the loop waits for room), or it ended.
        Groups then leave at the end of each host check that ended some (at most this sampler's
        share of a step at a time): a group held back would age, and keep the learner waiting."""
        cfg, client = self.cfg, self.client
        G = cfg.num_generations
        # The round's prompts by their index, from when they start until their group has been finished.
        problems: dict[int, object] = {}
        prompts: dict[int, str] = {}
        prompt_ids: dict[int, list[int]] = {}
        taken = done = 0   # prompts started; groups finished (sent or filtered)

        def streaming() -> bool:   # (round 0 may learn the run's facts, and so the step's size, as it goes)
            return self.swaps and not client.awaiting_first

        def chunk() -> int:
            step = (client.run_facts.groups_per_step if client.run_facts is not None
                    else cfg.prompts_per_round or FIRST_STEP_GROUPS)
            return max(1, -(-step // cfg.num_samplers) if streaming() else step)

        def next_prompt():
            nonlocal taken
            if not streaming():
                if taken >= n_prompts:
                    return None
            elif ((cfg.prompts_per_round and taken >= cfg.prompts_per_round) or ends()
                  or pool_room(client.live_budget(), taken - done, self.signal_share()) == 0):
                return None
            problem = self.prompts.stream.next_batch(1)[0]
            text, ids = encode_prompts(self.tok, [problem])
            problems[taken], prompts[taken], prompt_ids[taken] = problem, text[0], ids[0]
            taken += 1
            return taken - 1, ids[0]

        def swap() -> int | None:
            # Once the round is ending for an evaluation, the weights stay at the version due for it
            # (the baseline is version 0's) while the rows in flight end.
            return None if ends() else client.apply_newer_now()

        gis: list[int] = []
        completions: list[tuple[list[int], bool]] = []
        sampled_lp: list[np.ndarray] = []
        versions: list[tuple[int, int]] = []   # per group: (oldest, newest) version among its tokens
        t0 = time.perf_counter()
        stream = self.engine.stream(next_prompt, G, cfg.max_new_tokens, cfg.temperature,
                                    rows=cfg.in_flight_rows, should_stop=client.stop_said,
                                    swap=swap if self.swaps else None, version=client.version,
                                    min_width=self.longest_prompt() if self.swaps else 0)
        for fg in itertools.chain(stream, [None]):   # None: the round has ended, send what is left
            if fg is not None:
                gis.append(fg.key)
                versions.append((fg.min_version, fg.max_version))
                completions.extend(zip(fg.token_ids, fg.finished))
                sampled_lp.extend(fg.logprobs)
            # Round 0 before the learner's first answer: the answer is taken as soon as it has come,
            # and waited for before anything is finished (scored, sent) and at the round's end.
            if client.awaiting_first and (fg is None or len(gis) >= chunk() or client.answers_waiting()):
                t_wait = time.perf_counter()
                if not client.first_answer():
                    return   # abandoned: nothing of this round was or is sent
                t0 += time.perf_counter() - t_wait   # (waiting is not generating)
            if fg is None and client.stop is not None:
                return   # cut short: the groups not yet sent are not scored, counted or sent
            # Streaming, what has ended leaves at the end of each host check that ended something:
            # a group held back for a fuller chunk would only age.
            if gis and (fg is None or len(gis) >= chunk() or (streaming() and fg.last_in_check)):
                yield self._finish(round_idx, problems, prompts, prompt_ids, gis, completions, time.perf_counter() - t0,
                                   sampled_lp, versions)
                done += len(gis)   # (sent by now: the caller sends a chunk before asking for the next)
                for gi in gis:
                    del problems[gi], prompts[gi], prompt_ids[gi]
                gis, completions, sampled_lp, versions, t0 = [], [], [], [], time.perf_counter()

    def _finish(self, round_idx: int, problems, prompts, prompt_ids,
                gis: list[int], completions: list[tuple[list[int], bool]], gen_s: float,
                sampled_lp: list[np.ndarray] | None = None,
                versions: list[tuple[int, int]] | None = None) -> list[M.Group]:
        """Groups gis of the round (G rows each, in `completions`): score, count for the curriculum,
        drop zero-signal ones (--filter-zero-signal), take or compute old (and compute reference)
        log-probs, build. problems, prompts, prompt_ids: the round's, by prompt index (a list, or a
        streaming round's dict). sampled_lp: the engine's log-prob of each sampled token, per completion.
        versions: per group, the (oldest, newest) version its tokens were drawn by (None: all the
        client's version); a group's policy_version is the oldest, by which its age is counted."""
        cfg, tok, facts = self.cfg, self.tok, self.client.run_facts
        versions = versions or [(self.client.version, self.client.version)] * len(gis)
        version = min((v for v, _ in versions), default=self.client.version)
        newest = max((v for _, v in versions), default=version)
        G = cfg.num_generations
        whole = [prompt_ids[gis[k // G]] + c for k, (c, _) in enumerate(completions)]
        t1 = time.perf_counter()
        texts = [tok.decode(c, skip_special_tokens=True) for c, _ in completions]
        # A completion a reward fails on costs that completion its score (counted here, in the
        # status the learner books); RewardBroken, when a reward fails on most, ends the sampler.
        scores = self.rewards.score([problems[gis[k // G]] for k in range(len(completions))], texts,
                                    [c for c, _ in completions])
        failures = self.rewards.faults.stats()
        self.counters.put(reward_failures=failures.pop("reward_failures"), reward_kinds=failures)
        window = self.prompts.window
        if self.prompts.levels is not None:   # every group counts for its task, before any filter
            for j, gi in enumerate(gis):
                window.add(problems[gi].columns.get("rg_task", ""),
                           sum(sc.info.get("correct", 0.0) for sc in scores[j * G:(j + 1) * G]), G)
            self.counters.put(curriculum=window.stats())
        signal = [has_signal([sc.reward for sc in scores[j * G:(j + 1) * G]]) for j in range(len(gis))]
        if (deferrals := self.prompts.deferrals) is not None:   # every group, filtered or not
            for gi, sig in zip(gis, signal):
                deferrals.mark(problems[gi], sig)
            self.counters.put(prompts_deferred=float(deferrals.deferred))
        # Scored before the log-prob passes, so that with --filter-zero-signal a group whose
        # rewards are all equal (zero advantage: the learner would drop it) costs no passes and
        # is not sent; it still counts as offered, and the learner's books see it as dropped.
        keep = [j for j in range(len(gis)) if not cfg.filter_zero_signal or signal[j]]
        rows_kept = [k for j in keep for k in range(j * G, (j + 1) * G)]
        t2 = time.perf_counter()
        kept_whole = [whole[k] for k in rows_kept]
        kept_plens = [len(prompt_ids[gis[k // G]]) for k in rows_kept]
        if self.old_source == "sampling" and sampled_lp is not None:   # --old-logprobs: exact, or asked for
            old_lp = {k: sampled_lp[k] for k in rows_kept}
        else:
            old_lp = dict(zip(rows_kept, self._logprobs(self.policy, kept_whole, kept_plens)))
        if facts is None or facts.needs_ref_logprobs:
            if self.ref is None:
                self.ref = load_causal_lm(self.model.path, self.device, compute_dtype(self.device)).eval()
            ref_lp = dict(zip(rows_kept, self._logprobs(self.ref, kept_whole, kept_plens)))
        else:   # not needed: the reference pass is skipped and the group carries none
            ref_lp = {k: np.zeros(0, np.float32) for k in rows_kept}
        reward_s, logprob_s = t2 - t1, time.perf_counter() - t2   # (_logprobs ends in .cpu(): done by now)
        # A filtered group was offered and dropped here: groups_sent counts it with dropped_zero_signal
        # (SamplerCounters.groups_sent), so every status has sent >= what it says it dropped, and a
        # round filtered whole is counted although nothing of it is sent.
        self.counters.add(dropped_zero_signal=len(gis) - len(keep))
        self._signal.append((len(keep), len(gis)))
        groups = []
        for j in keep:
            gi = gis[j]
            problem, prompt, pids = problems[gi], prompts[gi], prompt_ids[gi]
            comps = []
            for k in range(j * G, (j + 1) * G):
                gen_ids, finished = completions[k]
                text, scored = texts[k], scores[k]
                comps.append(M.Completion(
                    generated_token_ids=np.asarray(gen_ids, dtype=np.int32),
                    old_policy_log_probs=old_lp[k], ref_policy_log_probs=ref_lp[k],
                    whole_token_ids=np.asarray(whole[k], dtype=np.int32), text=text,
                    reward=float(scored.reward), reward_info=dict(scored.info), is_finished=finished))
            groups.append(M.Group(
                sampler_id=cfg.sampler_id, group_id=f"s{cfg.sampler_id}-r{round_idx}-g{gi}",
                policy_version=versions[j][0], max_version=versions[j][1], prefix=prompt,
                prefix_tokens=tok.convert_ids_to_tokens(pids), prefix_token_ids=np.asarray(pids, dtype=np.int32),
                completions=comps, meta={"answer": problem.answer.split("####")[-1].strip()[:64],
                                         **({"task": problem.columns["rg_task"]} if "rg_task" in problem.columns
                                            else {})},
                incarnation=self.incarnation))
        n_tokens = sum(len(c) for c, _ in completions)
        if self.engine is not None:
            self.counters.put(stream={f"stream_{k}": float(v) for k, v in self.engine.stream_counts.items()})
        self.counters.add(samples=len(completions), tokens=n_tokens, gen_s=gen_s, logprob_s=logprob_s,
                          reward_s=reward_s)
        if self.device.type == "cuda":
            # torch's peak counters cover the time since the last self.gpu.sample() (it resets them,
            # below): one round. The run's peak is the largest of them.
            self.counters.raise_to(peak_mem_gb=torch.cuda.max_memory_allocated(self.device) / 2**30,
                                   peak_reserved_gb=torch.cuda.max_memory_reserved(self.device) / 2**30)
        rewards = [sc.reward for sc in scores]   # every completion, filtered or not: the train reward
        dropped = (f", {len(gis) - len(keep)} of {len(gis)} groups zero-signal"
                   if cfg.filter_zero_signal else "")
        swapped = f" (swapped in flight: tokens of v{version}-v{newest})" if newest != version else ""
        # A streaming sampler's chunk counts the seconds since its last chunk: groups that ended at the
        # same host check as the last ones have next to none, and a rate over them would be noise.
        rate = f"{n_tokens / gen_s:.0f} tok/s" if gen_s >= 0.01 else "same check as the last"
        log.info("round %d (v%d): %d completions, %d tokens in %.2f s (%s)%s; log-probs %.2f s, "
                 "rewards %.2f s; reward mean %.3f%s%s", round_idx, version, len(completions), n_tokens, gen_s,
                 rate, swapped, logprob_s, reward_s, float(np.mean(rewards)), dropped, format_gpu(self.gpu.sample()))
        return groups

    @torch.no_grad()
    def _logprobs(self, model, whole: list[list[int]], prompt_lens: list[int]) -> list[np.ndarray]:
        """Per generated token log-probs from a teacher-forced pass, in micro-batches of
        similar lengths (sorted first, so each pads only to its own longest sequence)."""
        out: list[np.ndarray | None] = [None] * len(whole)
        order = sorted(range(len(whole)), key=lambda i: len(whole[i]))
        bs = self.cfg.logprob_batch_size
        for s in range(0, len(order), bs):
            idx = order[s:s + bs]
            ids, mask = right_pad([whole[i] for i in idx], self.tok.pad_token_id, self.device)
            first = torch.tensor([prompt_lens[i] - 1 for i in idx])            # [b]: the completions only
            lp = token_logprobs(model, ids, mask, self.cfg.temperature, first=first).cpu()   # [b, L-1]
            for j, i in enumerate(idx):
                p = prompt_lens[i]
                # token t (t >= p) is predicted at position t-1
                out[i] = lp[j, p - 1:len(whole[i]) - 1].numpy().astype(np.float32)
        return out
