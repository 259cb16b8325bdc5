"""How the samplers decode and the staleness bound that lets them, resolved on the RunPlan: rows in
flight where the launcher chooses the layout, a default --max-staleness raised so those rows keep
decoding and so round 0 is trained whole, each said in one line. One rule for one host and --nodes.
"""
from __future__ import annotations

import sys
from dataclasses import replace

from grpo.config import ROW_BUCKETS, LearnerConfig, SamplerConfig, TrainingSection
from grpo.launch.runplan import RunPlan
from grpo.rules.backend import backend_for
from grpo.rules.staleness import Staleness, bucket_prompts, first_round_groups, flight_span

# The highest --max-staleness the launcher sets by itself so that in-flight rows are kept decoding,
# where the user left the bound at its default: the highest that runs with rows in flight have been
# measured at (docs/benchmarks.md). Past it the launcher only says which bound would fill the rows.
AUTO_STALENESS_MAX = 8

# The rows each sampler keeps in flight where the launcher chooses the layout (--gpus) and the user
# chose no --in-flight-rows: the pool the four- and two-GPU runs with rows in flight decoded
# (docs/benchmarks.md); its KV cache is in the memory plan like any other.
AUTO_IN_FLIGHT_ROWS = 320


def decodes_with_engine(scfg: SamplerConfig) -> bool:
    """Whether a sampler of this config decodes with an engine that keeps rows in flight (ours, or
    vLLM's): its --generation-backend on its device, auto meaning ours on CUDA."""
    return backend_for(scfg.rollout.generation_backend, "cpu" if scfg.run.device == "cpu" else "cuda") in ("fast",
                                                                                                           "vllm")


