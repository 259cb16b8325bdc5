"""The rollout workflow: prompts in, scored groups out (the job of AReaL's RLVRWorkflow.arun_episode).

One round: take the next prompts of this sampler's shard, generate G completions each, score them,
drop zero-signal groups (--filter-zero-signal) before any log-prob pass, take or compute the
behaviour (old) log-probs and compute the reference ones when the run needs them, and build the
wire's Groups. Every round takes one path, a stream (stream_round over rollout_stream): the engine
asks the round for prompts and yields groups as they end, and finished groups leave in chunks. In
flight (--in-flight-rows) that is the engine's stream; a fixed round is a stream with a prompt cap
and no weight swaps, which the engine (or Hugging Face generate) decodes as one batch
(grpo.generate.batch's BatchStream), finished whole as one chunk.

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
import contextlib
import itertools
import logging
import time
from dataclasses import dataclass, field
from typing import Callable

import numpy as np
import torch

from grpo.config import SamplerConfig
from grpo.data.prompts import Deferrals, PromptStream, problem_prompt
from grpo.data.sources import load_problems, shard
from grpo.data.tasks import SuccessWindow, start_levels
from grpo.generate.backend import Rollout, hf_rollout
from grpo.generate.batch import BatchStream
from grpo.generate.engine import RolloutEngine
from grpo.generate.stream import FinishedGroup, Stream
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


def solved_and_unsolved(corrects: list[list[float | None]]) -> tuple[int, int]:
    """Of the groups dropped for no signal, by each completion's 'correct' (the rewards' correctness
    part; None where a reward set has none): how many every completion solved (too easy for the
    policy now) and how many none did (too hard); a group without 'correct' counts in neither.
    [[1, 1], [0, 0], [0, 0], [None, None]] -> (1, 2)."""
    known = [c for c in corrects if c and all(x is not None for x in c)]
    return sum(all(x == 1.0 for x in c) for c in known), sum(all(x == 0.0 for x in c) for c in known)


def stream_line(stats: dict, elapsed: float) -> str:
    """The run's in-flight decoding in one line, from the stream_* stats (empty without streams):
    steps and their device time, the share of the run's seconds they cover, the share of row-steps
    that had a sample, the host seconds asking for prompts, prefilling and refilling (with
    --refill-behind while a check's steps run, otherwise with none queued) and at the checks, and
    the host's wait for the queued work at the checks' syncs, and the weight swaps taken in flight with
    their host seconds each."""
    steps = stats.get("stream_steps", 0.0)
    if not steps:
        return ""
    dev = stats["stream_decode_s"]
    return (f"stream: {steps:,.0f} decode steps, {dev / steps * 1e3:.2f} ms each on the device ({dev:.0f} s, "
            f"{dev / max(elapsed, 1e-9):.0%} of {elapsed:.0f} s), rows busy {stats['stream_busy_row_steps'] / max(stats['stream_row_steps'], 1):.1%}; "
            f"{stats['stream_prompts']:,.0f} prompts prefilled and refilled in {stats['stream_refill_s']:.1f} s, "
            f"checks {stats['stream_check_s']:.1f} s, waiting at the syncs {stats['stream_sync_s']:.1f} s (host)"
            + (f"; {swaps:,.0f} weight swaps in flight, {stats['stream_swap_s'] / swaps * 1e3:.1f} ms each (host)"
               if (swaps := stats.get("stream_swaps", 0.0)) else ""))


class Prompts:
    """This sampler's shard of the train split as its prompt stream, at the curriculum's levels
    (--curriculum: every task starts at level 0; the learner's answers move the levels)."""

    def __init__(self, cfg: SamplerConfig):
        self.cfg = cfg
        self.levels = start_levels(cfg.data.dataset) if cfg.data.curriculum else None
        self.window = SuccessWindow(cfg.data.curriculum_window)
        # --defer-zero-signal: prompts whose last group had no signal, passed over once (kept across
        # curriculum reloads: a prompt is known by its text)
        self.deferrals = Deferrals() if cfg.rollout.defer_zero_signal else None
        self.mine = self._load()

    def _load(self) -> list:
        cfg = self.cfg
        problems = load_problems(cfg.data.dataset, "train", limit=cfg.data.dataset_limit or None, seed=cfg.run.seed,
                                 transform=cfg.data.dataset_transform, levels=self.levels)
        mine = shard(problems, cfg.run.sampler_id, cfg.run.num_samplers)
        if not mine:
            raise ValueError(f"sampler {cfg.run.sampler_id} of {cfg.run.num_samplers} got no prompts "
                             f"from {len(problems)} problems; use fewer samplers or more data")
        for task, level in (self.levels or {}).items():
            self.window.set_level(task, level)
        self.stream = PromptStream(mine, seed=cfg.run.seed + cfg.run.sampler_id, deferrals=self.deferrals)
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
    engine: RolloutEngine | None   # None: Hugging Face generate for fixed rounds; with backend 'vllm', vLLM's
    #                                (grpo.generate.vllm_engine.VllmEngine, a stream of its own)
    eos_ids: list[int]             # every id that ends a completion
    device: torch.device
    path: str                      # --model resolved: the reference model loads from it when a run needs one
    backend: str                   # 'fast' (our engine), 'hf' (Hugging Face generate) or 'vllm' (vLLM's engine)
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
        return next_round_prompts(self.cfg.rollout.prompts_per_round, self.client.budget, step, self.signal_share(),
                                  self.cfg.rollout.max_prompts_per_round, self.bucket_prompts())

    def bucket_prompts(self) -> int:
        """grpo.rules.staleness.bucket_prompts for this sampler's engine (a round of a small step's worth,
        2 groups with the defaults, takes as long as this many)."""
        return bucket_prompts(self.engine.buckets if self.engine is not None else (), self.cfg.rollout.num_generations)

    def signal_share(self) -> float:
        """The share of the last SIGNAL_GROUPS groups scored that had signal (grpo.rules.staleness.signal_share)."""
        r = self.cfg.rollout   # (a prompt dropped at its screen is not sent either)
        return signal_share(self._signal, r.filter_zero_signal or bool(r.screen_generations))

    def longest_prompt(self) -> int:
        """The longest prompt of this sampler's shard, in tokens (at its curriculum levels): a stream's
        ring is made that wide at once, so that no later prompt makes it drain for a wider one."""
        mine = self.prompts.mine
        if self._longest[0] is not mine:
            self._longest = (mine, max(map(len, self.tok([problem_prompt(self.tok, p) for p in mine],
                                                         add_special_tokens=False)["input_ids"])))
        return self._longest[1]

    # ------------------------------------------------------------------ one round: the stream
    def rollout_stream(self) -> Stream:
        """What a round is generated through, the one rollout path: a stream (grpo.generate.stream's
        interface). In flight (--in-flight-rows), the engine's own (its RingStream; on a model it cannot
        serve, fixed batches of Hugging Face generate). A fixed round, a BatchStream: the round's
        prompts (stream_round caps them) decoded as one batch, by the engine's generate or, with
        --generation-backend hf, Hugging Face generate. With --generation-backend vllm, vLLM's engine
        (grpo.generate.vllm_engine) for both: a fixed round is its stream without a row cap (the
        round's prompts, all in flight at once)."""
        if self.cfg.rollout.in_flight_rows or self.model.backend == "vllm":
            return self.engine
        return BatchStream(self.engine.generate if self.engine is not None else self._hf_batch)

    def _hf_batch(self, prompts: list[list[int]], max_new_tokens: int, temperature: float, greedy: bool,
                  should_stop: Callable[[], bool] | None) -> Rollout:
        return hf_rollout(self.policy, prompts, max_new_tokens, temperature, greedy, self.eos_ids,
                          self.tok.pad_token_id, should_stop)

    @torch.no_grad()
    def stream_round(self, round_idx: int, n_prompts: int, ends: Callable[[], bool] = lambda: False):
        """One round through the rollout stream (rollout_stream): yields lists of finished groups,
        scored and with their log-probs, as soon as a learner step's worth has ended (or the round
        has). In flight, the engine gives the rows their samples freed to the round's next samples;
        a fixed round (--in-flight-rows 0) is one batch, finished whole once it has ended.

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
        rnd = _Round(self, n_prompts, ends)
        stream = self.rollout_stream().stream(
            rnd.next_prompt, cfg.rollout.num_generations, cfg.rollout.max_new_tokens, cfg.rollout.temperature,
                                              rows=cfg.rollout.in_flight_rows,
            should_stop=client.stop_said, swap=rnd.swap if self.swaps else None, version=client.version,
            min_width=self.longest_prompt() if self.swaps else 0)
        for fg in itertools.chain(stream, [None]):   # None: the round has ended, send what is left
            if fg is not None:
                rnd.add(fg)
            # Round 0 before the learner's first answer: the answer is taken as soon as it has come,
            # and waited for before anything is finished (scored, sent) and at the round's end.
            if client.awaiting_first and (fg is None or rnd.full() or client.answers_waiting()):
                t_wait = time.perf_counter()
                if not client.first_answer():
                    return   # abandoned: nothing of this round was or is sent
                rnd.t0 += time.perf_counter() - t_wait   # (waiting is not generating)
            if fg is None and client.stop is not None:
                return   # cut short: the groups not yet sent are not scored, counted or sent
            # Streaming, what has ended leaves at the end of each host check that ended something:
            # a group held back for a fuller chunk would only age.
            if rnd.gis and (fg is None or rnd.full() or (rnd.streaming() and fg.last_in_check)):
                yield self._finish(round_idx, rnd.take())
                rnd.t0 = time.perf_counter()   # (the next chunk's generation starts once this one is sent)

    # ------------------------------------------------------------------ finishing a chunk of groups
    def _finish(self, round_idx: int, chunk: Chunk) -> list[M.Group]:
        """A chunk of the round's groups (G rows each): score, count for the curriculum, drop
        zero-signal ones (--filter-zero-signal), take or compute old (and compute reference)
        log-probs, build. A group's policy_version is the oldest version its tokens were drawn by,
        by which its age is counted."""
        cfg, G = self.cfg, self.cfg.rollout.num_generations
        whole = [chunk.prompt_ids[k // G] + c for k, (c, _) in enumerate(chunk.completions)]
        t1 = time.perf_counter()
        texts, scores, signal = self._score(chunk)
        # Scored before the log-prob passes, so that with --filter-zero-signal a group whose
        # rewards are all equal (zero advantage: the learner would drop it) costs no passes and
        # is not sent; it still counts as offered, and the learner's books see it as dropped.
        keep = [j for j in range(len(chunk.gis)) if not cfg.rollout.filter_zero_signal or signal[j]]
        t2 = time.perf_counter()
        old_lp, ref_lp = self._old_and_ref(chunk, whole, [k for j in keep for k in range(j * G, (j + 1) * G)])
        reward_s, logprob_s = t2 - t1, time.perf_counter() - t2   # (_logprobs ends in .cpu(): done by now)
        # A filtered group was offered and dropped here: groups_sent counts it with dropped_zero_signal
        # (SamplerCounters.groups_sent), so every status has sent >= what it says it dropped, and a
        # round filtered whole is counted although nothing of it is sent.
        solved, unsolved = solved_and_unsolved(
            [[sc.info.get("correct") for sc in scores[j * G:(j + 1) * G]] for j in range(len(chunk.gis)) if j not in keep])
        self.counters.add(dropped_zero_signal=len(chunk.gis) - len(keep), zero_signal_solved=solved,
                          zero_signal_unsolved=unsolved)
        # a prompt dropped at its screen is a group without signal for the round's sizing (pool_room)
        self._signal.append((len(keep), len(chunk.gis) + chunk.screened_out))
        groups = [self._group(round_idx, chunk, j, whole, texts, scores, old_lp, ref_lp) for j in keep]
        self._account(round_idx, chunk, [sc.reward for sc in scores], len(keep), reward_s, logprob_s)
        return groups

    def _score(self, chunk: Chunk) -> tuple[list[str], list, list[bool]]:
        """Every completion's text and score (a screen's rows were decoded and scored already:
        chunk.known), and per group whether it has signal; every group counts for its task's
        curriculum window and for the deferrals, filtered or not."""
        G, known = self.cfg.rollout.num_generations, chunk.known
        texts = [known[k][0] if k in known else self.tok.decode(c, skip_special_tokens=True)
                 for k, (c, _) in enumerate(chunk.completions)]
        todo = [k for k in range(len(texts)) if k not in known]
        fresh = iter(self.score_rows([chunk.problems[k // G] for k in todo], [texts[k] for k in todo],
                                     [chunk.completions[k][0] for k in todo]))
        scores = [known[k][1] if k in known else next(fresh) for k in range(len(texts))]
        per_group = [scores[j * G:(j + 1) * G] for j in range(len(chunk.gis))]
        signal = [has_signal([sc.reward for sc in g]) for g in per_group]
        # a screened group's screen counted for the window and the deferrals already: its rest only
        self.note_groups(chunk.problems, [[sc for k, sc in enumerate(g, j * G) if k not in chunk.known]
                                          for j, g in enumerate(per_group)], signal)
        return texts, scores, signal

    def score_rows(self, problems: list, texts: list[str], token_ids: list[list[int]]) -> list:
        """Each completion's score (rewards.score). A completion a reward fails on costs that
        completion its score (counted here, in the status the learner books); RewardBroken, when a
        reward fails on most, ends the sampler."""
        scores = self.rewards.score(problems, texts, token_ids) if texts else []
        failures = self.rewards.faults.stats()
        self.counters.put(reward_failures=failures.pop("reward_failures"), reward_kinds=failures)
        return scores

    def note_groups(self, problems: list, scores: list[list], signal: list[bool]) -> None:
        """Scored completions of each problem for its task's curriculum window, and whether its group
        had signal for the deferrals: every group, filtered or not (a screen when it is scored)."""
        if self.prompts.levels is not None:   # every group counts for its task, before any filter
            window = self.prompts.window
            for problem, group in zip(problems, scores):
                if group:
                    window.add(problem.columns.get("rg_task", ""), sum(sc.info.get("correct", 0.0) for sc in group),
                               len(group))
            self.counters.put(curriculum=window.stats())
        if (deferrals := self.prompts.deferrals) is not None:
            for problem, sig in zip(problems, signal):
                deferrals.mark(problem, sig)
            self.counters.put(prompts_deferred=float(deferrals.deferred))

    def _old_and_ref(self, chunk: Chunk, whole: list[list[int]], rows_kept: list[int]
                     ) -> tuple[dict[int, np.ndarray], dict[int, np.ndarray]]:
        """The kept rows' old log-probs (as sampled, or a teacher-forced pass) and reference ones
        (a pass with the frozen reference, loaded the first time; empty when the run needs none)."""
        G, facts = self.cfg.rollout.num_generations, self.client.run_facts
        kept_whole = [whole[k] for k in rows_kept]
        kept_plens = [len(chunk.prompt_ids[k // G]) for k in rows_kept]
        if self.old_source == "sampling" and chunk.sampled_lp is not None:   # --old-logprobs: exact, or asked for
            old_lp = {k: chunk.sampled_lp[k] for k in rows_kept}
        else:
            old_lp = dict(zip(rows_kept, self._logprobs(self.policy, kept_whole, kept_plens)))
        if facts is None or facts.needs_ref_logprobs:
            if self.ref is None:
                self.ref = load_causal_lm(self.model.path, self.device, compute_dtype(self.device)).eval()
            ref_lp = dict(zip(rows_kept, self._logprobs(self.ref, kept_whole, kept_plens)))
        else:   # not needed: the reference pass is skipped and the group carries none
            ref_lp = {k: np.zeros(0, np.float32) for k in rows_kept}
        return old_lp, ref_lp

    def _group(self, round_idx: int, chunk: Chunk, j: int, whole: list[list[int]], texts: list[str], scores: list,
               old_lp: dict[int, np.ndarray], ref_lp: dict[int, np.ndarray]) -> M.Group:
        """The chunk's group j as the wire's Group."""
        cfg, G = self.cfg, self.cfg.rollout.num_generations
        problem, pids = chunk.problems[j], chunk.prompt_ids[j]
        comps = []
        for k in range(j * G, (j + 1) * G):
            gen_ids, finished = chunk.completions[k]
            comps.append(M.Completion(
                generated_token_ids=np.asarray(gen_ids, dtype=np.int32),
                old_policy_log_probs=old_lp[k], ref_policy_log_probs=ref_lp[k],
                whole_token_ids=np.asarray(whole[k], dtype=np.int32), text=texts[k],
                reward=float(scores[k].reward), reward_info=dict(scores[k].info), is_finished=finished))
        return M.Group(
            sampler_id=cfg.run.sampler_id, group_id=f"s{cfg.run.sampler_id}-r{round_idx}-g{chunk.gis[j]}",
            policy_version=chunk.versions[j][0], max_version=chunk.versions[j][1], prefix=chunk.prompts[j],
            prefix_tokens=self.tok.convert_ids_to_tokens(pids), prefix_token_ids=np.asarray(pids, dtype=np.int32),
            completions=comps, meta={"answer": problem.answer.split("####")[-1].strip()[:64],
                                     **({"task": problem.columns["rg_task"]} if "rg_task" in problem.columns
                                        else {})},
            incarnation=self.incarnation)

    def _account(self, round_idx: int, chunk: Chunk, rewards: list[float], kept: int, reward_s: float,
                 logprob_s: float) -> None:
        """A finished chunk in the counters (samples, tokens, timings, stream counts, peaks) and in
        its one log line. rewards: every completion's, filtered or not (the train reward)."""
        cfg, gen_s = self.cfg, chunk.gen_s
        version = min((v for v, _ in chunk.versions), default=self.client.version)
        newest = max((v for _, v in chunk.versions), default=version)
        n_tokens = sum(len(c) for c, _ in chunk.completions)
        if self.engine is not None:
            self.counters.put(stream={f"stream_{k}": float(v) for k, v in self.engine.stream_counts.items()})
        self.counters.add(samples=len(chunk.completions), tokens=n_tokens, gen_s=gen_s, logprob_s=logprob_s,
                          reward_s=reward_s)
        if self.device.type == "cuda":
            # torch's peak counters cover the time since the last self.gpu.sample() (it resets them,
            # below): one round. The run's peak is the largest of them.
            self.counters.raise_to(peak_mem_gb=torch.cuda.max_memory_allocated(self.device) / 2**30,
                                   peak_reserved_gb=torch.cuda.max_memory_reserved(self.device) / 2**30)
        n = len(chunk.gis)
        dropped = f", {n - kept} of {n} groups zero-signal" if cfg.rollout.filter_zero_signal else ""
        if chunk.screened_out:
            dropped += f", {chunk.screened_out} prompts dropped at their screen"
        swapped = f" (swapped in flight: tokens of v{version}-v{newest})" if newest != version else ""
        # A streaming sampler's chunk counts the seconds since its last chunk: groups that ended at the
        # same host check as the last ones have next to none, and a rate over them would be noise.
        rate = f"{n_tokens / gen_s:.0f} tok/s" if gen_s >= 0.01 else "same check as the last"
        log.info("round %d (v%d): %d completions, %d tokens in %.2f s (%s)%s; log-probs %.2f s, "
                 "rewards %.2f s; reward mean %.3f%s%s", round_idx, version, len(chunk.completions), n_tokens, gen_s,
                 rate, swapped, logprob_s, reward_s, float(np.mean(rewards)), dropped, format_gpu(self.gpu.sample()))

    @torch.no_grad()
    def _logprobs(self, model, whole: list[list[int]], prompt_lens: list[int]) -> list[np.ndarray]:
        """Per generated token log-probs from a teacher-forced pass, in micro-batches of
        similar lengths (sorted first, so each pads only to its own longest sequence)."""
        out: list[np.ndarray | None] = [None] * len(whole)
        order = sorted(range(len(whole)), key=lambda i: len(whole[i]))
        bs = self.cfg.rollout.logprob_batch_size
        # the policy's pass with the layers its decode ran (--liger-decode: the patch's rotary function
        # is in place only inside its scope), as the sampling log-probs and the learner's were taken
        layers = getattr(self.engine, "layers", None) if model is self.policy else None
        with layers.passes() if layers is not None else contextlib.nullcontext():
            for s in range(0, len(order), bs):
                idx = order[s:s + bs]
                ids, mask = right_pad([whole[i] for i in idx], self.tok.pad_token_id, self.device)
                first = torch.tensor([prompt_lens[i] - 1 for i in idx])            # [b]: the completions only
                lp = token_logprobs(model, ids, mask, self.cfg.rollout.temperature, first=first).cpu()   # [b, L-1]
                for j, i in enumerate(idx):
                    p = prompt_lens[i]
                    # token t (t >= p) is predicted at position t-1
                    out[i] = lp[j, p - 1:len(whole[i]) - 1].numpy().astype(np.float32)
        return out


@dataclass
class Chunk:
    """Finished groups of a round, to be scored and sent together: per group its index in the round
    (gi), its prompt (problem, text, ids) and the (oldest, newest) version its tokens were drawn by;
    per row (G a group, in group order) its completion (ids, ended with EOS) and, when the engine
    gives them, its sampled log-probs (None: a pass computes the old ones)."""
    gis: list[int]
    problems: list
    prompts: list[str]
    prompt_ids: list[list[int]]
    completions: list[tuple[list[int], bool]]
    sampled_lp: list[np.ndarray] | None
    versions: list[tuple[int, int]]
    gen_s: float                  # the seconds spent generating it (since the last chunk, waits left out)
    known: dict[int, tuple[str, object]] = field(default_factory=dict)   # row -> (text, score): a screen's rows
    screened_out: int = 0         # prompts dropped at their screen since the last chunk (no group, no row here)


class _Round:
    """One round of RolloutWorkflow.stream_round: the source its stream asks for prompts (next_prompt:
    at most n_prompts; streaming, as the budget allows until ends()), the swap it offers the stream,
    the prompts started and not yet finished (by index), and the finished groups gathered into the
    next chunk (add, full, take)."""

    def __init__(self, workflow: RolloutWorkflow, n_prompts: int, ends: Callable[[], bool]):
        self.wf, self.n_prompts, self.ends = workflow, n_prompts, ends
        self.started: dict[int, tuple[object, str, list[int]]] = {}   # index -> (problem, text, ids)
        self.taken = self.done = 0   # prompts started; groups finished (sent, filtered or screened out)
        self.gis: list[int] = []
        self.rows: list[tuple[list[int], bool]] = []
        self.sampled_lp: list[np.ndarray] | None = []
        self.versions: list[tuple[int, int]] = []   # per group: (oldest, newest) version among its tokens
        self.known: dict[int, tuple[str, object]] = {}   # row of the next chunk -> (text, score): a screen's rows
        # --screen-generations K: a prompt starts as K samples; a screen whose rewards differ waits in
        # `held` (its group, texts and scores) while the other G - K are generated, asked for first
        # (`rest`), before any new prompt and whatever the budget: the prompt is in flight already.
        self.screen = workflow.cfg.rollout.screen_generations
        self.held: dict[int, tuple[FinishedGroup, list[str], list]] = {}
        self.rest: collections.deque[int] = collections.deque()
        self.screened_out = 0   # prompts dropped at their screen since the last chunk
        self.t0 = time.perf_counter()

    def streaming(self) -> bool:   # (round 0 may learn the run's facts, and so the step's size, as it goes)
        return self.wf.swaps and not self.wf.client.awaiting_first

    def chunk(self) -> int:
        """Groups a chunk holds at most: this sampler's share of a learner step when streaming,
        otherwise a step; a fixed round (one batch, all ended at once) is finished whole."""
        cfg, facts = self.wf.cfg, self.wf.client.run_facts
        if not cfg.rollout.in_flight_rows:
            return max(1, self.n_prompts)
        step = facts.groups_per_step if facts is not None else cfg.rollout.prompts_per_round or FIRST_STEP_GROUPS
        return max(1, -(-step // cfg.run.num_samplers) if self.streaming() else step)

    def next_prompt(self) -> tuple[int, list[int]] | tuple[int, list[int], int] | None:
        """The stream's source: the next prompt of the shard as (index, ids), or None for now. With
        screening, (index, ids, K) for a new prompt, and first of all (index, ids, G - K) for the rest
        of a screened group."""
        wf, cfg = self.wf, self.wf.cfg
        if self.rest:
            i = self.rest.popleft()
            return i, self.started[i][2], cfg.rollout.num_generations - self.screen
        if not self.streaming():
            if self.taken >= self.n_prompts:
                return None
        elif ((cfg.rollout.prompts_per_round and self.taken >= cfg.rollout.prompts_per_round) or self.ends()
              or pool_room(wf.client.live_budget(), self.taken - self.done, wf.signal_share()) == 0):
            return None
        problem = wf.prompts.stream.next_batch(1)[0]
        text, ids = encode_prompts(wf.tok, [problem])
        self.started[self.taken] = (problem, text[0], ids[0])
        self.taken += 1
        return (self.taken - 1, ids[0], self.screen) if self.screen else (self.taken - 1, ids[0])

    def swap(self) -> int | None:
        # Once the round is ending for an evaluation, the weights stay at the version due for it
        # (the baseline is version 0's) while the rows in flight end.
        return None if self.ends() else self.wf.client.apply_newer_now()

    def add(self, fg: FinishedGroup) -> None:
        """A group the stream finished into the next chunk; with screening, a screen is scored first
        (held for its rest, or dropped) and a rest joins its screen into the whole group."""
        if self.screen:
            if fg.key not in self.held:
                self._screened(fg)
                return
            first, texts, scores = self.held.pop(fg.key)
            self.known.update((len(self.rows) + n, ts) for n, ts in enumerate(zip(texts, scores)))
            fg = joined(first, fg)
        self.gis.append(fg.key)
        self.versions.append((fg.min_version, fg.max_version))
        self.rows.extend(zip(fg.token_ids, fg.finished))
        if fg.logprobs is None or self.sampled_lp is None:
            self.sampled_lp = None   # an engine without log-probs (Hugging Face generate): a pass gives them
        else:
            self.sampled_lp.extend(fg.logprobs)

    def _screened(self, fg: FinishedGroup) -> None:
        """A prompt's first K completions, scored: rewards that differ hold them for the rest of the
        group; all alike drop the prompt here (counted, by kind, and noted for its curriculum window
        and its deferral as any group is)."""
        wf = self.wf
        problem = self.started[fg.key][0]
        texts = [wf.tok.decode(c, skip_special_tokens=True) for c in fg.token_ids]
        scores = wf.score_rows([problem] * len(texts), texts, fg.token_ids)
        signal = has_signal([sc.reward for sc in scores])
        wf.note_groups([problem], [scores], [signal])
        if signal:
            self.held[fg.key] = (fg, texts, scores)
            self.rest.append(fg.key)
            return
        solved, unsolved = solved_and_unsolved([[sc.info.get("correct") for sc in scores]])
        wf.counters.add(screened_out=1, screened_solved=solved, screened_unsolved=unsolved,
                        screen_samples=len(texts), samples=len(texts), tokens=sum(map(len, fg.token_ids)))
        self.started.pop(fg.key)
        self.done += 1
        self.screened_out += 1

    def full(self) -> bool:
        return len(self.gis) >= self.chunk()

    def take(self) -> Chunk:
        """The groups gathered so far as a chunk; their prompts are finished with (counted done)."""
        problems, prompts, prompt_ids = zip(*(self.started.pop(gi) for gi in self.gis))
        chunk = Chunk(self.gis, list(problems), list(prompts), list(prompt_ids), self.rows, self.sampled_lp,
                      self.versions, time.perf_counter() - self.t0, self.known, self.screened_out)
        self.done += len(self.gis)   # (sent by the time the stream asks again: the caller sends a chunk first)
        self.gis, self.rows, self.sampled_lp, self.versions, self.known = [], [], [], [], {}
        self.screened_out = 0
        return chunk


def joined(first: FinishedGroup, rest: FinishedGroup) -> FinishedGroup:
    """A screened group whole: its screen's rows, then its rest's, with the versions of both."""
    vs = first.versions + rest.versions
    logprobs = None if first.logprobs is None or rest.logprobs is None else first.logprobs + rest.logprobs
    return FinishedGroup(rest.key, first.token_ids + rest.token_ids, first.finished + rest.finished, logprobs,
                         first.decode_steps + rest.decode_steps, vs, min(first.min_version, rest.min_version),
                         max(first.max_version, rest.max_version), rest.last_in_check)
