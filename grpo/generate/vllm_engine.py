"""vLLM as a second rollout engine (--generation-backend vllm): VllmEngine gives the rollout path's
stream (grpo.generate.stream's interface) and the fixed batches a greedy evaluation decodes, with
vLLM's engine driven by the sampler process. vLLM is an optional extra (`pip install '.[vllm]'`): this
is the only module that imports it, inside VllmEngine.build, so nothing else needs it installed.

Two modes (--vllm-engine-process; off by default until a run with it is seen to end cleanly on a GPU:
docs/configuration.md). Its own process (VLLM_ENABLE_V1_MULTIPROCESSING=1, vLLM's default): the
engine core (scheduler, model, sampling) steps on its own while the sampler adds requests and reads
each step's outputs, so their host work overlaps (the faster mode: docs/benchmarks.md measures both).
In process (=0: vLLM 0.25's LLMEngine with an InprocClient, whose `step()` runs one scheduler step,
model forward and sampling, synchronously) the sampler steps it by hand, `add_request` per sample
and `step()` per decode step.
Asynchronous scheduling is off in both (async_scheduling=False: no batch is queued behind the one
that runs), so each step runs whole with one version of the weights.

New weights without draining: swap() is asked after every step (the stream's host check). It
writes the new version into the sampler's own policy (the weight receivers' work, unchanged), and
the engine then copies the policy's parameters into vLLM's model in place, between two of vLLM's
steps. The requests in flight go on from their KV blocks as they are (keys and values of the older
version, as in our engine's RingStream); their next tokens are drawn by the new weights.
- In process: vLLM's `load_weights` through `apply_model`, a closure over the policy's tensors. (A
  CUDA IPC handle cannot be opened in the process that made it: CUDA refuses with "invalid device
  context", seen on the H200, so this mode cannot share the path below.)
- Where vLLM's workers are processes of their own (its engine-core process, or over several GPUs,
  --vllm-tensor-parallel-size N > 1: vLLM's multiprocess executor, a worker per GPU): the engine
  sends the policy's parameters as CUDA IPC handles, plain values (grpo.generate.vllm_worker: a few
  hundred bytes a tensor, never the bytes), to a method of ours that vLLM mixes into its workers
  (EngineArgs(worker_extension_cls=...)), called by name through collective_rpc. Each worker maps
  the tensors once and keeps them (the receivers write every version into the same memory; later
  loads send names alone) and calls its model's load_weights, which takes its rank's shard of each.
  Over several GPUs the sampler's GPUs are visible devices 0..N-1 (the launcher's plan, with the
  learner's GPU after them), the policy on device 0. The engine-core process has run on a GPU; the
  several-GPU executor NOT YET (tested on CPU over stand-ins whose workers get the arguments through
  msgpack, as vLLM's engine-core client sends them: tests/fakevllm.py).

Which version drew each token: requests ask for DELTA outputs (each step returns only the tokens
that step drew). In process every token a step returns is tagged with the version in force during
that step (RowTrace). With the engine core apart, it may have run steps ahead of what the sampler
has read when a load reaches it, so the sampler reads the outputs itself (LLMEngine.step's own
three calls, vLLM 0.25) to keep each step's stamp (EngineCoreOutputs.timestamp, time.monotonic()
when that step's outputs were made); the load says when it ended on the same clock, so a step
stamped before it drew its tokens with the older version, one stamped after with the newer.
Log-probs: SamplingParams(logprobs=0) returns the sampled token's log-prob, and
logprobs_mode="processed_logprobs" makes it the log-prob under the distribution it was drawn from
(after the temperature; greedy: the plain softmax), as our engine's; flat_logprobs=True keeps them
in a few flat lists per request instead of a dict and a Logprob object per token.

The same prompt rule and ends as our engine: prompt token ids from our tokenizer (TokensPrompt),
stop_token_ids = our EOS ids with ignore_eos (so vLLM adds no end of its own), the EOS kept in the
completion; temperature, top_p=1, top_k=0 (vLLM 0.25: 0 or -1 is off), no penalties, and the
model's generation config ignored (generation_config="vllm").
"""
from __future__ import annotations

import itertools
import logging
import os
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Iterator

import numpy as np
import torch

