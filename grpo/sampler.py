"""The sampler: generate G completions per prompt, score them, compute behaviour and
reference log-probs with a teacher-forced pass, and send whole groups to the learner.

Weights are swapped only between rounds (never while a round generates), so every token
of a round was sampled by one policy version, which is the version the groups carry.
"""
from __future__ import annotations

import logging
import secrets
import time
from dataclasses import asdict

import numpy as np
import torch

from grpo import protocol as P
from grpo.config import SamplerConfig
from grpo.data import PromptStream, build_prompt, load_problems, shard
from grpo.heartbeat import ON_FULL, Heartbeat, send_group, wait_send
from grpo.model import (compute_dtype, load_causal_lm, load_tokenizer, pick_device, resolve_model,
                        right_pad, token_logprobs)
from grpo.rewards import gsm8k_reward
from grpo.security import CLIENT, curve_for
from grpo.transport import DataSender, SyncClient
from grpo.weight_sync import apply_weights, request_weights

log = logging.getLogger(__name__)


class Sampler:
    def __init__(self, cfg: SamplerConfig):
        self.cfg = cfg
        if cfg.on_full not in ON_FULL:
            raise ValueError(f"--on-full {cfg.on_full}: choose one of {', '.join(ON_FULL)}")
        curve = curve_for(cfg.curve_keys, CLIENT)  # bad keys fail here, before the model loads
        self.device = pick_device(cfg.device, cfg.gpu_id)
        torch.manual_seed(cfg.seed + 1000 * cfg.sampler_id)
        problems = load_problems(cfg.dataset, "train", limit=cfg.dataset_limit or None, seed=cfg.seed)
        mine = shard(problems, cfg.sampler_id, cfg.num_samplers)
        if not mine:
            raise ValueError(f"sampler {cfg.sampler_id} of {cfg.num_samplers} got no prompts "
                             f"from {len(problems)} problems; use fewer samplers or more data")
        self.prompts = PromptStream(mine, seed=cfg.seed + cfg.sampler_id)
        path = resolve_model(cfg.model)
        self.tok = load_tokenizer(path)
        dtype = compute_dtype(self.device)
        self.policy = load_causal_lm(path, self.device, dtype).eval()
        self.ref = load_causal_lm(path, self.device, dtype).eval()  # frozen: never receives weights
        self.vocab_size = self.policy.get_input_embeddings().weight.shape[0]
        self.version = 0
        self._request_id = 0
        self.groups_sent = 0  # groups offered to the data socket, including those dropped at the HWM
        # A restart under the same --sampler-id is a new process with fresh counts: the
        # learner's books tell the two apart by this random id.
        self.incarnation = secrets.randbits(48)
        self.data = DataSender(cfg.host, cfg.data_port, hwm=cfg.send_hwm, curve=curve)
        # Accept weights up to float32 size whatever our own dtype: a learner may publish fp32.
        total = sum(p.numel() * 4 for p in self.policy.parameters())
        self.sync = SyncClient(cfg.host, cfg.sync_port, P.weights_limits(total + (64 << 20)), curve=curve)
        # A fixed key set: the heartbeat thread reads this dict while the main thread updates it.
        self.stats = {"samples": 0.0, "tokens": 0.0, "gen_s": 0.0, "sync_s": 0.0, "weight_bytes": 0.0,
                      "weight_syncs": 0.0, "apply_s": 0.0, "rounds": 0.0, "dropped_full": 0.0,
                      "dropped_send_timeout": 0.0}
        self.heartbeat = Heartbeat(DataSender(cfg.host, cfg.data_port, hwm=2, curve=curve),
                                   cfg.heartbeat_interval_s, lambda: self._status(final=False))
        log.info("sampler %d/%d on %s: %d prompts in its shard, model %s, G=%d, %d prompts per round",
                 cfg.sampler_id, cfg.num_samplers, self.device, len(mine), path, cfg.num_generations,
                 cfg.prompts_per_round)

    # ------------------------------------------------------------------ weights
    def sync_weights(self) -> bool:
        """Ask for newer weights and apply the newest answer; False when the learner says stop.

        Waits (up to sync_timeout_s) for the answer to *this* request, recognised by its
        request id; answers to earlier requests that arrive meanwhile are used too if they
        carry newer weights, but never mistaken for this one.
        """
        t0 = time.perf_counter()
        self._request_id += 1
        answered, newest, stop = request_weights(self.sync, self.cfg.sampler_id, self.version,
                                                 self._request_id, self.cfg.sync_timeout_s)
        if stop is not None:
            log.info("learner says stop (%s) at version %d", stop.reason, stop.version)
            return False
        if not answered:
            log.info("no answer from the learner at %s:%d within %.1f s; generating with version %d",
                     self.cfg.host, self.cfg.sync_port, self.cfg.sync_timeout_s, self.version)
        if newest is not None:
            t_apply = time.perf_counter()
            apply_weights(self.policy, newest)
            if self.device.type == "cuda":
                torch.cuda.synchronize()  # count the copy, not just its launch
            self.stats["apply_s"] += time.perf_counter() - t_apply
            self.stats["weight_syncs"] += 1
            self.version = newest.version
            self.stats["weight_bytes"] += sum(newest.bucket_nbytes)
            log.info("now running policy version %d (%.1f MB applied in %.3f s)", self.version,
                     sum(newest.bucket_nbytes) / 1e6, time.perf_counter() - t_apply)
        self.stats["sync_s"] += time.perf_counter() - t0
        return True

    # ------------------------------------------------------------------ one round
    @torch.no_grad()
    def generate_round(self, round_idx: int) -> list[P.Group]:
        cfg, tok = self.cfg, self.tok
        problems = self.prompts.next_batch(cfg.prompts_per_round)
        prompts = [build_prompt(tok, p.question, None) for p in problems]
        prompt_ids = [tok(p, add_special_tokens=False)["input_ids"] for p in prompts]
        G = cfg.num_generations
        t0 = time.perf_counter()
        # Left padding for generation: every row's next token is in the last column.
        width = max(len(p) for p in prompt_ids)
        ids = torch.full((len(prompts) * G, width), tok.pad_token_id, dtype=torch.long)
        attn = torch.zeros_like(ids)
        for i, p in enumerate(prompt_ids):
            ids[i * G:(i + 1) * G, width - len(p):] = torch.tensor(p)
            attn[i * G:(i + 1) * G, width - len(p):] = 1
        out = self.policy.generate(
            input_ids=ids.to(self.device), attention_mask=attn.to(self.device), do_sample=True,
            temperature=cfg.temperature, top_k=0, top_p=1.0, max_new_tokens=cfg.max_new_tokens,
            pad_token_id=tok.pad_token_id, eos_token_id=tok.eos_token_id)
        gen = out[:, width:].cpu()
        completions: list[tuple[list[int], bool]] = []
        for row in gen.tolist():
            if tok.eos_token_id in row:  # keep the EOS: the policy must learn to stop
                cut = row.index(tok.eos_token_id) + 1
                completions.append((row[:cut], True))
            else:
                completions.append((row, False))
        gen_s = time.perf_counter() - t0

        whole = [prompt_ids[i // G] + c for i, (c, _) in enumerate(completions)]
        prompt_lens = [len(prompt_ids[i // G]) for i in range(len(whole))]
        old_lp = self._logprobs(self.policy, whole, prompt_lens)
        ref_lp = self._logprobs(self.ref, whole, prompt_lens)

        groups = []
        for gi, (problem, prompt, pids) in enumerate(zip(problems, prompts, prompt_ids)):
            comps = []
            for k in range(gi * G, (gi + 1) * G):
                gen_ids, finished = completions[k]
                text = tok.decode(gen_ids, skip_special_tokens=True)
                scored = gsm8k_reward(text, problem.answer)
                comps.append(P.Completion(
                    generated_token_ids=np.asarray(gen_ids, dtype=np.int32),
                    old_policy_log_probs=old_lp[k], ref_policy_log_probs=ref_lp[k],
                    whole_token_ids=np.asarray(whole[k], dtype=np.int32), text=text,
                    reward=float(scored.reward), reward_info=dict(scored.info), is_finished=finished))
            groups.append(P.Group(
                sampler_id=cfg.sampler_id, group_id=f"s{cfg.sampler_id}-r{round_idx}-g{gi}",
                policy_version=self.version, prefix=prompt,
                prefix_tokens=tok.convert_ids_to_tokens(pids), prefix_token_ids=np.asarray(pids, dtype=np.int32),
                completions=comps, meta={"answer": problem.answer.split("####")[-1].strip()[:64]},
                incarnation=self.incarnation))
        n_tokens = sum(len(c) for c, _ in completions)
        self.stats["samples"] += len(completions)
        self.stats["tokens"] += n_tokens
        self.stats["gen_s"] += gen_s
        rewards = [c.reward for g in groups for c in g.completions]
        log.info("round %d (v%d): %d completions, %d tokens in %.2f s (%.0f tok/s), reward mean %.3f",
                 round_idx, self.version, len(completions), n_tokens, gen_s, n_tokens / max(gen_s, 1e-9),
                 float(np.mean(rewards)))
        return groups

    def _logprobs(self, model, whole: list[list[int]], prompt_lens: list[int]) -> list[np.ndarray]:
        """Per generated token log-probs from a teacher-forced pass, in micro-batches."""
        out: list[np.ndarray] = []
        bs = self.cfg.logprob_batch_size
        for s in range(0, len(whole), bs):
            chunk = whole[s:s + bs]
            ids, mask = right_pad(chunk, self.tok.pad_token_id, self.device)
            lp = token_logprobs(model, ids, mask, self.cfg.temperature).cpu()   # [b, L-1]
            for j, seq in enumerate(chunk):
                p = prompt_lens[s + j]
                # token t (t >= p) is predicted at position t-1
                out.append(lp[j, p - 1:len(seq) - 1].numpy().astype(np.float32))
        return out

    # ------------------------------------------------------------------ main loop
    def _status(self, final: bool) -> P.SamplerStatus:
        return P.SamplerStatus(sampler_id=self.cfg.sampler_id, policy_version=self.version,
                               groups_sent=self.groups_sent, final=final,
                               stats={k: float(v) for k, v in list(self.stats.items())},
                               incarnation=self.incarnation)

    def send_status(self, final: bool) -> None:
        if final:  # the learner's books need this one: wait for room, but not forever
            wait_send(self.data, self._status(True), self.cfg.send_timeout_s or 600.0, self._where)
        else:  # like a heartbeat: if the queue is full now, the next one says the same, newer
            self.data.send(self._status(False), timeout_s=0)

    @property
    def _where(self) -> str:
        return f"{self.cfg.host}:{self.cfg.data_port}"

    def run(self) -> dict:
        rounds = 0
        t_start = time.perf_counter()
        self.heartbeat.start()
        try:
            while self.sync_weights():
                if self.cfg.max_rounds and rounds >= self.cfg.max_rounds:
                    break
                for group in self.generate_round(rounds):
                    self.groups_sent += 1  # offered: a group dropped at the HWM is counted too
                    send_group(self.data, group, self.cfg.on_full, self.cfg.send_timeout_s, self.stats,
                               self._where, f"group {self.groups_sent}")
                rounds += 1
                self.stats["rounds"] = rounds
                self.send_status(final=False)
            self.heartbeat.stop()  # no heartbeat may follow the final status
            self.send_status(final=True)
        finally:
            self.heartbeat.stop()
            elapsed = time.perf_counter() - t_start
            log.info("sampler %d done: %d rounds, %d groups sent, %.1f samples/s, %.2f MB sent, "
                     "last version %d", self.cfg.sampler_id, rounds, self.groups_sent,
                     self.stats["samples"] / max(elapsed, 1e-9), self.data.bytes_sent / 1e6, self.version)
            self.data.close()  # LINGER lets queued groups reach the learner
            self.sync.close()
        return {"rounds": rounds, "groups_sent": self.groups_sent, "version": self.version,
                "config": asdict(self.cfg), **self.stats}
