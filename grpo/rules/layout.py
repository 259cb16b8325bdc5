"""How a run's GPUs are split between samplers and learner ranks: the split chosen at start from
the model's size and the step's settings (choose_split, below), and what a finished run's measured
rates say about its split (advice). Pure rules, no I/O.

A step needs a step's worth of groups generated, scored and passed through the log-prob passes
(the samplers' busy seconds) and one optimizer step (the learner ranks' training seconds). With
GPUs of their own, samplers and learner ranks work side by side, so a step takes about the larger
of the two. Spread over s sampler GPUs and r learner ranks: max(gen / s, train / r), where gen is
one GPU's sampler-seconds a step and train one rank's training-seconds a step. gen is measured
(each sampler's busy seconds over the run's steps); train assumes training time scales with
1 / ranks, which data parallelism approaches and never beats: a prediction for more ranks than
measured is optimistic, one for fewer pessimistic (a rank's own step has less to share).
"""
from __future__ import annotations

import statistics
from dataclasses import dataclass, field

from grpo.stats import sampler_busy_s

# Say so when a role is idle more than this share of each step, and only for a split predicted
# to be at least this much faster (what the rule cannot promise is left unsaid).
IDLE_SHARE = 0.5
MIN_GAIN = 1.25


def measured(metrics: list[dict], summary: dict) -> dict | None:
    """Per-step figures from metrics.jsonl's step records and summary.json: the median step, the
    learner's busy share (training seconds over step seconds, the first step left out: it waits for
    the first groups) and the samplers' busy sampler-seconds a step (generation, log-prob passes
    and scoring, all samplers, over the steps). None before two steps."""
    steps = [m for m in metrics if "step" in m and "step_time_s" in m and "train_s" in m][1:]
    n = summary.get("steps") or 0
    if not steps or not n:
        return None
    busy = sum(sampler_busy_s(s.get("stats", {})) for s in (summary.get("samplers") or {}).values())
    return {"step_s": statistics.median(s["step_time_s"] for s in steps),
            "learner_busy": statistics.median(s["train_s"] / s["step_time_s"] for s in steps if s["step_time_s"] > 0),
            "train_s": statistics.median(s["train_s"] for s in steps),
            "sampler_s": busy / n}


def predicted_step(gen_s: float, train_s: float, samplers: int, ranks: int) -> float:
    """The step of `samplers` sampler GPUs and `ranks` learner ranks on GPUs of their own, from one
    GPU's sampler-seconds (gen_s) and one rank's training-seconds (train_s) a step."""
    return max(gen_s / samplers, train_s / ranks)


def best_split(gpus: int, gen_s: float, train_s: float) -> tuple[int, int]:
    """(samplers, ranks) with samplers + ranks = gpus (at least one of each) whose predicted step is
    shortest; on a tie, more learner ranks (they also shorten the optimizer step's wall time)."""
    splits = [(s, gpus - s) for s in range(1, gpus)]
    return min(splits, key=lambda sr: (predicted_step(gen_s, train_s, *sr), sr[0]))


def advice(rates: dict, sampling_gpus: list[int], training_gpus: list[int]) -> str | None:
    """One line when a role was idle most of each step and another split of the same GPUs is
    predicted at least MIN_GAIN faster; None otherwise (or when roles share GPUs)."""
    samplers, ranks = len(sampling_gpus), len(training_gpus)
    if not samplers or not ranks or set(sampling_gpus) & set(training_gpus):
        return None
    gen, train = rates["sampler_s"], rates["train_s"] * ranks   # one GPU's seconds a step, each role
    sampler_busy = min(1.0, gen / samplers / rates["step_s"]) if rates["step_s"] else 0.0
    idle = [name for name, busy in (("learner ranks", rates["learner_busy"]), ("samplers", sampler_busy))
            if busy < IDLE_SHARE]
    s, r = best_split(samplers + ranks, gen, train)
    now, then = predicted_step(gen, train, samplers, ranks), predicted_step(gen, train, s, r)
    if not idle or (s, r) == (samplers, ranks) or now < MIN_GAIN * then:
        return None
    gpus = sorted(sampling_gpus + training_gpus)
    return (f"layout: the learner ranks trained {rates['learner_busy']:.0%} and the samplers were busy "
            f"{sampler_busy:.0%} of each {rates['step_s']:.2f} s step; the {' and '.join(idle)} idle most of it. "
            f"By these rates --sampling-gpus {','.join(map(str, gpus[:s]))} --training-gpus "
            f"{','.join(map(str, gpus[s:]))} would take about {then:.2f} s a step (training assumed to scale "
            f"with its ranks)")


# --- The split chosen at start: run_distributed.py --gpus ------------------------------------------
#
# Before a run there are no measured seconds, so each role's step is costed from the run's flags:
#   step tokens  T = train_batch_size x max_new_tokens (every completion of a step at its longest)
#   generation   T / (gen rate per GPU x s)           on s sampler GPUs
#   training     c x params x T / r                   on r learner ranks (compute grows with both)
# and the split minimising the slower of the two is chosen (as best_split), ties to fewer samplers.
# An earlier run's measured rates (Rates) replace either default.