def in_flight_note(scfg: SamplerConfig, lcfg: LearnerConfig, samplers: int) -> tuple[int, str] | None:
    """When samplers streaming in flight (--in-flight-rows with swaps) are given more rows than the
    learner's staleness bound lets them keep decoding (Staleness.pool_rows), the rest of the rows
    wait for budget and generation runs at the smaller batch: (the smallest bound that would keep
    them all decoding, the clause that says why). None otherwise."""
    rollout = scfg.rollout
    if not rollout.in_flight_rows or not rollout.swap_in_flight or samplers < 1 or not decodes_with_engine(scfg):
        return None   # Hugging Face generate has no rows in flight (the sampler refuses the flag)
    G = scfg.rollout.num_generations
    rule = Staleness(lcfg.training.max_staleness, lcfg.training.train_batch_size // G)
    held = rule.pool_rows(G, samplers)
    if held >= scfg.rollout.in_flight_rows:
        return None
    need = rule.staleness_for_pool(scfg.rollout.in_flight_rows, G, samplers)
    who = f"each of the {samplers} samplers" if samplers > 1 else "the sampler"
    why = (f"at --max-staleness {lcfg.training.max_staleness} the learner's budget lets {who} keep about {held} of its "
           f"{scfg.rollout.in_flight_rows} --in-flight-rows decoding (--max-staleness x {rule.groups_per_step} groups a step / "
           f"samplers, {G} rows a group; more where zero-signal groups are filtered)")
    return need, why


def in_flight_rows(rp: RunPlan, samplers: int, on_gpus: bool) -> int:
    """The rows in flight that suit these samplers, 0 for rounds. Rows need the samplers on GPUs
    (on_gpus), decoding with the engine and swapping weights in place (every method but shared:
    grpo.weights.methods.own_weights), with no --in-flight-rows of the user's; a sampler beside
    learner ranks on one GPU too, for then it decodes while they train instead of taking turns with
    them (docs/benchmarks.md, "One shared GPU"). Then AUTO_IN_FLIGHT_ROWS where the staleness bound
    keeps them all decoding, as given or as fill_in_flight_rows may raise a default one (up to
    AUTO_STALENESS_MAX); with a default bound where it cannot (more samplers share a step's groups,
    or steps are small), the rows AUTO_STALENESS_MAX - flight_span keeps decoding, whole groups,
    at least one: a smaller pool that never drains, where rounds would be budget-sized as well."""
    s = rp.sampler
    if (not on_gpus or samplers < 1 or not rp.left_default("in_flight_rows") or not s.rollout.swap_in_flight
            or s.weight_sync.weight_sync == "shared" or not decodes_with_engine(s)):   # (numpy-free own_weights)
        return 0
    found = in_flight_note(replace(s, rollout=replace(s.rollout, in_flight_rows=AUTO_IN_FLIGHT_ROWS)), rp.learner,
                           samplers)
    if found is None:
        return AUTO_IN_FLIGHT_ROWS
    if not rp.left_default("max_staleness"):
        return 0
    span = flight_span(s.rollout.screen_generations)
    if found[0] + span <= AUTO_STALENESS_MAX:
        return AUTO_IN_FLIGHT_ROWS
    G = s.rollout.num_generations
    rows = Staleness(AUTO_STALENESS_MAX - span, rp.learner.training.train_batch_size // G).pool_rows(G,
                                                                                                               samplers)
    return rows if rows >= G else 0


def choose_in_flight(rp: RunPlan, samplers: int, on_gpus: bool) -> RunPlan:
    """Where in_flight_rows gives rows and the layout is the launcher's to choose (--gpus), every
    sampler's --in-flight-rows instead of fixed rounds (a round's rows idle through its longest
    completion), said in one line; with a layout given by hand the plan as it is, and the line only
    says they would suit it."""
    n = in_flight_rows(rp, samplers, on_gpus)
    if not n:
        return rp
    if not rp.chosen:
        print(f"run_distributed.py: note: the samplers decode in rounds, each row idle from its own end to its round's "
              f"longest; --in-flight-rows {n} would keep every row decoding, weights swapped between decode steps "
              f"(--gpus chooses it)", file=sys.stderr)
        return rp
    fewer = (f"; not {AUTO_IN_FLIGHT_ROWS}, which would need a --max-staleness past {AUTO_STALENESS_MAX} to keep "
             f"decoding" if n < AUTO_IN_FLIGHT_ROWS else "")
    print(f"run_distributed.py: --in-flight-rows {n} on each sampler: they decode with the engine and swap weights "
          f"between decode steps, so a row starts its next sample as soon as its own ends instead of waiting for its "
          f"round's longest, and a sampler beside learner ranks decodes while they train (--in-flight-rows 0 for "
          f"fixed rounds){fewer}", file=sys.stderr)
    return replace(rp, sampler=replace(rp.sampler, rollout=replace(rp.sampler.rollout, in_flight_rows=n)))


def fill_in_flight_rows(rp: RunPlan, samplers: int) -> RunPlan:
    """Where streaming samplers' rows would wait on the staleness bound (in_flight_note), a default
    bound raised to the one that keeps them decoding and flight_span more, up to
    AUTO_STALENESS_MAX, said in one line; otherwise the plan as it is, and the line says which
    bound would fill them."""
    found = in_flight_note(rp.sampler, rp.learner, samplers) if samplers else None
    if found is None:
        return rp
    need, why = found
    screened = rp.sampler.rollout.screen_generations
    span = flight_span(screened)
    bound = need + span
    if bound <= AUTO_STALENESS_MAX and rp.left_default("max_staleness"):
        takes = ("a group takes to generate its screen, then its rest" if screened else
                 "a group's longest completion takes to generate")
        print(f"run_distributed.py: --max-staleness {bound}, not the default {TrainingSection.max_staleness}, so that every "
              f"in-flight row is kept decoding: {why}; {need} fills them, and {span} more are for the versions "
              f"{takes}; give --max-staleness to choose", file=sys.stderr)
        return replace(rp, learner=replace(rp.learner, training=replace(rp.learner.training, max_staleness=bound)))
    print(f"run_distributed.py: warning: {why}, and the other rows wait; --max-staleness {need} would keep all of "
          f"them decoding, with groups up to {need} versions old", file=sys.stderr)
    return rp


def fit_first_round(rp: RunPlan, samplers: int) -> RunPlan:
    """The bound that trains the samplers' round 0 whole: a sampler may make it before the learner's
    first answer says the step's size and the budget (it does not wait for a learner still loading),
    and with small steps it then holds more groups of version 0 than the bound trains
    (first_round_groups: 8 with the defaults, against 3 steps of 2 groups at --max-staleness 2,
    which dropped 2 of them). Where the user left the bound at its default and
    Staleness.staleness_for_first_round is above the bound in effect (fill_in_flight_rows may have
    raised it), up to AUTO_STALENESS_MAX, that bound, said in one line (stdout); otherwise the plan
    as it is (past AUTO_STALENESS_MAX, the run's end says what its groups' ages needed). Whatever
    the layout, one shared device included."""
    if samplers < 1 or not rp.left_default("max_staleness"):
        return rp
    s, default = rp.sampler, TrainingSection.max_staleness
    G = s.rollout.num_generations
    # the engine with CUDA graphs pads a round to its smallest row bucket, so a round takes at least
    # that many prompts (RolloutWorkflow.bucket_prompts); Hugging Face generate and CPU have no floor
    graphs = decodes_with_engine(s) and s.rollout.cuda_graphs and s.run.device != "cpu"
    groups = first_round_groups(s.rollout.prompts_per_round, s.rollout.filter_zero_signal,
                                s.rollout.max_prompts_per_round,
                                bucket_prompts(ROW_BUCKETS if graphs else (), G))
    rule = Staleness(default, rp.learner.training.train_batch_size // G)
    need = rule.staleness_for_first_round(groups, samplers)
    if need <= rp.learner.training.max_staleness or need > AUTO_STALENESS_MAX:
        return rp
    each = f"each of the {samplers} samplers may make" if samplers > 1 else "the sampler may make"
    # On stdout with the launcher's other start-up lines (the layout it chose among them), not on
    # stderr: this applies to nearly every default run, CPU ones included, and a launch refused
    # for a user's mistake says that mistake alone on stderr, in one line.
    print(f"[launcher] --max-staleness {need}, not the default {default}, so that the learner trains every "
          f"group of the samplers' first round: {each} it before the learner's first answer says the step's size and "
          f"the budget, {groups} groups of version 0, and at --max-staleness {default} the learner trains "
          f"{rule.largest_budget()} of {groups * samplers} ({default + 1} steps of {rule.groups_per_step} "
          f"group{'s' * (rule.groups_per_step != 1)}); give --max-staleness to choose", flush=True)
    return replace(rp, learner=replace(rp.learner, training=replace(rp.learner.training, max_staleness=need)))


def resolve_in_flight(rp: RunPlan, samplers: int, on_gpus: bool) -> RunPlan:
    """choose_in_flight, then fill_in_flight_rows for the rows the samplers end up with, and
    fit_first_round for their first round where that needs a larger bound still."""
    rp = choose_in_flight(rp, samplers, on_gpus)
    return fit_first_round(fill_in_flight_rows(rp, samplers), samplers)
