"""A generation engine for rollouts: static KV cache, one prefill, then a decode step
captured once as a CUDA graph and replayed for every token.

It runs the same Hugging Face model code as `generate` (so weights, rotary embeddings and
attention are the model's own), but drives it the way throughput engines do:

* a preallocated `transformers.StaticCache` of [batch, prompt width + max_new_tokens], so
  every decode step has the same shapes and tensor addresses;
* our own 4-D additive attention mask (HF passes a prepared 4-D mask through untouched),
  kept in a static buffer and updated on the device, so mask building never syncs;
* sampling on the GPU, one step for both paths (grpo.generate.sampling): Gumbel-max is an exact
  draw from softmax(logits/T) without `multinomial`; greedy is argmax; the sampled token's
  log-prob is computed on the way;
* finished rows keep running (fixed shapes) but emit padding after their EOS; the host
  looks at the "all finished" flag only every `check_every` steps, the one sync point;
* batch buckets (64, 128, 256, 512, 1024 rows; prompt width rounded up to 64) so one
  captured graph serves every round of a run; unused rows are padding rows that start finished;
* with `attend_chunk` (default 64; None or 0: the whole cache), attention over the filled part of the
  cache only: decode step k reads the prompt's slots and the next multiple of attend_chunk
  generated ones (`attend_limit`), one captured graph per such length (4 for 256 new tokens at
  64), instead of every slot at every step;
* with `compile_decode`, the decode step (and the in-flight ring's) goes through torch.compile
  before it is captured: one compilation per (shape, greedy, attention length).

Two paths over one engine: `generate` decodes fixed batches (a Slot per shape), here; `stream` keeps
rows in flight (a Ring of cache slots: a row whose sample ends takes the next one), and may take
new weights without draining: grpo.generate.stream's RingStream, which the engine holds (`ring`)
and which holds the engine. On a model the engine cannot serve, `stream` is grpo.generate.batch's
BatchStream over Hugging Face generate.

Architectures: any decoder whose layers are full or sliding-window attention (Llama, Qwen2/3,
Mistral, Phi-3, Gemma2/3, OLMo2 are tested: tests/generate/test_architectures.py); the attention,
the layer plan and the masks are grpo.generate.attention's. A model the engine cannot serve
(layer_plan: chunked or linear attention, attention sinks, ...) is said in one line when the
engine is built, which then decodes with Hugging Face generate (grpo.generate.backend's
hf_generate; `RolloutEngine.fallback` holds the reason).

On CPU (tests) the same code runs without graph capture. Weights may be updated between
calls in place (`param.copy_`, as weight sync does): the graph reads the parameters'
memory. If a parameter's storage changes between calls, captured graphs are dropped and
recaptured; during a stream (a swap) that is an error, since the ring's graph is in use.

Use `RolloutEngine(model, eos_ids, pad_id).generate(prompts, max_new_tokens, ...)`, or the
module function `generate(model, prompts_token_ids, max_new_tokens, temperature, greedy,
eos_id, pad_id)`, which keeps one engine per model.

--generation-backend picks this engine ('fast') or the model's own `generate` ('hf'): the rule
is grpo.generate.backend's.
"""
from __future__ import annotations

import collections
import contextlib
import logging
import time
import weakref
from typing import Callable

import numpy as np
import torch

from grpo.config import ROW_BUCKETS, SamplerRollout
from grpo.generate.attention import (LayerPlan, attend_limit, layer_masks, layer_plan, register_attention,
                                     rollout_attention_on)
# Rollout is backend's (a fixed batch's result, whichever decoder made it), re-exported here.
from grpo.generate.backend import Rollout, describe, eos_list, hf_rollout  # noqa: F401
from grpo.generate.batch import BatchStream
from grpo.generate.cache import Slot
from grpo.generate.capture import (COMPILED_VERSIONS, CaptureFailed, allow_recompiles, capture_decode,
                                   reset_generators_after_failed_capture)
