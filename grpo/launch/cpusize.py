"""CPU runs at a CPU's size: the launcher's choices for a run whose processes run on CPU, and the
warning when its settings will still take long there. Torch-free, like the rest of the launch plan.

Why: at the GPU defaults (G 8, 16 completions a step, 256 new tokens, a reference pass for the
KL term) one round of SmolLM2-135M on two cores took 193 s to generate and 248 s for its log-probs,
so a newcomer's `--device cpu --max-steps 2` had not made step 1 after 500 s, and nothing said why.
Where the user sized no step (gave none of G, the batch or the new tokens, neither as a flag nor
as a key of --config), a CPU run takes the sizes below instead, said in one line as the launcher's
other choices are; a run the user sized is kept as given, and the warning says what it will cost.
"""
from __future__ import annotations

from dataclasses import dataclass, replace


# The sizes a CPU run takes where the user left each at its default: two groups of 4 a step, each
# completion up to 64 tokens, no KL term (so no reference model and no reference pass), and rounds
# of exactly one step's prompts (round 0 would otherwise assume a step of 8 groups: 4 steps' worth).
CPU_NUM_GENERATIONS = 4
CPU_GROUPS_PER_STEP = 2
CPU_MAX_NEW_TOKENS = 64
CPU_BETA = 0.0

# Parameter-tokens a second that one run's processes get through on two cores, counted as the
# step's completion tokens (rows x the longest completion) times the model's parameters; it stands
# for generation, the log-prob passes and the learner's forward and backward together. From the
# issue's round on two cores (SmolLM2-135M, 64 completions x 256 tokens with a reference pass in
# 441 s: 6.3e9) and a run at the CPU sizes on a 2-core machine at load average 8 (8 x 64 tokens a
# step in about 40 s: 1.7e9), 2026-11-29. An estimate for the warning, not a promise.
CPU_PARAM_TOKENS_PER_S = 5.0e9
# A reference pass adds one teacher-forced pass over the step's rows to the sampler's work.
REF_PASS_SHARE = 0.25
# Loading the model in every process, before the first round: seconds on two cores.
CPU_START_S = 25.0
# Past this many seconds to the last step, a CPU run is warned about before it starts.
LONG_CPU_S = 300.0


@dataclass(frozen=True)
class CpuSizing:
    """What the launcher chose (flag, value, default) and the settings in effect."""

    chosen: tuple[tuple[str, str, str], ...]
    num_generations: int
    train_batch_size: int
    max_new_tokens: int
    beta: float
    max_steps: int
    max_time_s: float   # the learner's time limit (0: none)


# The options that size a step: a user who gave any of them has sized the run, and the launcher
# then chooses none (the warning still says what the sizes cost).
STEP_SIZES = ("num_generations", "train_batch_size", "max_new_tokens")


