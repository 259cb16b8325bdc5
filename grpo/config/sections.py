"""The sections the options are grouped in: a title and one line each, in the order --help shows them.

A section is one or more dataclasses whose `section` names the title: the options both roles share,
the sampler's and the learner's own parts of the same subject. A role config holds one object per
section (``cfg.rollout.in_flight_rows``), the attribute named in ATTRS; flags, YAML keys and the
config JSON of a run folder stay flat (flat, from_flat), since a field name is unique within a role.
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

# The attribute a role config holds each section under.
ATTRS = {"run": "run", "rollout": "rollout", "data and rewards": "data", "loss": "loss", "training": "training",
         "weight sync": "weight_sync", "faults and security": "faults", "checkpoints": "checkpoints",
         "evaluation": "evaluation", "observability": "observability", "placement": "placement",
         "supervision": "supervision", "seeded instances": "instances", "several nodes": "nodes"}


def section_class(f: dataclasses.Field) -> type | None:
    """The section dataclass a role config's field holds, or None for a plain field (LaunchConfig.extra)."""
    kind = f.default_factory
    return kind if isinstance(kind, type) and dataclasses.is_dataclass(kind) and hasattr(kind, "section") else None


@functools.cache
def flat_fields(cls: type) -> dict[str, tuple[str, dataclasses.Field]]:
    """Each flat field name of role config `cls` -> (the section attribute holding it, "" for a
    field of the role class itself; its dataclass field), in --help's order within a section."""
    out: dict[str, tuple[str, dataclasses.Field]] = {}
    for f in dataclasses.fields(cls):
        kind = section_class(f)
        for g in dataclasses.fields(kind) if kind else [f]:
            out[g.name] = (f.name if kind else "", g)
    return out


def flat(cfg) -> dict:
    """A role config as one flat mapping (field name -> value): what flags, YAML keys and the config
    JSON of a run folder spell, so the folders written before sections were nested still read."""
    return {name: getattr(getattr(cfg, attr) if attr else cfg, name)
            for name, (attr, _) in flat_fields(type(cfg)).items()}


def from_flat(cls: type, values: dict | None = None, /, **kw):
    """Role config `cls` from flat field names (`values`, then `kw`); the rest keep their defaults.
    An unknown name is a TypeError, as the dataclass's own constructor would raise."""
    where = flat_fields(cls)
    parts: dict[str, dict] = {}
    for name, value in {**(values or {}), **kw}.items():
        if name not in where:
            raise TypeError(f"{cls.__name__} has no field {name!r}")
        parts.setdefault(where[name][0], {})[name] = value
    own = parts.pop("", {})
    return cls(**own, **{f.name: section_class(f)(**parts.get(f.name, {}))  # type: ignore[misc]
                         for f in dataclasses.fields(cls) if section_class(f)})


@functools.cache
def field_sections(cls: type) -> dict[str, str]:
    """Each field of dataclass `cls` -> the title of its section ("" for a field the role class
    declares itself, outside every section). Cached: a class's fields do not change, and every
    parse asks (the launcher parses each role's flags several times); callers only read it."""
    out = {}
    for name, (attr, _) in flat_fields(cls).items():
        kind = next((section_class(f) for f in dataclasses.fields(cls) if f.name == attr), None)
        out[name] = kind.section if kind else ""
    return out