from grpo.generate import decode_attention
from grpo.generate.fused_sampling import available as fused_available, check as fused_check, fused_sample_step, new_seed
from grpo.generate.sampling import new_generator, sample_step
from grpo.model.liger import FusedLayers, fuse
# FinishedGroup and the version rules are stream's, re-exported: callers import them from here too.
from grpo.generate.stream import (STREAM_COUNTS, FinishedGroup, RingStream, group_versions,  # noqa: F401
                                  token_versions)
from grpo.model.logprobs import left_pad, right_pad, token_logprobs

log = logging.getLogger(__name__)

# The sampler's default (one place: grpo.config), so that the evaluator and the probes, which build
# engines without a config, decode as the sampler does.
DEFAULT_ATTEND_CHUNK = SamplerRollout.attend_chunk


class RolloutEngine:
    """Our engine: fixed batches (generate) and rows in flight (stream, its RingStream)."""

    def __init__(self, model, eos_ids: int | list[int], pad_id: int, cuda_graphs: bool | None = None,
                 buckets: tuple[int, ...] | None = None, prompt_multiple: int | None = None,
                 check_every: int = 16, max_slots: int = 2, compile_decode: bool = False,
                 attend_chunk: int | None = DEFAULT_ATTEND_CHUNK, compile_ring: bool = False,
                 refill_behind: bool = False, fused_sampling: bool = True, liger_layers: bool = True,
                 fused_attention: bool = True):
        """cuda_graphs: capture the decode step (default: on CUDA). compile_decode: run the
        decode step through torch.compile first (fuses the many small kernels of a small
        model; compiled in the graph warm-up, then captured as usual). buckets / prompt_multiple:
        batch rows and prompt width are rounded up to these so graphs are reused (default:
        ROW_BUCKETS (grpo.config) and 64 with graphs, exact sizes without). max_slots: how many
        shapes keep their cache and graphs (least recently used ones are freed). attend_chunk: a
        decode step of generate() reads the cache only up to the next multiple of this many slots
        past the prompt (attend_limit), one captured graph per such length (with compile_decode, one
        compilation each too); None or 0: the whole cache at every step. compile_ring: compile only
        stream()'s step (implied by compile_decode): a ring has one shape, so one compilation, and
        generate() (evaluations, fixed rounds) keeps its plain captured steps. refill_behind: at each
        host check of stream(), queue the next check_every steps before prefilling new prompts and
        refilling the rows that ended, so the host's refill runs while the GPU decodes (otherwise the
        GPU waits for it); the rows refilled join one check later. fused_sampling: draw each token
        with one Triton kernel (grpo.generate.fused_sampling) where Triton runs on the device, in
        the steps torch.compile does not fuse (compile_decode: none; compile_ring: generate()'s).
        fused_attention: each decode step of stream()'s ring (the rollouts in flight) attends with one
        Triton kernel (grpo.generate.decode_attention) where Triton runs on the device, the model is in
        half precision and the kernel agrees with SDPA at the model's head shapes (checked here), unless
        torch.compile compiles the step. generate() keeps SDPA: its steps read the cache at a new length
        every attend_chunk slots, and each length would compile the kernel again (the ring's has one).
        liger_layers: Liger-Kernel's RMSNorm, SwiGLU and rotary kernels in the model (grpo.model.liger)
        where they run (CUDA, liger-kernel installed, a model type it serves); their module-level
        names are in place only inside the engine's passes (passes()).

        A model the engine cannot serve (layer_plan's reasons: chunked or linear attention, sinks,
        an encoder-decoder...; or a first tiny decode that raises) is said in one warning here, and
        the engine then decodes with Hugging Face generate (`fallback` holds the reason), its
        log-probs from a teacher-forced pass: callers keep working, never crash mid-run."""
        self.model = model
        param = next(model.parameters())
        self.device, self.dtype = param.device, param.dtype
        if cuda_graphs is None:
            cuda_graphs = self.device.type == "cuda"
        if cuda_graphs and self.device.type != "cuda":
            raise ValueError("cuda_graphs needs the model on a CUDA device; use cuda_graphs=False on CPU")
        self.cuda_graphs = cuda_graphs
        register_attention()
        self.layers: FusedLayers | None = None   # Liger's, once a test decode passed with them (below)
        impl = getattr(model.config, "_attn_implementation", "eager")
        if impl not in ("sdpa", "eager"):
            raise ValueError(f"the fast generation backend supports sdpa and eager attention, not {impl!r}; "
                             f"load the model with attn_implementation='sdpa' or use --generation-backend hf")
        self.eos = torch.tensor(eos_list(eos_ids), dtype=torch.long, device=self.device)
        self.pad_id = int(pad_id)
        self.buckets = tuple(sorted(buckets)) if buckets else (ROW_BUCKETS if cuda_graphs else ())
        self.prompt_multiple = prompt_multiple or (64 if cuda_graphs else 1)
        self.check_every = max(1, check_every)
        self.refill_behind = bool(refill_behind)
        self.attend_chunk = int(attend_chunk) if attend_chunk else None
        self.max_slots = max(1, max_slots)
        self.slots: collections.OrderedDict[tuple[int, int, int], Slot] = collections.OrderedDict()
        self._ptrs = self._param_ptrs()
        self.graph_failures = 0
        self.graph_failure_reasons: list[str] = []
        # Sampling noise comes from the engine's own generator (seeded from torch's global RNG,
        # so torch.manual_seed still makes runs repeatable). It is registered with every captured
        # graph; if a capture fails half-way it is replaced, so a failure can never leave the
        # generator that eager decoding draws from stuck in "capturing" state.
        self.gen = new_generator(self.device)
        # The fused kernel's noise: a device seed it advances itself, so graphs need not register it.
        self.fused = bool(fused_sampling) and not compile_decode and fused_available(self.device)
        # checked (and compiled by Triton) at the logits' width: the head's rows, a padded vocabulary included
        head = model.get_output_embeddings() if hasattr(model, "get_output_embeddings") else None
        width = int(head.weight.shape[0]) if head is not None else int(model.config.vocab_size)
        if self.fused and (why := fused_check(self.device, width)) is not None:
            log.warning("fused sampling cannot run here (%s): sampling with torch's ops", why)
            self.fused = False
        self.seed = new_seed(self.device) if self.fused else None
        self.attention_kernel = self._attention_kernel(fused_attention and not compile_decode)
        # torch.compile specialises on shapes (dynamic=False): one compilation per bucket shape,
        # greedy flag and attention length (COMPILED_VERSIONS).
        self.compile_decode = compile_decode
        self.compile_ring = compile_ring or compile_decode
        if self.compile_ring:
            allow_recompiles(COMPILED_VERSIONS)
        self._step = torch.compile(self._decode, dynamic=False) if compile_decode else self._decode
        # stream()'s path: its rings, its (compiled) step and its counts last from one stream to the next
        self.ring = RingStream(self, compile_ring=self.compile_ring, fused=self.fused and not self.compile_ring)
        self.plan: LayerPlan | None = None
        self.fallback: str | None = None
        try:
            self.plan = layer_plan(model)
        except ValueError as exc:
            self.fallback = str(exc)
        if self.fallback is None:
            self.fallback = self._probe()
        if self.fallback is not None:
            log.warning("the fast generation backend cannot serve this model (%s): decoding with Hugging Face "
                        "generate instead", self.fallback)
        elif (layers := decode_layers(model, liger_layers, self.device)) is not None:
            # Liger's layers only if a test decode passes with them too; else the patch is undone
            self.layers = layers
            if (why := self._probe()) is not None:
                layers.remove()
                self.layers = None
                log.warning("decode layers: Hugging Face's (Liger's failed a test decode: %s)", why)
            else:
                log.info("decode layers: Liger-Kernel's fused RMSNorm, SwiGLU and rotary embedding "
                         "(--no-liger-decode: Hugging Face's)")

    def _attention_kernel(self, wanted: bool) -> bool:
        """Whether decode steps run grpo.generate.decode_attention's kernel: wanted, Triton on the device,
        half precision on CUDA (float32 models keep SDPA's exact path), and a check at the model's head
        shapes that it agrees with SDPA; a failed check is said once."""
        half = self.dtype in (torch.float16, torch.bfloat16) or self.device.type != "cuda"
        if not (wanted and half and decode_attention.available(self.device)):
            return False
        cfg = self.model.config.get_text_config(decoder=True)
        heads = int(cfg.num_attention_heads)
        kv_heads = int(getattr(cfg, "num_key_value_heads", None) or heads)
        dim = int(getattr(cfg, "head_dim", None) or cfg.hidden_size // heads)
        if (why := decode_attention.check(self.device, kv_heads, heads // kv_heads, dim, self.dtype)) is not None:
            log.warning("the decode attention kernel cannot run here (%s): attention with SDPA", why)
            return False
        return True

    @contextlib.contextmanager
    def passes(self, kernel: bool = False):
        """Around each of the engine's forward passes (eager, or being captured): its attention (kernel:
        decode steps with the Triton kernel, the ring's when the engine chose it), and Liger's
        module-level names where its layers are on. A captured graph keeps the kernels chosen here."""
        with rollout_attention_on(self.model, kernel), (self.layers.passes() if self.layers else contextlib.nullcontext()):
            yield

    def _probe(self) -> str | None:
        """One prefill and one decode step of 2 rows (one with left padding) on a throwaway slot,
        eagerly: None, or why it failed (the reason to fall back, found at start-up)."""
        try:
            with torch.no_grad():
                slot = Slot(self.model, 2, 3, 2, self.pad_id, self.device, self.plan)
                ids, mask = left_pad([[self.pad_id] * 3, [self.pad_id] * 2], self.pad_id, self.device, width=3)
                self._prefill(slot, ids, mask.bool(), 1.0, True)
                self._decode(slot, True, None)
                if not bool(torch.isfinite(slot.out_lp).all()):
                    return "a test decode gave non-finite log-probs"
        except Exception as exc:   # noqa: BLE001 - any failure means: do not use the engine on this model
            return f"a test decode failed: {describe(exc)}"
        return None

    # ------------------------------------------------------------------ public
    @torch.no_grad()
    def generate(self, prompts: list[list[int]], max_new_tokens: int, temperature: float = 1.0,
                 greedy: bool = False, should_stop: Callable[[], bool] | None = None) -> Rollout:
        """Complete every prompt (token ids, unpadded). temperature 0 means greedy.

        should_stop: asked after every decode step (a Python call, no device sync: a slow model's
        step may take a second, so waiting for the next `check_every` could take many); once it says
        True, decoding ends there, `stats["stopped"]` is True and the rows are cut where they were
        (the caller discards them)."""
        if not prompts or any(len(p) == 0 for p in prompts):
            raise ValueError("generate needs at least one prompt, and no prompt may be empty")
        if max_new_tokens < 1:
            raise ValueError(f"max_new_tokens {max_new_tokens}: must be >= 1")
        greedy = greedy or temperature == 0
        if self.fallback is not None:
            return self._hf_rollout(prompts, max_new_tokens, temperature, greedy, should_stop)
        if self._param_ptrs() != self._ptrs:  # weights were replaced, not copied into: graphs are stale
            log.info("model parameters moved since the graphs were captured; recapturing")
            self.clear()
            self._ptrs = self._param_ptrs()
        t0 = time.perf_counter()
        top = self.buckets[-1] if self.buckets else len(prompts)
        toks, lps, fins, steps, stopped = [], [], [], 0, False
        for s in range(0, len(prompts), top):
            if stopped:   # the rest of the prompts get no decoding at all: padding rows
                rest = len(prompts) - s
                toks.append(torch.full((rest, max_new_tokens), self.pad_id, dtype=torch.long))
                lps.append(torch.zeros(rest, max_new_tokens))
                continue
            out, lp, fin, n, stopped = self._run(prompts[s:s + top], max_new_tokens, temperature, greedy,
                                                 should_stop)
            toks.append(out), lps.append(lp), fins.append(fin)
            steps += n
        # A row's first EOS ends it (kept: the policy must learn to stop); after it, padding.
        ids, finished, logprobs = self._cut(torch.cat(toks), torch.cat(lps))
        stats = {"gen_s": time.perf_counter() - t0, "decode_steps": steps, "stopped": stopped,
                 "tokens": sum(len(x) for x in ids), "cuda_graphs": self.cuda_graphs and not self.graph_failures}
        if self.graph_failure_reasons:
            stats["graph_failures"] = list(self.graph_failure_reasons)
        return Rollout(ids, finished, logprobs, stats)

    def stream(self, next_prompt, group_size: int, max_new_tokens: int, temperature: float = 1.0,
               greedy: bool = False, rows: int | None = None, should_stop: Callable[[], bool] | None = None,
               swap: Callable[[], int | None] | None = None, version: int = 0, min_width: int = 0):
        """Rows in flight: RingStream.stream (grpo.generate.stream says how). On a model the engine
        cannot serve, Hugging Face generate streams fixed batches of up to `rows` samples
        (BatchStream), swap() asked between batches (its batches drain)."""
        if self.fallback is None:
            return self.ring.stream(next_prompt, group_size, max_new_tokens, temperature, greedy, rows, should_stop,
                                    swap, version, min_width)
        if int(group_size) < 1 or max_new_tokens < 1:
            raise ValueError(f"stream needs group_size >= 1 and max_new_tokens >= 1, got {group_size} and "
                             f"{max_new_tokens}")
        rows = int(rows or (self.buckets[-1] if self.buckets else 8 * int(group_size)))
        return BatchStream(self._hf_rollout).stream(next_prompt, group_size, max_new_tokens, temperature, greedy,
                                                    rows, should_stop, swap, version)

    @property
    def stream_counts(self) -> dict[str, float]:
        """Where stream()'s time went, over the engine's streams (STREAM_COUNTS)."""
        return self.ring.counts

    def clear(self) -> None:
        """Free every cache and graph (they are rebuilt on the next call)."""
        self.slots.clear()
        self.ring.rings = {}
        if self.device.type == "cuda":
            torch.cuda.empty_cache()

    # ------------------------------------------------------------------ fallback (Hugging Face generate)
    def _hf_rollout(self, prompts, max_new, temperature, greedy, should_stop) -> Rollout:
        """generate() for a model the engine cannot serve: Hugging Face generate, then each token's
        log-prob under the sampling distribution from one teacher-forced pass."""
        t0 = time.perf_counter()
        out = hf_rollout(self.model, prompts, max_new, temperature, greedy, self.eos.tolist(), self.pad_id,
                         should_stop)
        whole = [list(p) + list(g) for p, g in zip(prompts, out.token_ids)]
        x, mask = right_pad(whole, self.pad_id, self.device)
        tf = token_logprobs(self.model, x, mask, 1.0 if greedy else temperature).float().cpu().numpy()
        out.logprobs = [tf[i, len(p) - 1:len(p) - 1 + len(g)].astype(np.float32)
                        for i, (p, g) in enumerate(zip(prompts, out.token_ids))]
        out.stats.update(gen_s=time.perf_counter() - t0, fallback=self.fallback)
        return out

    # ------------------------------------------------------------------ internals
    def _cut(self, out: torch.Tensor, lp: torch.Tensor) -> tuple[list[list[int]], list[bool], list[np.ndarray]]:
        """Rows of generated ids (and log-probs) cut after their first EOS, which is kept."""
        hit = (out.unsqueeze(-1) == self.eos.cpu()).any(-1)                          # [n, max_new]
        finished = hit.any(-1)
        cuts = torch.where(finished, hit.int().argmax(-1) + 1, out.shape[1]).tolist()
        lp = lp.numpy()
        return ([row[:c] for row, c in zip(out.tolist(), cuts)], finished.tolist(),
                [lp[i, :c].astype(np.float32) for i, c in enumerate(cuts)])

    @property
    def _eos_set(self) -> set[int]:
        return set(self.eos.tolist())

    def _param_ptrs(self) -> tuple[int, ...]:
        return tuple(p.data_ptr() for p in self.model.parameters())

    def _slot(self, rows: int, width: int, max_new: int) -> Slot:
        # Prompt widths vary from round to round: a slot whose width is a little larger serves
        # (more left padding) instead of capturing graphs for every width seen.
        fits = [k for k in self.slots if k[0] == rows and k[2] == max_new and width <= k[1] <= width * 3 // 2]
        if fits:
            key = min(fits, key=lambda k: k[1])
            self.slots.move_to_end(key)
            return self.slots[key]
        key = (rows, width, max_new)
        while len(self.slots) >= self.max_slots:
            self.slots.popitem(last=False)
            if self.device.type == "cuda":
                torch.cuda.empty_cache()
        slot = Slot(self.model, rows, width, max_new, self.pad_id, self.device, self.plan)
        self.slots[key] = slot
        return slot

    def _run(self, prompts, max_new, temperature, greedy, should_stop=None):
        n = len(prompts)
        rows = next((b for b in self.buckets if b >= n), n)
        width = max(len(p) for p in prompts)
        slot = self._slot(rows, -(-width // self.prompt_multiple) * self.prompt_multiple, max_new)
        width = slot.width
        ids, mask = left_pad(prompts, self.pad_id, self.device, width=width, rows=rows)
        valid = mask.bool()
        inv_t = 1.0 if greedy else 1.0 / temperature
        length = width + max_new
        limit = (lambda k: attend_limit(width, length, k, self.attend_chunk)) if self.attend_chunk else (lambda k: None)
        if self.cuda_graphs and max_new > 1:
            for lim in dict.fromkeys(limit(k) for k in range(1, max_new)):   # each length once, in order
                if (greedy, lim) not in slot.graphs:
                    self._prefill(slot, ids, valid, inv_t, greedy)  # initialises the cache; state is reset below
                    slot.graphs[(greedy, lim)] = self._capture(
                        slot, greedy, step=lambda s_, g_, lim=lim: self._step(s_, g_, lim), limit=lim)
        self._prefill(slot, ids, valid, inv_t, greedy)
        steps, stopped = 0, False
        for steps in range(1, max_new):
            lim = limit(steps)
            graph = slot.graphs.get((greedy, lim))
            if graph is not None:
                graph.replay()
            else:
                self._step(slot, greedy, lim)
            if should_stop is not None and should_stop():
                stopped = True
                break
            if steps % self.check_every == 0 and bool(slot.finished.all()):  # the only host sync
                break
        return slot.out[:n].cpu(), slot.out_lp[:n].cpu(), slot.finished[:n].cpu(), steps, stopped

    def _prefill(self, s: Slot, ids: torch.Tensor, valid: torch.Tensor, inv_t: float, greedy: bool) -> None:
        """Run the prompts through the model, filling the cache, and emit the first token."""
        P = s.width
        s.reset_cache()
        s.key_valid.fill_(True)
        s.key_valid[:, :P] = valid
        q = s.key_index[:P].view(1, P, 1)
        k = s.key_index.view(1, 1, -1)
        # Causal over real keys; a padding query also sees itself, so its row is never all
        # masked (that would give NaN hidden states, and NaN * 0 still leaks through attention).
        allowed = (k <= q) & (s.key_valid.unsqueeze(1) | (k == q))                  # [B, P, L]
        pos = (valid.long().cumsum(-1) - 1).clamp(min=0)                              # [B, P]
        # Slot i holds position i - (the row's padding) in every layer, and a row's real tokens are
        # contiguous: slot distance is position distance.
        with self.passes():
            logits = self.model(input_ids=ids, position_ids=pos,
                                attention_mask=layer_masks(self.plan, self.dtype, allowed.unsqueeze(1),
                                                           (q - k).unsqueeze(1)),
                                past_key_values=s.cache, use_cache=True, logits_to_keep=1).logits[:, -1]
        s.t.fill_(P)
        s.pos.copy_(valid.sum(-1, keepdim=True))
        s.col.zero_()
        s.finished.copy_(~valid.any(-1))  # bucket padding rows are done before they start
        s.out.fill_(self.pad_id)
        s.out_lp.zero_()
        s.inv_t.fill_(inv_t)
        self._emit(s, logits, greedy)

    def _decode(self, s: Slot, greedy: bool, limit: int | None = None) -> None:
        """One token for every row; only device tensors change (this is what the graph captures).
        limit: the cache slots attention reads (attend_limit; None: all): the mask is cut to it,
        and the mask's width is what rollout_attention reads."""
        allowed = s.key_valid[:, :limit] & (s.key_index[:limit] <= s.t)              # [B, limit or L]
        distance = s.t - s.key_index[:limit]                                          # [limit or L]
        with self.passes():
            logits = self.model(input_ids=s.tok, position_ids=s.pos,
                                attention_mask=layer_masks(self.plan, self.dtype, allowed.view(s.rows, 1, 1, -1),
                                                           distance),
                                past_key_values=s.cache, use_cache=True, logits_to_keep=1).logits[:, -1]
        s.t.add_(1)
        s.pos.add_(1)
        self._emit(s, logits, greedy)

    def _emit(self, s: Slot, logits: torch.Tensor, greedy: bool) -> None:
        """A fixed batch's next token (sample_step) written at the slot's output column."""
        nxt, lp, ended = self.sample(logits, s.inv_t, greedy, s.finished, self.fused)
        s.out.index_copy_(1, s.col, nxt.unsqueeze(1))
        s.out_lp.index_copy_(1, s.col, lp.unsqueeze(1))
        s.col.add_(1)
        s.finished.copy_(ended)
        s.tok.copy_(nxt.unsqueeze(1))

    def sample(self, logits: torch.Tensor, inv_t: torch.Tensor, greedy: bool, done: torch.Tensor, fused: bool
               ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """(token, log-prob, ended) per row of `logits` [n, V]: the fused kernel or sample_step."""
        if fused:
            return fused_sample_step(logits, inv_t, greedy, self.seed, done, self.pad_id, self.eos)
        return sample_step(logits, inv_t, greedy, self.gen, done, self.pad_id, self.eos)

    def _capture(self, s, greedy: bool, step=None, limit: int | None = None, compiled: bool | None = None):
        """Capture one decode step (capture_decode; `compiled`: whether `step` is torch.compile'd,
        default compile_decode); None (eager decoding) if capture fails."""
        try:
            return capture_decode(step or self._step, s, greedy, self.gen,
                                  self.compile_decode if compiled is None else compiled, limit)
        except CaptureFailed as exc:
            self.graph_failures += 1
            self.graph_failure_reasons.append(str(exc))
            log.warning("CUDA graph capture failed (%s); decoding eagerly for this shape", exc)
            if exc.stage == "capture":   # the generators may be stuck in capture mode
                reset_generators_after_failed_capture(self.gen)
            return None


def decode_layers(model, wanted: bool, device: torch.device) -> FusedLayers | None:
    """Liger's layers patched onto `model` for the engine's decode where grpo.model.liger's rule lets
    them run ('auto' for --liger-decode, 'off' without it); None: Hugging Face's."""
    return fuse(model, "auto" if wanted else "off", device.type == "cuda")[0]


_ENGINES: "weakref.WeakKeyDictionary[torch.nn.Module, RolloutEngine]" = weakref.WeakKeyDictionary()


def generate(model, prompts_token_ids: list[list[int]], max_new_tokens: int, temperature: float = 1.0,
             greedy: bool = False, eos_id: int | list[int] = 2, pad_id: int = 2,
             cuda_graphs: bool | None = None) -> tuple[list[list[int]], list[bool]]:
    """(generated ids per prompt, cut after the first EOS, and whether each ended with EOS).

    Greedy when `greedy` or temperature == 0; otherwise pure sampling at `temperature`
    (no top-k / top-p). Keeps one engine (caches, graphs) per model between calls.
    """
    engine = _ENGINES.get(model)
    if engine is None or engine.pad_id != pad_id or engine._eos_set != set(eos_list(eos_id)):
        engine = _ENGINES[model] = RolloutEngine(model, eos_id, pad_id, cuda_graphs=cuda_graphs)
    res = engine.generate(prompts_token_ids, max_new_tokens, temperature, greedy)
    return res.token_ids, res.finished
