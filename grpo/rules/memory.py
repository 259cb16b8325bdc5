"""The memory plan: before anything loads, each process's GPU memory, estimated from the model's
shape and the run's flags; a plan that will not fit is refused with one line naming the biggest item
and the flag that shrinks it. Pure functions, no I/O: reading the shape (config.json, a GGUF header)
and the GPUs' memory is grpo.launch.probe's.

Every number is an estimate, stated where it is made. Exact (up to allocator rounding): weights,
the ZeRO-2 optimizer state and gradients, the IPC publication slots, the KV cache for a stated
prompt length. Rough rules: activations, the log-prob pass, the CUDA context, the prompt length.
"""
from __future__ import annotations

from dataclasses import dataclass, replace

from grpo.config import ROW_BUCKETS, LossSection, SamplerRollout, TrainingSection
from grpo.rules.staleness import Staleness, bucket_prompts

GiB = 1 << 30
CUDA_CONTEXT = GiB // 2            # a CUDA context plus cuBLAS/NCCL workspaces: ~0.5 GiB, a stated constant
ACTIVATION_K = 77                  # bytes per (layer x token x hidden) kept for backward, see activations()
PROMPT_TOKENS = 512                # prompt length assumed for the KV cache and activations (no flag bounds
                                   # the sampler's prompts; GSM8K with a chat template is ~100-300 tokens),
                                   # capped by --max-prompt-tokens
CHUNK_ELEMS = 1 << 27              # grpo.model.logprobs.DEFAULT_CHUNK_ELEMS: logits elements per LM-head chunk
# The caching allocator's reserve: what the driver sees a process hold beyond the items counted
# here and the CUDA context (freed blocks kept for reuse, split blocks that fit no later request,
# transient buffers), as a share of the process's other items (the context left out); keyed by
# whether expandable segments are on (the workers' default). ROUGH RULES, fitted on the scale
# rows (bench/scale.py; docs/benchmarks.md, "Run-wide peaks and the memory plan", says which rows
# and how far each share ranged): each factor puts the rows it was fitted on within 15% of the
# driver's peak. Full fine-tuning holds far more unused reserve than LoRA; a sampler's reserve is
# a share of its KV cache and log-prob pass, smaller over shared weights.
RESERVE = {True: {"learner_full": 0.25, "learner_lora": 0.05, "sampler": 0.7, "sampler_shared": 0.3},
           False: {"learner_full": 0.45, "learner_lora": 0.29, "sampler": 1.5, "sampler_shared": 1.0}}
# What shrinks each item: the one-line refusal names it.
SHRINK = {
    "weights": "a smaller --model",
    "optimizer state": "more --training-gpus (ZeRO-2 splits it over the ranks) or --lora-r 16",
    "gradients": "more --training-gpus (ZeRO-2 splits them over the ranks) or --lora-r 16",
    "activations": "a smaller --micro-batch-tokens, or train_micro_batch_size_per_gpu in --deepspeed-config (or --train-batch-size) "
                   "or --max-new-tokens",
    "logits chunk": "a smaller --model (the LM head's chunk is fixed at 2^27 logits)",
    "ipc publication": "--weight-sync nccl or tcp",
    "reference model": "--beta 0",
    "KV cache": "--max-prompts-per-round / --prompts-per-round (or --in-flight-rows), --max-staleness or --max-new-tokens",
    "log-prob pass": "--logprob-batch-size",
    "CUDA context": "nothing (a fixed cost): put fewer processes on this GPU",
    "weight staging": "--weight-sync tcp (the sampler then receives each version straight into its weights)",
    "allocator reserve": "what shrinks the learner's other items, or the sampler's KV cache",
    "vLLM weights": "a smaller --model, or a larger --vllm-tensor-parallel-size (each of a sampler's GPUs holds a share)",
    "vLLM workspace": "nothing (vLLM's activations and graphs): put fewer processes on this GPU",
    "autocast copies": "--precision bf16 (bf16 weights: nothing to cast, and half the weights' bytes)",
}
# Items that are fitted estimates rather than counted bytes: the caching allocator's reserve, fitted
# on the rows named at RESERVE. A plan over the GPU only because of them starts with a warning; one
# whose counted bytes are over is refused.
ESTIMATED = frozenset({"allocator reserve"})