def cpu_sizes(given: set[str], num_generations: int, train_batch_size: int, max_new_tokens: int, beta: float,
              prompts_per_round: int, max_steps: int, max_time_s: float, samplers: int) -> tuple[CpuSizing, dict, dict]:
    """(the sizing, the fields every learner rank gets, the fields every sampler gets) for a CPU run
    whose user gave the options in `given`; the other arguments are the values in effect. Where the
    user gave none of STEP_SIZES, the step is CPU-sized: G CPU_NUM_GENERATIONS, CPU_GROUPS_PER_STEP
    groups a step, CPU_MAX_NEW_TOKENS, and (each unless given) --beta 0 and rounds of one step's
    prompts. G and the new tokens are the launcher's own options: the caller sets them on its config."""
    G, batch, tokens = num_generations, train_batch_size, max_new_tokens
    sized = any(name in given for name in STEP_SIZES)
    if sized:
        return CpuSizing((), G, batch, tokens, beta, max_steps, max_time_s), {}, {}
    chosen: list[tuple[str, str, str]] = []
    learner: dict = {}
    sampler: dict = {}
    if G != CPU_NUM_GENERATIONS:
        chosen.append(("--num-generations", str(CPU_NUM_GENERATIONS), str(G)))
        G = CPU_NUM_GENERATIONS
    if batch != CPU_GROUPS_PER_STEP * G:
        chosen.append(("--train-batch-size", str(CPU_GROUPS_PER_STEP * G), str(batch)))
        batch = CPU_GROUPS_PER_STEP * G
        learner["train_batch_size"] = batch
    if tokens > CPU_MAX_NEW_TOKENS:
        chosen.append(("--max-new-tokens", str(CPU_MAX_NEW_TOKENS), str(tokens)))
        tokens = CPU_MAX_NEW_TOKENS
    if "beta" not in given and beta != CPU_BETA:
        chosen.append(("--beta", "0", f"{beta:g}"))
        beta = CPU_BETA
        learner["beta"] = CPU_BETA
    if "prompts_per_round" not in given and prompts_per_round == 0:
        # each sampler's round is its share of one step: round 0 would otherwise be 8 groups (a step
        # of 8 assumed until the learner's first answer), 4 steps' worth that a short run never trains
        per = max(1, batch // G // max(1, samplers))
        chosen.append(("--prompts-per-round", str(per), "0"))
        sampler["prompts_per_round"] = per
    return CpuSizing(tuple(chosen), G, batch, tokens, beta, max_steps, max_time_s), learner, sampler


def sizing_line(sizing: CpuSizing) -> str | None:
    """The launcher's one line for its CPU choices; None where it chose none."""
    if not sizing.chosen:
        return None
    flags = " ".join(f"{flag} {value}" for flag, value, _ in sizing.chosen)
    defaults = ", ".join(default for _, _, default in sizing.chosen)
    return (f"[launcher] on CPU: {flags}, not the defaults {defaults}, so that a step takes seconds on a few cores "
            f"instead of minutes ({sizing.train_batch_size // sizing.num_generations} groups of "
            f"{sizing.num_generations} a step, up to {sizing.max_new_tokens} new tokens each"
            f"{', no KL term, so no reference pass' if any(f == '--beta' for f, _, _ in sizing.chosen) else ''}); "
            f"give any of them to choose")


def estimate_s(params: int, sizing: CpuSizing) -> tuple[float, float]:
    """(seconds a step, seconds to the last step) of a CPU run of a model of `params` parameters at
    `sizing`, by CPU_PARAM_TOKENS_PER_S: the step's completion tokens (its rows times the longest
    completion) times the parameters, more with a reference pass. A --max-time-s ends it sooner."""
    work = params * sizing.train_batch_size * sizing.max_new_tokens * (1 + (REF_PASS_SHARE if sizing.beta else 0))
    step = work / CPU_PARAM_TOKENS_PER_S
    training = step * sizing.max_steps
    if sizing.max_time_s:
        training = min(training, sizing.max_time_s + step)   # it stops after the step that ends past it
    return step, CPU_START_S + training


def slow_warning(params: int | None, sizing: CpuSizing) -> str | None:
    """One line when a CPU run's settings will take long (LONG_CPU_S to its last step, by
    estimate_s), naming what costs it and what would finish sooner; None otherwise or where the
    model's size is not known yet."""
    if not params:
        return None
    step, total = estimate_s(params, sizing)
    if total <= LONG_CPU_S:
        return None
    ref = ", a reference pass (--beta > 0)" if sizing.beta else ""
    return (f"on CPU these settings take long: about {step:.0f} s a step ({sizing.train_batch_size} completions of up "
            f"to {sizing.max_new_tokens} tokens, {params / 1e6:.0f}M parameters{ref}), so about {total / 60:.0f} min to "
            f"its last step on two cores; a smaller --max-steps, --train-batch-size or --max-new-tokens, "
            f"--beta 0 or --model tiny-random finishes sooner")


def worker_flags(sizing: CpuSizing) -> list[str]:
    """The chosen options the launcher passes on to the workers (G and the new tokens are its own)."""
    own = ("--num-generations", "--max-new-tokens")
    return [x for flag, value, _ in sizing.chosen if flag not in own for x in (flag, value)]


def apply(cfg, sizing: CpuSizing):
    """The launcher's config with the sizing's G and new tokens (its own options)."""
    return replace(cfg, rollout=replace(cfg.rollout, num_generations=sizing.num_generations,
                                        max_new_tokens=sizing.max_new_tokens))