DEFAULT_GEN_TOKENS_PER_S = 19_300.0
"""One sampler GPU's generation rate in step tokens a second, where no run has measured one. Derived
from the real-workload 0.5B row of docs/benchmarks.md; docs/configuration.md ("Choosing the split:
--gpus") shows the derivation."""
DEFAULT_TRAIN_S_PER_PARAM_TOKEN = 5.7e-14
"""The training cost c where no run has measured one: seconds of one learner rank per parameter per
step token (a step takes c x params x T / ranks). Derived from the same row as
DEFAULT_GEN_TOKENS_PER_S; docs/configuration.md shows how."""
REFERENCE_PARAMS = 494_032_768
"""The parameters of the model those defaults were derived on (Qwen2.5-Coder-0.5B-Instruct, as
grpo.rules.memory counts them): a model whose size cannot be read before it loads is costed as it."""


@dataclass
class Rates:
    """Rates measured in an earlier run of the same model and step settings (rates_from_run); each
    replaces its default where given."""

    gen_tokens_per_s: float | None = None
    """One sampler GPU's step tokens a second (the step tokens of the run that measured it, over one
    GPU's busy sampler-seconds a step)."""
    learner_s: dict[int, float] = field(default_factory=dict)
    """{learner ranks: training seconds of one optimizer step with that many ranks}."""
    step_tokens: int = 0
    """The step tokens (train_batch_size x max_new_tokens) learner_s was measured at."""
    source: str = ""
    """Where they were measured (a run folder), for the reason line."""


@dataclass(frozen=True)
class Split:
    """How many GPUs sample and how many train, and why."""

    samplers: int
    ranks: int
    share: bool   # one GPU: the sampler beside the learner rank
    why: str


@dataclass(frozen=True)
class Choice:
    """A split placed on GPU ids: the explicit flags it stands for."""

    sampling_gpus: tuple[int, ...]
    training_gpus: tuple[int, ...]
    share: bool
    why: str

    def flags(self) -> list[str]:
        """The run_distributed.py flags that give the same plan."""
        out = ["--sampling-gpus", ",".join(map(str, self.sampling_gpus)),
               "--training-gpus", ",".join(map(str, self.training_gpus))]
        return out + (["--share-gpus"] if self.share else [])


def step_tokens(train_batch_size: int, max_new_tokens: int) -> int:
    """T: a step's completions at their longest, the unit both roles are costed in."""
    return train_batch_size * max_new_tokens