@dataclass(frozen=True)
class Shape:
    params: int
    layers: int
    hidden: int
    kv_dim: int          # KV heads x head dim
    q_dim: int           # attention heads x head dim
    intermediate: int
    vocab: int
    heads: int = 0       # attention heads (0: not known), which vLLM's tensor parallelism splits evenly
    kv_heads: int = 0    # KV heads (0: not known)


def shape_from_config(c: dict) -> Shape:
    """Shape numbers of a Hugging Face decoder config (llama/qwen2/mistral keys). The parameter
    count is summed from the shapes: embeddings (twice if untied), per layer q/k/v/o (+ biases
    where attention_bias or model_type qwen2), gate/up/down, two norms; the final norm."""
    h, layers, v = int(c["hidden_size"]), int(c["num_hidden_layers"]), int(c["vocab_size"])
    heads = int(c.get("num_attention_heads", 1))
    hd = int(c.get("head_dim") or h // heads)
    kv_heads = int(c.get("num_key_value_heads") or heads)
    kv = kv_heads * hd
    q = heads * hd
    inter = int(c.get("intermediate_size", 4 * h))
    bias = (q + 2 * kv) if (c.get("attention_bias") or c.get("model_type") == "qwen2") else 0
    per_layer = h * q + 2 * h * kv + q * h + bias + 3 * h * inter + 2 * h
    embed = v * h * (1 if c.get("tie_word_embeddings", False) else 2)
    return Shape(embed + layers * per_layer + h, layers, h, kv, q, inter, v, heads, kv_heads)


def lora_params(s: Shape, r: int) -> int:
    """Adapter parameters for 'all-linear' targets: r x (in + out) for each of q, k, v, o, gate, up, down."""
    pairs = [(s.hidden, s.q_dim), (s.hidden, s.kv_dim), (s.hidden, s.kv_dim), (s.q_dim, s.hidden),
             (s.hidden, s.intermediate), (s.hidden, s.intermediate), (s.intermediate, s.hidden)]
    return s.layers * sum(r * (a + b) for a, b in pairs)


def kv_cache(s: Shape, rows: int, seq: int, dtype_bytes: int = 2) -> int:
    """K and V for every layer, row and position: 2 x layers x rows x seq x kv_heads x head_dim x bytes."""
    return 2 * s.layers * rows * seq * s.kv_dim * dtype_bytes


def activations(s: Shape, micro_batch: int, seq: int) -> int:
    """A ROUGH RULE: layers x micro_batch x seq x hidden x k bytes, the activations autograd keeps
    for backward without recomputation. k = 77, measured on the learner micro-batch sweep
    (Qwen2.5-3B shapes, bf16 autocast, no gradient checkpointing: the growth of the peak between
    two micro-batch sizes over tokens x layers x hidden; docs/benchmarks.md has the figures). The
    textbook value, 34 (Korthikanti et al. 2022, "Reducing Activation Recomputation in Large
    Transformer Models": 34sbh + 5as^2b per layer, fp16, a 4h MLP), is lower: SwiGLU's 5.4h MLP
    and the float32 norms under autocast keep more. Models of other proportions will differ."""
    return s.layers * micro_batch * seq * s.hidden * ACTIVATION_K


def logprob_pass(s: Shape, batch: int, seq: int, chunk_elems: int = CHUNK_ELEMS) -> int:
    """The sampler's no-grad teacher-forced pass (grpo.model.logprobs.chunked_token_logprobs): the decoder
    holds a layer's input and output hidden states and its MLP's gate and up outputs in bf16
    (batch x seq x (2 hidden + 2 intermediate) x 2 bytes; rough), and the LM head runs in chunks
    of chunk_elems logits, float32, with log_softmax's output beside them (2 x chunk x 4 bytes),
    never batch x seq x vocab. The chunk is at most the rows' whole logits."""
    chunk = min(chunk_elems, batch * seq * s.vocab)
    return batch * seq * (2 * s.hidden + 2 * s.intermediate) * 2 + 2 * chunk * 4


@dataclass(frozen=True)
class RunShape:
    """What the plan needs from the run's flags (see plan_from_configs)."""
    ranks: int = 1
    lora_r: int = TrainingSection.lora_r
    beta: float = LossSection.beta
    ipc: bool = True           # --weight-sync resolves to ipc (the publication slots live on learner rank 0)
    shared: bool = False       # --weight-sync shared: the sampler runs on the learner's weights
    staging: bool = True       # ipc or nccl: the sampler stages each version in a second copy (grpo.weights.receiver)
    rows: int = 512            # sequences decoded at once by a sampler
    prompt_tokens: int = PROMPT_TOKENS
    new_tokens: int = SamplerRollout.max_new_tokens
    micro_batch: int = 16
    micro_tokens: int = 0      # the learner's budget of padded tokens per micro-batch (micro_token_budget; 0: fixed rows)
    logprob_batch_size: int = SamplerRollout.logprob_batch_size
    samplers: int = 1
    dtype_bytes: int = 2       # bf16 on CUDA: the sampler's weights, KV cache, publications
    precision: str = "bf16"    # the learner's (grpo.config.resolve_precision): "bf16", "autocast" or "fp32"
    deepspeed: bool = True     # False: --no-deepspeed, plain AdamW (no fp32 clone of the weights)
    entropy: bool = False      # --entropy-coef > 0: the learner's LM-head chunk also takes the softmax
    expandable: bool = True    # the allocator grows segments in place (allocator_conf): a smaller reserve
    vllm: bool = False         # --generation-backend vllm: the sampler also holds vLLM's engine (vllm_items)
    tensor_parallel: int = 1   # GPUs one vLLM sampler spreads over: its weights and KV cache split over them
    vllm_process: bool = False  # --vllm-engine-process (with vllm): on one GPU too, vLLM's engine and worker in a process of their own


def plan(s: Shape, r: RunShape) -> dict[str, list[tuple[str, int]]]:
    """{process name (as the launcher's: learner0.., sampler0..): [(item, bytes), ...]}.

    Learner, DeepSpeed ZeRO-2 with bf16 mixed precision and Adam (Rajbhandari et al. 2020, "ZeRO:
    Memory Optimizations Toward Training Trillion Parameter Models", sec. 3.1 and 5.1: 2 bytes of
    fp16/bf16 parameters + 2 bytes of gradients + K = 12 bytes of fp32 optimizer state (master
    copy, momentum, variance) per parameter, 16 in all; stage 2 partitions the gradients and the
    12 over the N_d data-parallel ranks: 2 + (2 + 12) / N_d). Only the trained parameters (all, or
    LoRA's adapters) have gradients and state.
    With --precision autocast the weights and gradients are float32 (4 + 4 / N_d bytes), ZeRO's
    optimizer state is still 12 / N_d (it clones the fp32 partition as its master copy), and
    autocast holds a bf16 copy of the weights through each micro-batch's forward and backward (2
    bytes). --precision fp32 holds the same float32 weights, gradients and state without
    autocast's copies. --no-deepspeed (one rank, plain AdamW, always autocast on CUDA) keeps no
    master clone: 8 bytes of state.
    """
    seq = r.prompt_tokens + r.new_tokens
    trained = lora_params(s, r.lora_r) if r.lora_r else s.params
    wide = r.precision in ("autocast", "fp32")   # float32 weights and gradients
    w_bytes = 4 if wide else r.dtype_bytes
    weights = (s.params + (trained if r.lora_r else 0)) * w_bytes
    state = 12 if r.deepspeed else 8
    out: dict[str, list[tuple[str, int]]] = {}
    for k in range(r.ranks):
        items = [("weights", weights),
                 ("optimizer state", state * trained // r.ranks),
                 ("gradients", w_bytes * trained // r.ranks)]
        if r.precision == "autocast":
            items.append(("autocast copies", 2 * s.params))
        # A micro-batch's tokens: under a token budget (the default), at most the budget, padded slots
        # or, padding-free, real tokens, which are what its activations hold; or one row alone where a
        # row is longer (grpo.learner.batch.token_buckets, real_token_buckets); with fixed micro-batches
        # (--micro-batch-tokens -1), its rows at the assumed length.
        tokens = max(r.micro_tokens, seq) if r.micro_tokens else r.micro_batch * seq
        items += [("activations", activations(s, 1, tokens)),
                 # the learner's LM head, checkpointed per chunk: the logits and their gradient in float32;
                 # with --entropy-coef also the softmax and its product with the logits (twice the tensors)
                 ("logits chunk", (4 if r.entropy else 2) * min(CHUNK_ELEMS, tokens * s.vocab) * 4)]
        if k == 0 and r.ipc:
            # two slots of the (LoRA: merged) full weights in the sampler dtype, published over CUDA IPC
            items.append(("ipc publication", 2 * s.params * r.dtype_bytes))
        reserve = RESERVE[r.expandable]["learner_lora" if r.lora_r else "learner_full"]
        items += [("allocator reserve", int(reserve * sum(b for _, b in items))), ("CUDA context", CUDA_CONTEXT)]
        out[f"learner{k}"] = items
    for k in range(r.samplers):
        out.update(_sampler_plan(s, r, seq, k))
    return out


def _sampler_plan(s: Shape, r: RunShape, seq: int, k: int) -> dict[str, list[tuple[str, int]]]:
    """Sampler k's processes (plan's): the sampler's own, and over several GPUs vLLM's workers'."""
    # Over shared weights too: the sampler loads its own copy, generates round 0 with it while the
    # learner starts, and drops it once it maps the learner's storages (grpo.weights.shared), so
    # its peak holds it (measured: the allocated peak exceeded the other items by about the
    # weights' bytes at 0.5B, 1.5B and 3B: 0.75, 2.72, 5.76 GiB against 0.92, 2.88, 5.75).
    items = [("weights", s.params * r.dtype_bytes)]
    if r.beta > 0:
        items.append(("reference model", s.params * r.dtype_bytes))
    if r.staging and not r.shared:
        # a whole version lands here first and is copied over the live weights once complete
        items.append(("weight staging", s.params * r.dtype_bytes))
    kv = kv_cache(s, r.rows, seq, r.dtype_bytes)
    lp = logprob_pass(s, min(r.logprob_batch_size, r.rows), seq)
    if r.vllm:
        # vLLM's engine beside the weights the receiver writes: its own copy and its paged KV cache
        # (vllm_items); its reserve is inside its own budget, not torch's. On one GPU vLLM's worker
        # runs in the sampler's process, unless its engine core has a process of its own; over
        # several GPUs, or in that process, each GPU's share is a worker process of its own
        # (tp_worker_items), and the sampler keeps only its own items on its first GPU.
        if not apart(r):
            items += vllm_items(s, r.rows, seq, r.dtype_bytes)
        items += [("log-prob pass", lp), ("allocator reserve", int(RESERVE[r.expandable]["sampler"] * lp)),
                  ("CUDA context", CUDA_CONTEXT)]
    else:
        items += [("KV cache", kv), ("log-prob pass", lp),
                  ("allocator reserve", int(RESERVE[r.expandable]["sampler_shared" if r.shared else "sampler"]
                                            * (kv + lp))),
                  ("CUDA context", CUDA_CONTEXT)]
    out = {f"sampler{k}": items}
    if apart(r):
        out.update({tp_worker(k, i): tp_worker_items(s, r.rows, seq, r.dtype_bytes, r.tensor_parallel)
                    for i in range(r.tensor_parallel)})
    return out


def gib(n: int) -> str:
    return f"{n / GiB:.2f} GiB"


def format_plan(p: dict[str, list[tuple[str, int]]]) -> str:
    """One line per process: its total, then its items."""
    return "\n".join(f"memory plan: {name} {gib(sum(b for _, b in items))} = "
                     + ", ".join(f"{item} {gib(b)}" for item, b in items) for name, items in p.items())


def gpu_totals(p: dict[str, list[tuple[str, int]]], placement: dict[str, object]) -> dict[object, int]:
    """{GPU: bytes its processes need together}; a GPU is any key, e.g. (node, GPU index) for a
    plan over several nodes. Processes missing from `p` count nothing."""
    out: dict[object, int] = {}
    for name, g in placement.items():
        out[g] = out.get(g, 0) + sum(b for _, b in p.get(name, []))
    return out


def bf16_plan(s: Shape, r: RunShape) -> dict[str, list[tuple[str, int]]] | None:
    """The same run's plan with --precision bf16 (bf16 weights and gradients, no autocast copies),
    for a run whose learner holds float32 weights (autocast or fp32) under DeepSpeed; None
    otherwise (bf16 already, or --no-deepspeed, which grpo.config refuses with bf16)."""
    if r.precision not in ("autocast", "fp32") or not r.deepspeed:
        return None
    return plan(s, replace(r, precision="bf16"))


def check_fits(p: dict[str, list[tuple[str, int]]], gpu_bytes: dict[int, int],
               placement: dict[str, int], bf16: dict[str, list[tuple[str, int]]] | None = None) -> str | None:
    """None if every GPU holds the processes placed on it (with --share-gpus several add up), else
    one line: the GPU, its total against its memory, the biggest item and the flag that shrinks it.
    GPUs missing from gpu_bytes (or 0) are not checked. `bf16`: the same run under --precision bf16
    (bf16_plan); when it fits every GPU, the line says so, with its total on the GPU named: float32
    weights cost 22 bytes a parameter on one rank against bf16's 16, often the whole difference."""
    problem = _over(p, gpu_bytes, placement, counted_only=True)
    if problem is None or bf16 is None or _over(bf16, gpu_bytes, placement, counted_only=True) is not None:
        return problem
    g = _first_over(p, gpu_bytes, placement, counted_only=True)
    return f"{problem}; --precision bf16 (bf16 weights) would fit: about {gib(_counted(bf16, placement, g))}"


def fitting_micro_tokens(s: Shape, r: RunShape, gpu_bytes: dict[int, int], placement: dict[str, int],
                         with_reserve: bool = False) -> int | None:
    """The learner's token budget per micro-batch halved until the plan's counted items fit every
    GPU (check_fits), and with_reserve the allocator's reserve as well (check_tight), down to one row
    of the assumed length; None when the budget is not a token budget (fixed micro-batches), the
    plan fits already, or even one row does not fit. with_reserve is for a GPU that a learner shares
    with a sampler: there the reserve is real (1.5B on one H200: counted 127 of 140 GiB, ran out).
    Halving rather than the largest budget that just fits: activations are a rough rule, and a
    counted total at the GPU's edge leaves the allocator nothing. A micro-batch is a throughput
    setting only: the step's gradient is the same sum over its rows, accumulated."""
    def fits(p) -> bool:
        return check_fits(p, gpu_bytes, placement) is None and not (with_reserve and check_tight(p, gpu_bytes, placement))

    seq = r.prompt_tokens + r.new_tokens
    tokens = r.micro_tokens
    if not tokens or fits(plan(s, r)):
        return None
    while tokens // 2 >= seq:
        tokens //= 2
        if fits(plan(s, replace(r, micro_tokens=tokens))):
            return tokens
    return None


def check_tight(p: dict[str, list[tuple[str, int]]], gpu_bytes: dict[int, int],
                placement: dict[str, int]) -> str | None:
    """For a plan check_fits lets through: one line when the ESTIMATED items (the allocator's
    reserve) put a GPU over, else None."""
    return _over(p, gpu_bytes, placement, counted_only=False)


def _per_gpu(p, placement) -> dict[int, list[str]]:
    per_gpu: dict[int, list[str]] = {}
    for name, g in placement.items():
        if name in p:
            per_gpu.setdefault(g, []).append(name)
    return per_gpu


def _gpu_items(p, names: list[str], counted_only: bool) -> list[tuple[str, tuple[str, int]]]:
    return [(n, it) for n in names for it in p[n] if not (counted_only and it[0] in ESTIMATED)]


def _counted(p, placement, g) -> int:
    """The counted bytes (no ESTIMATED items) of the processes placed on GPU g."""
    return sum(b for _, (_, b) in _gpu_items(p, _per_gpu(p, placement).get(g, []), counted_only=True))


def _first_over(p, gpu_bytes, placement, counted_only: bool):
    """The first GPU (in sorted order) whose processes need more than it holds, else None."""
    per_gpu = _per_gpu(p, placement)
    for g in sorted(per_gpu):
        cap = gpu_bytes.get(g) or 0
        if cap and sum(b for _, (_, b) in _gpu_items(p, per_gpu[g], counted_only)) > cap:
            return g
    return None


def _over(p, gpu_bytes, placement, counted_only: bool) -> str | None:
    if (g := _first_over(p, gpu_bytes, placement, counted_only)) is None:
        return None
    cap, names = gpu_bytes[g], _per_gpu(p, placement)[g]
    items = _gpu_items(p, names, counted_only)
    total = sum(b for _, (_, b) in items)
    bn, (item, b) = max(items, key=lambda x: x[1][1])
    if counted_only:
        return (f"the memory plan does not fit GPU {g}: {' + '.join(names)} need about {gib(total)} of "
                f"its {gib(cap)}; the biggest item is {bn}'s {item} ({gib(b)}): shrink it with "
                f"{SHRINK[item]}")
    return (f"the memory plan may not fit GPU {g}: {' + '.join(names)} need about {gib(total)} of its "
            f"{gib(cap)} with the allocator's reserve, an estimate (without it they fit); if it runs out "
            f"of memory, shrink {bn}'s {item} ({gib(b)}) with {SHRINK[item]}")


def decode_rows(group: int, prompts_per_round: int = 0, in_flight_rows: int = 0, staleness: Staleness | None = None,
                filter_zero_signal: bool = SamplerRollout.filter_zero_signal,
                max_prompts_per_round: int = SamplerRollout.max_prompts_per_round,
                samplers: int = 1, cuda_graphs: bool = SamplerRollout.cuda_graphs) -> int:
    """The most rows a sampler's engine decodes at once, which its KV cache holds: --in-flight-rows;
    or a round's prompts x group (--prompts-per-round, or under 0 the largest round the sampler's
    rule can choose: the learner's `staleness` rule's largest_round_prompts, at least the smallest
    bucket's worth of prompts) padded to the engine's row bucket (ROW_BUCKETS with CUDA graphs; a
    round above the largest decodes in chunks of it), exact without graphs."""
    if in_flight_rows:
        return in_flight_rows
    buckets = ROW_BUCKETS if cuda_graphs else ()
    if not prompts_per_round:
        if staleness is None:
            raise ValueError("decode_rows: --prompts-per-round 0 sizes rounds by the learner's staleness rule; "
                             "pass it (grpo.rules.staleness.Staleness)")
        prompts_per_round = staleness.largest_round_prompts(filter_zero_signal, max_prompts_per_round,
                                                            bucket_prompts(buckets, group), samplers)
    rows = prompts_per_round * group
    return next((b for b in buckets if b >= rows), buckets[-1]) if buckets else rows




# ----------------------------------------------------------------------------- vLLM (--generation-backend vllm)
VLLM_WORKSPACE = GiB   # vLLM's activations at its largest batch, sampler and CUDA graph pool: a ROUGH RULE, a
#                        stated constant (vLLM profiles its own peak at start-up within the budget given)
VLLM_ITEMS = ("vLLM weights", "KV cache", "vLLM workspace")   # what a sampler's plan gives vLLM's own budget


def per_gpu(total: int, tensor_parallel: int) -> int:
    """One GPU's share of `total` bytes split over `tensor_parallel` GPUs (rounded up): vLLM's tensor
    parallelism splits the weights (each layer's matrices by heads and columns) and the KV cache (by
    KV heads) evenly. An estimate: the embeddings, norms and a KV head count that does not divide
    are replicated, not split."""
    if tensor_parallel < 1:
        raise ValueError(f"tensor parallel size must be at least 1, got {tensor_parallel}")
    return -(-total // tensor_parallel)


def vllm_items(s: Shape, rows: int, seq: int, dtype_bytes: int = 2, tensor_parallel: int = 1) -> list[tuple[str, int]]:
    """What vLLM's engine holds on each of its GPUs: its copy of the weights and a KV cache for `rows`
    sequences of `seq` tokens (vLLM's paged cache gets all its budget leaves; this is what the rows
    need), each a 1/tensor_parallel share, and its workspace (VLLM_WORKSPACE, on every GPU)."""
    return [("vLLM weights", per_gpu(s.params * dtype_bytes, tensor_parallel)),
            ("KV cache", per_gpu(kv_cache(s, rows, seq, dtype_bytes), tensor_parallel)),
            ("vLLM workspace", VLLM_WORKSPACE)]


def workers_apart(vllm: bool, tensor_parallel: int, engine_process: bool) -> bool:
    """Whether a sampler's vLLM workers are processes apart from the sampler's own: only with vLLM,
    over several GPUs (a worker process per GPU), or with its engine core in a process of its own
    (its one worker there)."""
    return vllm and (tensor_parallel > 1 or engine_process)


def apart(r: RunShape) -> bool:
    """workers_apart for a run's shape."""
    return workers_apart(r.vllm, r.tensor_parallel, r.vllm_process)


def tp_worker(sampler: int, rank: int) -> str:
    """The plan's name for vLLM's worker process of tensor-parallel `rank` under sampler `sampler`."""
    return f"sampler{sampler}.tp{rank}"


def tp_worker_items(s: Shape, rows: int, seq: int, dtype_bytes: int, tensor_parallel: int) -> list[tuple[str, int]]:
    """What one of vLLM's worker processes holds on its GPU when a sampler spreads over
    `tensor_parallel` GPUs (vLLM's multiprocess executor: a process per GPU, the sampler's own one
    apart), or the engine-core process of --vllm-engine-process on one: its GPU's share of vLLM's
    items (vllm_items) and a CUDA context of its own."""
    return [*vllm_items(s, rows, seq, dtype_bytes, tensor_parallel), ("CUDA context", CUDA_CONTEXT)]


def vllm_gpu_fraction(sampler_items: list[tuple[str, int]], gpu_total: int) -> float:
    """vLLM's gpu_memory_utilization for a sampler: the share of its GPU's `gpu_total` bytes that the
    plan's vLLM items (VLLM_ITEMS, per GPU) take, rounded up to a hundredth. vLLM 0.25 reads it as
    this instance's budget (weights, activations, KV cache, graphs), not the whole GPU's use, so the
    sampler's other items (its receiving weights, log-prob pass, CUDA context) and a learner sharing
    the GPU stay outside it. A share over 1 is refused with one line."""
    if gpu_total <= 0:
        raise ValueError(f"vllm_gpu_fraction: the GPU's total must be positive, got {gpu_total}")
    need = sum(b for item, b in sampler_items if item in VLLM_ITEMS)
    hundredths = -(-need * 100 // gpu_total)
    if hundredths > 100:
        raise ValueError(f"vLLM's share of the sampler needs {gib(need)}, more than its GPU's {gib(gpu_total)}: "
                         f"shrink it with {SHRINK['KV cache']}, or a smaller --model")
    return max(hundredths, 1) / 100