from grpo.generate.backend import Rollout, eos_list
from grpo.generate.stream import STREAM_COUNTS, FinishedGroup, checked_swap, group_versions, samples_of
from grpo.generate.vllm_worker import EXTENSION, LOAD, handle_of
from grpo.model.load import compute_dtype
from grpo.rules.backend import VLLM_MISSING, vllm_installed
from grpo.rules.memory import PROMPT_TOKENS, shape_from_config, vllm_gpu_fraction, vllm_items

log = logging.getLogger(__name__)

VLLM = "vllm"


def check_vllm(device_type: str, index: int | None = 0, tensor_parallel: int = 1, visible: int | None = None) -> None:
    """The one-line refusals of --generation-backend vllm before anything loads (ValueError: the
    workers' exit code 2): vLLM not installed, a sampler without CUDA, or on another GPU than its
    first visible one (vLLM 0.25's in-process worker takes local rank 0, cuda:0, and makes it the
    current device: vllm/v1/executor/uniproc_executor.py, _distributed_args; the launcher gives each
    sampler its GPU as CUDA_VISIBLE_DEVICES and --gpu-id 0), or over more GPUs (`tensor_parallel`)
    than it sees (`visible`: vLLM's worker of rank i takes visible device i)."""
    if not vllm_installed():
        raise ValueError(VLLM_MISSING)
    if device_type != "cuda":
        raise ValueError(f"--generation-backend vllm needs a CUDA device (here it is {device_type}); "
                         "use fast, hf or auto")
    if index not in (None, 0):
        raise ValueError(f"--generation-backend vllm runs on the first visible GPU, not --gpu-id {index}: choose the "
                         f"GPU with CUDA_VISIBLE_DEVICES={index} and --gpu-id 0")
    if visible is not None and tensor_parallel > visible:
        raise ValueError(f"--vllm-tensor-parallel-size {tensor_parallel} needs {tensor_parallel} visible GPUs, and this "
                         f"sampler sees {visible}: list its GPUs first in CUDA_VISIBLE_DEVICES (run_distributed.py "
                         f"does), or lower --vllm-tensor-parallel-size")


# ----------------------------------------------------------------------------- pure helpers (no vLLM)
def sampled_logprobs(token_ids, logprobs) -> list[float]:
    """The sampled tokens' log-probs out of vLLM's per-token entries (CompletionOutput.logprobs with
    SamplingParams(logprobs=0)): either vLLM's FlatLogprobs (flat_logprobs=True, what the sampler asks
    for: per position i, entries start_indices[i]:end_indices[i] of its flat token_ids and logprobs,
    the sampled token's first), or per token a dict {token id: Logprob (its .logprob) or a float}
    that holds the sampled token's entry (and, with logprobs=k > 0, the top k)."""
    if logprobs is None:
        raise ValueError("vLLM returned no log-probs: the requests must ask for them (SamplingParams(logprobs=0))")
    if len(logprobs) != len(token_ids):
        raise ValueError(f"vLLM returned {len(logprobs)} log-prob entries for {len(token_ids)} tokens")
    starts = getattr(logprobs, "start_indices", None)
    if starts is not None:
        ids, values = logprobs.token_ids, logprobs.logprobs
        out = []
        for tok, s, e in zip(token_ids, starts, logprobs.end_indices):
            if e <= s or int(ids[s]) != int(tok):
                raise ValueError(f"vLLM's flat log-probs do not start with the sampled token {int(tok)} at a position")
            out.append(float(values[s]))
        return out
    out = []
    for tok, entry in zip(token_ids, logprobs):
        value = entry[int(tok)]
        out.append(float(getattr(value, "logprob", value)))
    return out


@dataclass
class RowTrace:
    """One sample's tokens as its request's DELTA outputs bring them: ids, log-probs, and the weights
    version that drew each (the version in force during the step that returned it)."""
    ids: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    versions: list[int] = field(default_factory=list)
    finished: bool | None = None   # None while in flight; True: ended with an EOS id; False: at max_new_tokens

    def extend(self, ids, logprobs: list[float], version: int) -> None:
        ids = [int(t) for t in ids]
        if len(logprobs) != len(ids):
            raise ValueError(f"{len(ids)} tokens with {len(logprobs)} log-probs")
        self.ids += ids
        self.logprobs += logprobs
        self.versions += [int(version)] * len(ids)


