"""The sections the options are grouped in: a title and one line each, in the order --help shows them.

A section is one or more dataclasses whose `section` names the title: the options both roles share,
the sampler's and the learner's own parts of the same subject (each in its own class, since a role
config is composed of the classes of its role). A field's section is the class that declares it.
"""
from __future__ import annotations

import dataclasses
import functools

SECTIONS = {
    "run": "the model, the device, the run directory, the learner's address and ports",
    "rollout": "how the samplers generate completions: groups, rounds, the decoder",
    "data and rewards": "the problems, how completions are scored, the curriculum",
    "loss": "the objective the learner minimises",
    "training": "the learner's engine, optimizer, batches, precision and LoRA, and when it stops",
    "weight sync": "how each new policy version reaches the samplers",
    "faults and security": "backpressure, heartbeats, timeouts, limits on what a peer may send, encryption",
    "checkpoints": "what the learner saves, how many it keeps, resuming",
    "evaluation": "greedy pass@1 on held-out problems during the run",
    "observability": "logs, metrics and profiles",
    "placement": "which GPUs sample and which train (run_distributed.py)",
    "supervision": "start-up deadlines, stopping, restarting samplers (run_distributed.py)",
    "seeded instances": "independent runs started together (run_distributed.py)",
    "several nodes": "the plan of a run over several machines (run_distributed.py)",
}


@functools.cache
def field_sections(cls: type) -> dict[str, str]:
    """Each field of dataclass `cls` -> the title of its section ("" for a field the role class
    declares itself, outside every section). Cached: a class's fields do not change, and every
    parse asks (the launcher parses each role's flags several times); callers only read it."""
    out = {}
    for f in dataclasses.fields(cls):
        owner = next(k for k in cls.__mro__ if f.name in k.__dict__.get("__annotations__", {}))
        out[f.name] = owner.__dict__.get("section", "")
    return out
