"""The training section: the learner's engine, optimizer, batches, precision, LoRA, and when it stops."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Literal, get_args

from grpo.config.bounds import at_least, bounded

Precision = Literal["auto", "autocast", "bf16", "fp32"]
PRECISIONS = get_args(Precision)
LigerChoice = Literal["auto", "on", "off"]
LIGER_CHOICES = get_args(LigerChoice)


# deepspeed.json, the default --deepspeed-config, as written. Its "auto" values belong to the options
# (--train-batch-size, --learning-rate, bf16 from --precision: grpo.learner.engine.resolve_ds_config
# fills them); the rest are DeepSpeed's settings for this trainer, and an "auto" a user writes for
# one of them is filled from here. The file stays a file, for users to copy and edit; a test holds
# it equal to this.
DEEPSPEED = {
    "train_batch_size": "auto",
    "train_micro_batch_size_per_gpu": 32,
    "gradient_accumulation_steps": "auto",
    "gradient_clipping": 1.0,
    "bf16": {"enabled": "auto"},
    "zero_optimization": {
        "stage": 2,
        "overlap_comm": False,
        "contiguous_gradients": True,
        "reduce_bucket_size": 50000000,
        "allgather_bucket_size": 50000000,
    },
    "optimizer": {
        "type": "AdamW",
        "params": {"lr": "auto", "betas": [0.9, 0.99], "eps": 1e-8, "weight_decay": 0.0, "torch_adam": True},
    },
    "steps_per_print": 1000000,
    "wall_clock_breakdown": False,
}


@dataclass
class TrainingSection:
    """How the learner steps and for how long."""

    section = "training"

    no_deepspeed: bool = False
    """One plain PyTorch process with torch.optim.AdamW instead of a DeepSpeed group."""
    deepspeed_config: str = "deepspeed.json"
    """DeepSpeed config file; its "auto" values come from these options, and a number contradicting one is an error."""
    precision: Precision = "auto"
    """CUDA: 'autocast' (fp32 weights, bf16 matmuls), 'bf16' (bf16 weights, fp32 master), 'auto' (bf16 with LoRA, else autocast)."""
    learning_rate: float = at_least(0, 1e-6)
    """AdamW learning rate."""
    train_batch_size: int = at_least(1, 16)
    """Completions per optimizer step, all ranks together (a multiple of --num-generations)."""
    ppo_minibatches: int = 1
    """Updates per learner step, each on a minibatch of groups."""
    micro_batch_tokens: int = at_least(-1, 0, "0: the default budget, -1: off")
    """Tokens per learner micro-batch (padded slots, or real tokens with padding-free passes), packed by length (0: default budget; -1: fixed micro-batches of rows)."""
    padding_free: bool = True
    """The learner's passes over each micro-batch's real tokens only, no padding slot (TRL's padding_free), where the model's type allows."""
    liger_kernel: LigerChoice = "auto"
    """Liger-Kernel's fused RMSNorm, SwiGLU and rotary kernels in the learner's passes (TRL's use_liger_kernel); auto: where installed, on CUDA."""
    warm_up: bool = True
    """CUDA: warm up on made-up tokens while round 0 generates."""
    max_staleness: int = at_least(0, 2, "0 trains only groups of the newest version")
    """Drop groups more than this many versions old."""
    max_steps: int = at_least(1, 100)
    """Optimizer steps to run before stopping the samplers and exiting."""
    max_time_s: float = at_least(0, 0.0, "0: no time limit")
    """Time limit of training in seconds (0: none)."""
    lora_r: int = at_least(0, 0, "0: full fine-tuning")
    """LoRA rank (0: full fine-tuning)."""
    lora_alpha: float = 16.0
    """LoRA scaling: the update is (alpha / r) * B @ A."""
    lora_target_modules: str = "all-linear"
    """LoRA modules, comma-separated, or 'all-linear'."""
    lora_dropout: float = bounded(0.0, least=0, below=1)
    """Dropout on the LoRA input."""


@dataclass
class LaunchTrainingSection:
    """The learner settings the launcher itself reads."""

    section = "training"

    no_deepspeed: bool = TrainingSection.no_deepspeed
    """Learner as one plain PyTorch process."""
    max_steps: int = at_least(1, TrainingSection.max_steps)
    """Learner steps before the run stops."""


def resolve_precision(precision: str, cuda: bool, lora: bool, deepspeed: bool) -> str:
    """How the learner holds and computes its weights: 'autocast', 'bf16' or 'fp32'.

    autocast: float32 weights, gradients and optimizer state, with the forward and backward
      matmuls in bf16 under torch.autocast (Hugging Face Trainer's --bf16 without DeepSpeed, and
      TRL's default). The default for full fine-tuning on CUDA (docs/configuration.md says why).
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