def ended_with_eos(finish_reason: str | None) -> bool:
    """A finished request's `finish_reason` as our `finished`: 'stop' (a stop token id: our EOS ids)
    is True; 'length' (max_tokens) is False; anything else (an abort) is an error here."""
    if finish_reason == "stop":
        return True
    if finish_reason == "length":
        return False
    raise RuntimeError(f"vLLM ended a request with finish_reason {finish_reason!r}; expected 'stop' or 'length'")


def group_of(key, rows: list[RowTrace], decode_steps: int, default_version: int,
             last_in_check: bool = True) -> FinishedGroup:
    """A group whose rows all ended, as the FinishedGroup every stream yields: per row its ids (EOS
    kept), whether it ended with EOS, its log-probs (float32) and versions (int32), and the oldest
    and newest version over its tokens (`default_version` for a group without tokens)."""
    if any(r.finished is None for r in rows):
        raise ValueError("group_of: a row is still in flight")
    versions = [np.asarray(r.versions, dtype=np.int32) for r in rows]
    return FinishedGroup(key, [list(r.ids) for r in rows], [bool(r.finished) for r in rows],
                         [np.asarray(r.logprobs, dtype=np.float32) for r in rows], decode_steps, versions,
                         *group_versions(versions, default_version), last_in_check=last_in_check)


def sampling_fields(temperature: float, greedy: bool, max_new_tokens: int, eos: list[int]) -> dict:
    """SamplingParams' fields for one sample: the same distribution and ends as our engine's (the
    module's docstring); temperature 0 is vLLM's greedy."""
    if max_new_tokens < 1:
        raise ValueError(f"max_new_tokens must be at least 1, got {max_new_tokens}")
    greedy = greedy or temperature == 0
    return dict(n=1, temperature=0.0 if greedy else float(temperature), top_p=1.0, top_k=0, min_p=0.0,
                presence_penalty=0.0, frequency_penalty=0.0, repetition_penalty=1.0,
                max_tokens=int(max_new_tokens), min_tokens=0, stop_token_ids=eos_list(eos), ignore_eos=True,
                logprobs=0, flat_logprobs=True, detokenize=False, skip_special_tokens=False)


def engine_fields(model: str, dtype: str, gpu_memory_utilization: float, seed: int, rows: int = 0,
                  tensor_parallel: int = 1, cuda_graphs: bool = True, max_model_len: int | None = None,
                  engine_process: bool = False) -> dict:
    """EngineArgs' fields for a sampler's engine: its engine core in the sampler's process or
    (`engine_process`) in one of its own (the caller sets VLLM_ENABLE_V1_MULTIPROCESSING), over
    several GPUs vLLM's workers in processes of their own, and wherever a worker is not in this
    process our weights loader mixed into it (grpo.generate.vllm_worker); synchronous steps,
    processed log-probs, the model's generation config ignored, no tokenizer (prompts come as our
    token ids, and nothing is detokenized), its memory share from the plan
    (grpo.rules.memory.vllm_gpu_fraction), at least `rows` sequences at once (0: vLLM's own cap)."""
    if not 0 < gpu_memory_utilization <= 1:
        raise ValueError(f"vLLM's gpu_memory_utilization must be in (0, 1], got {gpu_memory_utilization}")
    out = dict(model=model, skip_tokenizer_init=True, dtype=dtype, seed=int(seed),
               gpu_memory_utilization=float(gpu_memory_utilization),
               tensor_parallel_size=int(tensor_parallel), enforce_eager=not cuda_graphs,
               logprobs_mode="processed_logprobs", async_scheduling=False, stream_interval=1,
               generation_config="vllm", enable_prefix_caching=True, disable_log_stats=True)
    if tensor_parallel > 1:
        out["distributed_executor_backend"] = "mp"   # a worker process per GPU
    if tensor_parallel > 1 or engine_process:
        out["worker_extension_cls"] = EXTENSION
    if rows:
        out["max_num_seqs"] = int(rows)
    if max_model_len:
        out["max_model_len"] = int(max_model_len)
    if not holds_weights(model):
        # a folder of config and tokenizer only (random:qwen2.5-*: weights drawn at load): vLLM draws
        # its own, which the first stream overwrites with the policy's (sync_weights), so both engines
        # decode the same weights
        out["load_format"] = "dummy"
    return out