def max_samplers(train_batch_size: int, num_generations: int) -> int:
    """Samplers that can each have a group of every step: a sampler sends whole groups, and a step
    takes train_batch_size / num_generations of them (at least one)."""
    return max(1, train_batch_size // max(1, num_generations))


def role_seconds(samplers: int, ranks: int, params: int, tokens: int,
                 rates: Rates | None = None) -> tuple[float, float]:
    """(generation seconds, training seconds) of one step of `tokens` step tokens on `samplers`
    sampler GPUs and `ranks` learner ranks. Measured learner seconds are scaled from the measured rank
    count nearest `ranks` (the larger on a tie) by ranks and by step tokens, as the default is."""
    rate = rates.gen_tokens_per_s if rates and rates.gen_tokens_per_s else DEFAULT_GEN_TOKENS_PER_S
    gen = tokens / (rate * samplers)
    if rates and rates.learner_s and rates.step_tokens:
        near = min(rates.learner_s, key=lambda r: (abs(r - ranks), -r))
        train = rates.learner_s[near] * near / ranks * tokens / rates.step_tokens
    else:
        train = DEFAULT_TRAIN_S_PER_PARAM_TOKEN * params * tokens / ranks
    return gen, train


def _size(params: int) -> str:
    if params >= 1e9:
        return f"{params / 1e9:.1f}B"
    return f"{params / 1e6:.0f}M" if params >= 1e6 else f"{params:,}"


def choose_split(gpus: int, params: int | None, max_new_tokens: int, train_batch_size: int,
                 num_generations: int, rates: Rates | None = None, feasible=None, tp: int = 1) -> Split:
    """The split of `gpus` GPUs: 1 -> the sampler and the learner share it; otherwise s samplers and
    gpus - s ranks (at least one each, s at most max_samplers, feasible(s, r) where given) whose slower
    role is fastest by role_seconds, ties to fewer samplers. params None: the model's size is not known
    here, costed as REFERENCE_PARAMS. The reason names the inputs, both roles' seconds and the
    neighbouring splits'. tp > 1: each sampler takes tp GPUs (a vLLM sampler over several GPUs), so
    s samplers leave gpus - s x tp ranks; a sampler is costed at one GPU's rate (how much faster
    tensor parallelism decodes depends on the model: a stated underestimate), and no GPU is shared
    (one GPU cannot hold a sampler of several)."""
    if gpus < 1:
        raise ValueError("no GPUs to lay out")
    if tp > 1 and gpus < tp + 1:
        raise ValueError(f"--gpus gives {gpus} GPU(s): a vLLM sampler over {tp} GPUs (--vllm-tensor-parallel-size "
                         f"{tp}) and a learner rank need at least {tp + 1}; list more GPUs, or lower "
                         f"--vllm-tensor-parallel-size")
    if gpus == 1:
        return Split(1, 1, True, "one GPU: the sampler and the learner share it")
    size = params if params else REFERENCE_PARAMS
    tokens = step_tokens(train_batch_size, max_new_tokens)
    cap = max_samplers(train_batch_size, num_generations)
    ok = [(s, gpus - s * tp) for s in range(1, min(cap, gpus - 1) + 1)
          if gpus - s * tp >= 1 and (feasible is None or feasible(s, gpus - s * tp))]
    if not ok:
        raise ValueError(f"no split of {gpus} GPUs into samplers and learner ranks can be placed")
    step = {sr: max(role_seconds(*sr, size, tokens, rates)) for sr in ok}
    s, r = min(ok, key=lambda sr: (step[sr], sr[0]))
    gen, train = role_seconds(s, r, size, tokens, rates)
    by = f"rates measured in {rates.source}" if rates and rates.source else "the default rates"
    model = f"{_size(params)} parameters" if params else f"model size not known here (costed as {_size(size)})"
    on = f"{s} GPU{'s' * (s > 1)}" if tp == 1 else f"{s} sampler{'s' * (s > 1)} of {tp} GPUs, each costed as one GPU"
    why = (f"{model}, {train_batch_size} x {max_new_tokens} tokens a step, by {by}: {s}+{r} takes about "
           f"{step[(s, r)]:.2f} s a step (generation {gen:.2f} s on {on}, training {train:.2f} s "
           f"on {r} rank{'s' * (r > 1)})")
    others = [f"{a}+{b} {step[(a, b)]:.2f} s" for a, b in sorted(step) if a in (s - 1, s + 1)]
    if others:
        why += f"; {', '.join(others)}"
    if cap < gpus - 1:
        why += f"; at most {cap} sampler{'s' * (cap > 1)} ({train_batch_size} / {num_generations} groups a step)"
    return Split(s, r, False, why)


def choose_layout(gpu_ids: list[int], params: int | None, max_new_tokens: int, train_batch_size: int,
                  num_generations: int, rates: Rates | None = None, tp: int = 1) -> Choice:
    """choose_split on these GPUs: the samplers take the first ids (tp each), the learner ranks the
    rest (as the seed's --sampling-gpu 0 --training-gpus 1,2,3); one GPU does both."""
    sp = choose_split(len(gpu_ids), params, max_new_tokens, train_batch_size, num_generations, rates, tp=tp)
    ids = tuple(gpu_ids)
    if sp.share:
        return Choice(ids, ids, True, sp.why)
    return Choice(ids[:sp.samplers * tp], ids[sp.samplers * tp:], False, sp.why)


def layout_line(given: str, choice: Choice) -> str:
    """The start-up line: what was given, the split, the flags it equals and why."""
    gpus = lambda ids: ",".join(map(str, ids))   # noqa: E731
    if choice.share:
        what = f"sampling and training share GPU {gpus(choice.sampling_gpus)}"
    else:
        plural = lambda ids: "GPUs" if len(ids) > 1 else "GPU"   # noqa: E731
        what = (f"sampling {plural(choice.sampling_gpus)} {gpus(choice.sampling_gpus)} + training "
                f"{plural(choice.training_gpus)} {gpus(choice.training_gpus)}")
    return f"layout: --gpus {given} -> {what} (as {' '.join(choice.flags())}; why: {choice.why})"


def nodes_layout_line(nodes: str, split: Split) -> str:
    """The line of --gpus all over --nodes: the split as the flags it equals, and why."""
    flags = f"--training-ranks {split.ranks} --num-samplers {split.samplers}" + (" --share-gpus" if split.share else "")
    return (f"layout: --nodes {nodes} --gpus all -> {split.ranks} learner rank{'s' * (split.ranks > 1)} + "
            f"{split.samplers} sampler{'s' * (split.samplers > 1)} (as {flags}; why: {split.why})")


def rates_from_run(metrics: list[dict], summary: dict, launch: dict, learner: dict, source: str) -> Rates:
    """An earlier run's Rates from its metrics.jsonl records, summary.json, config_launch.json and
    config_learner.json; ValueError, one line, when they cannot give them (too few steps, roles that
    shared a GPU, so that neither role's seconds are its own)."""
    m = measured(metrics, summary)
    if m is None:
        raise ValueError(f"{source} has fewer than two trained steps to measure rates on")
    ids = lambda text: [x for x in str(text or "").replace(" ", "").split(",") if x]   # noqa: E731
    sampling, training = ids(launch.get("sampling_gpus")), ids(launch.get("training_gpus"))
    if set(sampling) & set(training) or not (sampling and training):
        raise ValueError(f"{source}'s samplers and learner ranks did not have GPUs of their own, so its "
                         f"seconds are not each role's alone")
    tokens = step_tokens(int(learner["train_batch_size"]), int(learner["max_new_tokens"]))
    gen = tokens / m["sampler_s"] if m["sampler_s"] > 0 else None
    return Rates(gen, {len(training): m["train_s"]} if m["train_s"] > 0 else {}, tokens, source)