def holds_weights(model: str) -> bool:
    """Whether vLLM can load `model`'s weights: a hub id (not a folder here), or a folder with
    safetensors or PyTorch weight files."""
    folder = Path(model)
    if not folder.is_dir():
        return True
    return any(any(folder.glob(pattern)) for pattern in ("*.safetensors", "*.bin", "*.pt"))


def plan_share(policy, device: torch.device, rows: int, max_new_tokens: int, tensor_parallel: int = 1,
               remedy: str = "give it with --vllm-gpu-memory-utilization") -> tuple[float, list[tuple[str, int]]]:
    """vLLM's gpu_memory_utilization from the memory plan's rule, and the items it counts
    (grpo.rules.memory.vllm_items: its weights, the KV cache of `rows` sequences of the plan's prompt
    and `max_new_tokens`, its workspace) over this GPU's memory (vllm_gpu_fraction); over several
    GPUs (visible devices 0..tensor_parallel-1, vLLM's workers' ranks) each GPU's share, of the
    smallest: vLLM gives every worker the same fraction. A config without the shape's keys is a
    ValueError naming the key and the caller's `remedy` (the sampler's flag; the evaluate command has none)."""
    try:
        shape = shape_from_config(policy.config.to_dict())
    except (KeyError, TypeError, ValueError) as exc:
        raise ValueError(f"vLLM's memory share: the model's config has no {exc} to plan by; {remedy}") from None
    items = vllm_items(shape, rows, PROMPT_TOKENS + max_new_tokens,
                       torch.finfo(compute_dtype(device)).bits // 8, tensor_parallel)
    total = min(torch.cuda.get_device_properties(i).total_memory for i in range(tensor_parallel)) \
        if tensor_parallel > 1 else torch.cuda.get_device_properties(device).total_memory
    return vllm_gpu_fraction(items, total), items


# ----------------------------------------------------------------------------- the engine
@dataclass
class _Prompt:
    """One prompt of a stream: its samples' traces (G, or the n its source asked for), how many are still in flight, and the step count
    when its requests were added."""
    key: object
    rows: list[RowTrace]
    left: int
    since: int


class VllmEngine:
    """vLLM's engine behind our rollout interface (the module's docstring): `stream` (the Stream
    protocol), `generate` (a fixed batch, as a Rollout: what a greedy evaluation decodes with).

    `llm` is vLLM's LLMEngine, or anything with its add_request / step / abort_request (the CPU tests
    give a scripted one); `make_params(**sampling_fields)` makes SamplingParams; `policy` is the
    sampler's own model, whose parameters the weight receivers write: `sync_weights` copies them into
    vLLM's model (load_weights(name, tensor) through `llm.apply_model`; where vLLM's workers are
    processes of their own, over `tensor_parallel` > 1 GPUs or with `engine_process`, from CUDA IPC
    handles made by `share` (vllm_worker.handle_of) through collective_rpc). `version_of()` says the
    policy's version now (the weights client's), so that a stream or a batch started after the
    policy moved on first takes its weights."""

    decoder = VLLM
    buckets: tuple = ()   # no fixed batch shapes (grpo.rules.staleness.bucket_prompts)

    def __init__(self, llm, make_params: Callable[..., object], eos: list[int], policy: torch.nn.Module | None = None,
                 version_of: Callable[[], int] | None = None, tensor_parallel: int = 1, engine_process: bool = False,
                 share: Callable[[torch.Tensor], list] = handle_of):
        self.llm, self.make_params, self.eos, self.policy = llm, make_params, eos_list(eos), policy
        self.version_of = version_of
        self.tensor_parallel = int(tensor_parallel)
        self.engine_process = bool(engine_process)   # vLLM's engine core in a process of its own (_step)
        self.remote = self.tensor_parallel > 1 or self.engine_process   # its workers outside this process
        self.share = share
        self.loaded: int | None = None     # the policy version vLLM's model holds (None: not copied yet)
        # engine_process: (when a load ended, the version it loaded), oldest first, the newest kept (_version_at)
        self.stamps: list[tuple[float, int]] = []
        # remote workers: per parameter where its memory was when its handle was sent (sync_weights)
        self.sent: dict[str, tuple] = {}
        self.closed = False   # close(): vLLM's processes apart stopped
        self.stream_counts = dict.fromkeys(STREAM_COUNTS, 0.0)
        self._ids = itertools.count()

    # ------------------------------------------------------------------ building it (the only vLLM import)
    @classmethod
    def build(cls, model_path: str, policy: torch.nn.Module, eos: list[int], dtype: torch.dtype,
              gpu_memory_utilization: float, seed: int, rows: int = 0, tensor_parallel: int = 1,
              cuda_graphs: bool = True, max_model_len: int | None = None,
              engine_process: bool = False) -> "VllmEngine":
        """vLLM's LLMEngine on `model_path`, its engine core in this process or (`engine_process`) in
        one of its own, its weights then those of `policy` (at the first stream); over
        `tensor_parallel` GPUs (visible devices 0..N-1) with a worker process on each (the module's
        docstring: not yet run on GPUs)."""
        if not vllm_installed():
            raise ValueError(VLLM_MISSING)
        os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "1" if engine_process else "0"   # before vLLM reads its settings
        if tensor_parallel > 1 or engine_process:
            # CUDA is initialised here already (the policy is loaded): a forked process could not use it,
            # so vLLM's processes start fresh (vLLM would switch to spawn itself, with a warning)
            os.environ.setdefault("VLLM_WORKER_MULTIPROC_METHOD", "spawn")
        from vllm import EngineArgs, LLMEngine, SamplingParams  # here: vLLM is an optional extra, and reads its settings (above) at import
        from vllm import envs as vllm_envs  # here: as vllm
        from vllm.sampling_params import RequestOutputKind  # here: as vllm
        from vllm.v1.engine.core_client import InprocClient  # here: as vllm

        # An engine built before in this process froze vLLM's settings (its engine core caches them);
        # this one's mode is read afresh.
        vllm_envs.disable_envs_cache()

        name = str(dtype).removeprefix("torch.")
        args = EngineArgs(**engine_fields(model_path, name, gpu_memory_utilization, seed, rows, tensor_parallel,
                                          cuda_graphs, max_model_len, engine_process))
        t0 = time.perf_counter()
        llm = LLMEngine.from_engine_args(args, enable_multiprocessing=engine_process)
        if isinstance(llm.engine_core, InprocClient) == engine_process:
            raise RuntimeError(f"vLLM built its engine core {'in this process' if engine_process else 'in a process of its own'}, "
                               f"asked for {'its own' if engine_process else 'this one'} (VLLM_ENABLE_V1_MULTIPROCESSING="
                               f"{os.environ['VLLM_ENABLE_V1_MULTIPROCESSING']})")
        log.info("vLLM engine on %s in %.1f s (gpu_memory_utilization %.2f, %s, %s%s%s)", model_path,
                 time.perf_counter() - t0, gpu_memory_utilization, name,
                 "CUDA graphs" if cuda_graphs else "eager",
                 f", tensor parallel over {tensor_parallel} GPUs" if tensor_parallel > 1 else "",
                 ", its engine core in a process of its own" if engine_process else "")

        def make_params(**fields):
            return SamplingParams(**fields, output_kind=RequestOutputKind.DELTA)

        return cls(llm, make_params, eos, policy, tensor_parallel=tensor_parallel, engine_process=engine_process)

    def close(self) -> None:
        """Stop vLLM's own processes (its engine core, its workers) now, while this process is whole.
        Left to the interpreter's exit (vLLM's finalizer), their shutdown ran while this process was
        being torn down, and a sampler whose engine core ran apart died of SIGSEGV after its last
        group (docs/benchmarks.md). In process there is nothing of vLLM's apart to stop."""
        if self.remote and not self.closed:
            self.closed = True
            self.llm.engine_core.shutdown()

    # ------------------------------------------------------------------ weights
    def sync_weights(self, version: int | None = None) -> bool:
        """Copy the policy's parameters into vLLM's model when it holds another version than
        `version` (None: the policy's now, version_of(); copied whenever that is unknown); True if
        it copied. Between two steps only: vLLM's load_weights writes each tensor into its
        parameter in place (the captured CUDA graphs keep reading the same memory)."""
        if version is None and self.version_of is not None:
            version = self.version_of()
        if self.policy is None or (version is not None and version == self.loaded):
            return False
        weights = [(name, p.detach()) for name, p in self.policy.named_parameters()]
        if self.remote:
            # vLLM's workers are processes of their own: each gets the tensors' IPC handles as plain
            # values, for our loader's method (vllm_worker.WeightLoader), and keeps them mapped; the
            # workers read the policy's memory only inside this call (the receivers write a version
            # between two of our checks, never during one)
            names = [name for name, _ in weights]
            if weights and weights[0][1].is_cuda:
                # Sync point: the receivers' writes are queued on this process's streams, and the workers
                # read the memory from theirs, which no stream order covers (torch's IPC event is waited
                # on only where a worker maps a handle afresh, not where it finds it mapped already).
                torch.cuda.synchronize(weights[0][1].device)
            # a handle only for a tensor the workers have not mapped where it is now: the receivers write
            # each version into the same memory, so after the first load the call carries names alone
            where = {name: (t.data_ptr(), tuple(t.shape), t.stride(), str(t.dtype)) for name, t in weights}
            handles = [None if self.sent.get(name) == where[name] else self.share(t) for name, t in weights]
            done = self.llm.collective_rpc(LOAD, args=(names, handles))
            if len(done) != self.tensor_parallel or any(n != len(weights) for n, _ in done):
                raise RuntimeError(f"vLLM's {self.tensor_parallel} workers loaded {[n for n, _ in done]} of "
                                   f"{len(weights)} tensors")
            self.sent = where
            if self.engine_process and version is not None:
                self.stamps.append((max(t for _, t in done), version))
        else:
            self.llm.apply_model(lambda model: model.load_weights(weights))
        if self.llm.get_num_unfinished_requests() == 0:
            # Prompts of later requests must not reuse blocks the old weights computed (between streams,
            # nothing is running; in flight this is not done: the rows keep their KV as it is).
            self.llm.reset_prefix_cache()
        self.loaded = version
        return True

    # ------------------------------------------------------------------ the stream
    def stream(self, next_prompt: Callable[[], tuple[object, list[int]] | None], group_size: int,
               max_new_tokens: int, temperature: float = 1.0, greedy: bool = False, rows: int | None = None,
               should_stop: Callable[[], bool] | None = None, swap: Callable[[], int | None] | None = None,
               version: int = 0, min_width: int = 0) -> Iterator[FinishedGroup]:
        """As RingStream.stream, on vLLM: next_prompt() is asked while fewer than `rows` samples are in
        flight (rows 0 or None: every prompt it gives before it says None, a fixed round) and each
        prompt becomes `group_size` requests (n with (key, ids, n): samples_of); each step()'s new
        tokens are tagged with the version in force; after each step should_stop() is asked (True: the
        requests in flight are aborted, the stream ends, nothing more is yielded), then swap() (a new
        version: copied into vLLM's model before the next step), then the groups whose rows all ended
        that step are yielded. The stream ends when nothing is in flight and the source says None.
        min_width: no meaning here."""
        G = int(group_size)
        if G < 1 or max_new_tokens < 1:
            raise ValueError(f"stream needs group_size >= 1 and max_new_tokens >= 1, got {G} and {max_new_tokens}")
        version = int(version)
        self.sync_weights(version)
        params = self.make_params(**sampling_fields(temperature, greedy, max_new_tokens, self.eos))
        cap = int(rows or 0)
        live: dict[str, tuple[_Prompt, int]] = {}   # request id -> (its prompt, sample index)
        steps, counts = 0, self.stream_counts
        while True:
            t_add = time.perf_counter()
            while not cap or not live or len(live) + G <= cap:
                item = next_prompt()
                if item is None:
                    break
                if not item[1]:
                    raise ValueError("stream: an empty prompt")
                n = samples_of(item, G)
                rec = _Prompt(item[0], [RowTrace() for _ in range(n)], n, steps)
                prompt = {"prompt_token_ids": [int(t) for t in item[1]]}
                for j in range(n):
                    rid = f"s{next(self._ids)}"
                    self.llm.add_request(rid, prompt, params)
                    live[rid] = (rec, j)
                counts["prompts"] += 1
            counts["refill_s"] += time.perf_counter() - t_add
            if not live:
                return
            t_step = time.perf_counter()
            outputs, drawn = self._step(version)
            counts["decode_s"] += time.perf_counter() - t_step
            steps += 1
            counts["steps"] += 1
            counts["row_steps"] += max(cap, len(live))
            counts["busy_row_steps"] += len(live)
            t_check = time.perf_counter()
            ended = self._take_outputs(outputs, live, drawn, steps)
            if should_stop is not None and should_stop():
                if live:
                    self.llm.abort_request(list(live))
                return
            t_swap = time.perf_counter()
            if swap is not None and (new := checked_swap(swap, version)) is not None:
                self.sync_weights(new)   # (between two of vLLM's steps: in process nothing of it runs now)
                version = new
                counts["swaps"] += 1
                counts["swap_s"] += time.perf_counter() - t_swap
            counts["check_s"] += time.perf_counter() - t_check
            for n, group in enumerate(ended):
                group.last_in_check = n == len(ended) - 1
                yield group

    def _step(self, version: int) -> tuple[list, int]:
        """One step's outputs and the version that drew their tokens: `version`, the one in force,
        with the engine core in this process; with it in its own, the version loaded last before the
        step's stamp (the module's docstring), as LLMEngine.step reads a step but keeping its stamp."""
        if not self.engine_process:
            return self.llm.step(), version
        core = self.llm.engine_core.get_output()   # blocks until the engine core's next step has ended
        done = self.llm.output_processor.process_outputs(core.outputs, engine_core_timestamp=core.timestamp,
                                                         iteration_stats=None)
        self.llm.engine_core.abort_requests(done.reqs_to_abort)
        return done.request_outputs, self._version_at(core.timestamp, version)

    def _version_at(self, stamp: float, version: int) -> int:
        """The version vLLM's model held when a step stamped `stamp` ran: the last load that ended
        before it (`version` where none is known); loads older than that one are forgotten, since
        the engine's steps come in order."""
        at = None
        for i, (t, v) in enumerate(self.stamps):
            if t <= stamp:
                at = i
        if at is None:
            return version
        del self.stamps[:at]
        return self.stamps[0][1]

    def _take_outputs(self, outputs, live: dict, version: int, steps: int) -> list[FinishedGroup]:
        """One step's DELTA outputs into the rows' traces, every new token tagged with `version`; the
        groups whose rows have all ended (their requests leave `live`)."""
        ended = []
        for out in outputs:
            if out.request_id not in live:
                continue   # (a request this stream did not add: none, with one stream at a time)
            rec, j = live[out.request_id]
            completion = out.outputs[0]
            row = rec.rows[j]
            if completion.token_ids:   # (a delta without tokens: vLLM's logprobs[-0:] would be all of them)
                row.extend(completion.token_ids, sampled_logprobs(completion.token_ids, completion.logprobs), version)
            if out.finished:
                del live[out.request_id]
                row.finished = ended_with_eos(completion.finish_reason)
                rec.left -= 1
                if rec.left == 0:
                    ended.append(group_of(rec.key, rec.rows, steps - rec.since, version, last_in_check=False))
        return ended

    # ------------------------------------------------------------------ a fixed batch
    def generate(self, prompts: list[list[int]], max_new_tokens: int, temperature: float = 1.0, greedy: bool = False,
                 should_stop: Callable[[], bool] | None = None) -> Rollout:
        """Every prompt once, as one batch (what a greedy evaluation decodes: greedy=True), as a
        Rollout in the prompts' order, with the sampled log-probs; stats["stopped"] when should_stop
        cut it short (the rows then come back empty)."""
        t0 = time.perf_counter()
        stopped = [False]

        def stop() -> bool:
            stopped[0] = stopped[0] or bool(should_stop())
            return stopped[0]

        source = iter(enumerate(prompts))
        got: dict[int, FinishedGroup] = {}
        steps0 = self.stream_counts["steps"]
        for g in self.stream(lambda: next(source, None), 1, max_new_tokens, temperature, greedy,
                             should_stop=stop if should_stop is not None else None,
                             version=self.version_of() if self.version_of is not None else 0):
            got[g.key] = g
        empty = np.zeros(0, np.float32)
        rows = [got.get(i) for i in range(len(prompts))]
        ids = [g.token_ids[0] if g else [] for g in rows]
        stats = {"gen_s": time.perf_counter() - t0, "decode_steps": int(self.stream_counts["steps"] - steps0),
                 "stopped": stopped[0], "tokens": sum(len(r) for r in ids), "cuda_graphs": None}
        return Rollout(ids, [bool(g.finished[0]) if g else False for g in rows],
                       [g.logprobs[0] if g else empty for g in rows], stats)
