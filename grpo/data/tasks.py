"""reasoning-gym tasks as a data source: each task's own settings, weighted mixtures, and the
adaptive curriculum's levels.

    --dataset rg:<task>[@<weight>][:<key>=<value>,...][+<task>...]

    rg:letter_counting                                          one task at its defaults
    rg:basic_arithmetic:min_terms=2,max_terms=2,max_digits=1    the task's own config values
    rg:letter_counting@2+basic_arithmetic@1:operators=[+,-]     a mixture, 2:1 (reasoning-gym's CompositeDataset)

Keys are the fields of the task's config class (reasoning_gym.factory.DATASETS), checked here:
a bad key is one line naming it and the task's valid keys. Values are YAML scalars or flow
lists. `size` and `seed` are ours: the split's size (--dataset-limit) and seed. In a --config
file the same is reasoning-gym's own composite layout (name, weight, config):

    dataset:
      rg:
        - {name: letter_counting, weight: 2}
        - {name: basic_arithmetic, config: {min_terms: 2, max_terms: 2}}

The curriculum (--curriculum) gives each task one global level of reasoning-gym's own curriculum
class for it (BaseCurriculum.set_global_level): the configuration at a level comes from the
curriculum, over the task's settings above. `next_level` is the rule the learner applies.
"""
from __future__ import annotations

import dataclasses
import difflib
from collections import deque
from dataclasses import dataclass, field
from typing import Any

import yaml

RESERVED = ("size", "seed")   # set from the split, never by the spec


class TaskSpecError(ValueError):
    """A bad rg: spec; one line naming the part, the problem and the fix."""


@dataclass(frozen=True)
class TaskSpec:
    name: str
    weight: float = 1.0
    config: dict[str, Any] = field(default_factory=dict)


def _split_top(text: str, sep: str) -> list[str]:
    """Split on `sep` outside brackets (so a flow list like [+,-] stays one value)."""
    parts, depth, cur = [], 0, ""
    for ch in text:
        depth += ch in "[{"
        depth -= ch in "]}"
        if ch == sep and depth == 0:
            parts.append(cur)
            cur = ""
        else:
            cur += ch
    return parts + [cur]


def parse_spec(text: str) -> list[TaskSpec]:
    """The tasks of `rg:<text>` (text after 'rg:'), syntax only; `check` validates them."""
    specs = []
    for part in _split_top(text, "+"):
        head, _, settings = part.partition(":")
        name, _, weight = head.strip().partition("@")
        if not name:
            raise TaskSpecError(f"rg:{text}: a task name is missing (e.g. rg:letter_counting)")
        try:
            w = float(weight) if weight else 1.0
        except ValueError:
            raise TaskSpecError(f"rg:{name}@{weight}: the weight must be a number, e.g. rg:{name}@2") from None
        if w <= 0:
            raise TaskSpecError(f"rg:{name}@{weight}: the weight must be > 0")
        config: dict[str, Any] = {}
        for item in _split_top(settings, ",") if settings.strip() else []:
            key, eq, value = item.partition("=")
            if not eq or not key.strip():
                raise TaskSpecError(f"rg:{name}: {item!r} is not key=value (e.g. rg:{name}:seed_len=5)")
            try:
                config[key.strip()] = yaml.safe_load(value) if value.strip() else ""
            except yaml.YAMLError:
                raise TaskSpecError(f"rg:{name}: cannot read the value of {key.strip()}: {value!r}") from None
        specs.append(TaskSpec(name.strip(), w, config))
    if len({s.name for s in specs}) != len(specs):
        raise TaskSpecError(f"rg:{text}: a task is named twice; give each task once (with @weight)")
    return specs


def _value(v: Any) -> str:
    if isinstance(v, (list, tuple)):
        return "[" + ",".join(_value(x) for x in v) + "]"
    if isinstance(v, bool):
        return "true" if v else "false"
    return str(v)


def format_spec(specs: list[TaskSpec]) -> str:
    """The --dataset flag for `specs` (the inverse of parse_spec)."""
    parts = []
    for s in specs:
        head = s.name + (f"@{s.weight:g}" if s.weight != 1.0 else "")
        settings = ",".join(f"{k}={_value(v)}" for k, v in s.config.items())
        parts.append(head + (f":{settings}" if settings else ""))
    return "rg:" + "+".join(parts)


def from_yaml(value: Any, where: str) -> str:
    """A --config file's `dataset: {rg: [...]}` block as the --dataset flag."""
    if not (isinstance(value, dict) and list(value) == ["rg"] and isinstance(value["rg"], list) and value["rg"]):
        raise TaskSpecError(f"{where}: dataset must be a string, or {{rg: [{{name, weight, config}}, ...]}}")
    specs = []
    for i, item in enumerate(value["rg"]):
        if isinstance(item, str):
            item = {"name": item}
        if not isinstance(item, dict) or "name" not in item or set(item) - {"name", "weight", "config"}:
            raise TaskSpecError(f"{where}: dataset.rg[{i}] must be {{name, weight, config}}, got {item!r}")
        config = item.get("config") or {}
        if not isinstance(config, dict):
            raise TaskSpecError(f"{where}: dataset.rg[{i}].config must be a mapping of the task's settings")
        specs.append(TaskSpec(str(item["name"]), float(item.get("weight", 1.0)), dict(config)))
    return format_spec(specs)


def _rg():
    """reasoning_gym's factory (the task registry and scorers) and composite (mixtures) modules."""
    from reasoning_gym import composite, factory  # here: reasoning_gym takes ~1 s to import, and the launcher imports this module; only rg: tasks need it

    return factory, composite


def _registry() -> tuple[dict, dict]:
    factory, _ = _rg()
    return factory.DATASETS, factory.CURRICULA


def answer_scorer(task: str):
    """reasoning_gym's own scorer of a task's answers: (answer, entry) -> score."""
    factory, _ = _rg()
    return factory.get_score_answer_fn(task)


def check(specs: list[TaskSpec], curriculum: bool = False) -> None:
    """Every task exists and every setting is a field of its config class with a valid value."""
    datasets, curricula = _registry()
    for s in specs:
        if s.name not in datasets:
            near = difflib.get_close_matches(s.name, list(datasets), n=3)
            hint = f"did you mean {', '.join(near)}? " if near else ""
            raise TaskSpecError(f"rg:{s.name}: reasoning-gym has no such task; {hint}valid task names: "
                                "python -c 'import reasoning_gym.factory as f; print(sorted(f.DATASETS))'")
        config_cls = datasets[s.name][1]
        fields = [f.name for f in dataclasses.fields(config_cls) if f.name not in RESERVED]
        for key in s.config:
            if key in RESERVED:
                raise TaskSpecError(f"rg:{s.name}: {key} is set by the run (--dataset-limit, --seed); drop it")
            if key not in fields:
                near = difflib.get_close_matches(key, fields, n=1)
                hint = f"did you mean {near[0]}? " if near else ""
                raise TaskSpecError(f"rg:{s.name}: unknown setting {key!r}; {hint}"
                                    f"its settings: {', '.join(fields)}")
        if curriculum and s.name not in curricula:
            raise TaskSpecError(f"rg:{s.name}: reasoning-gym has no curriculum for this task; drop --curriculum "
                                f"or choose tasks that have one")
        config_of(s, size=1, seed=0, level=0 if curriculum else None)   # the values themselves


def max_level(name: str) -> int:
    """The highest global level of a task's curriculum (its longest attribute's last level)."""
    curriculum = _registry()[1][name]()
    return max(len(a.levels) for a in curriculum.attributes.values()) - 1


def config_of(spec: TaskSpec, size: int, seed: int, level: int | None = None):
    """The task's config object: its settings, at a curriculum level when one is given (the
    curriculum sets its attributes' fields, the spec the rest). Bad values: TaskSpecError."""
    datasets, curricula = _registry()
    config_cls = datasets[spec.name][1]
    values = {**spec.config, "size": size, "seed": seed}
    try:
        if level is None:
            config = config_cls(**values)
        else:
            curriculum = curricula[spec.name]()
            curriculum.set_global_level(level)
            config = curriculum.generate_configuration(values)
        if hasattr(config, "validate"):
            config.validate()
    except (AssertionError, TypeError, ValueError) as exc:
        detail = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise TaskSpecError(f"rg:{spec.name}: invalid settings {spec.config}: {detail}") from None
    return config


def make_dataset(specs: list[TaskSpec], size: int, seed: int, levels: dict[str, int] | None = None):
    """One task's dataset, or reasoning-gym's CompositeDataset for a mixture (weighted draws)."""
    datasets, _ = _registry()
    configs = [config_of(s, size, seed + i, None if levels is None else levels.get(s.name, 0))
               for i, s in enumerate(specs)]
    if len(specs) == 1:
        return datasets[specs[0].name][0](config=configs[0])
    _, composite = _rg()
    parts = [composite.DatasetSpec(s.name, s.weight, {k: v for k, v in dataclasses.asdict(c).items()})
             for s, c in zip(specs, configs)]
    return composite.CompositeDataset(composite.CompositeConfig(size=size, seed=seed, datasets=parts))


def task_of(entry: dict, specs: list[TaskSpec]) -> str:
    """Which task generated an entry (a mixture's entries name their source)."""
    return str(entry.get("metadata", {}).get("source_dataset") or specs[0].name)


# ----------------------------------------------------------------------------- curriculum


def start_levels(dataset: str) -> dict[str, int]:
    """Level 0 for every task of an rg: --dataset (a curriculum run starts there)."""
    if not dataset.startswith("rg:"):
        raise TaskSpecError(f"--curriculum needs reasoning-gym tasks (--dataset rg:<task>...), not {dataset!r}")
    return {s.name: 0 for s in parse_spec(dataset[3:])}


def next_level(level: int, rate: float, groups: int, top: int, low: float = 0.1, high: float = 0.7,
               window: int = 20) -> int:
    """The learner's rule: with a full window of groups at `level`, a success rate above `high`
    raises the level (up to `top`), one below `low` lowers it (down to 0); else it stays."""
    if groups < window:
        return level
    if rate > high:
        return min(level + 1, top)
    if rate < low:
        return max(level - 1, 0)
    return level


class SuccessWindow:
    """A sampler's count, per task, of its last `window` groups at the task's current level: the
    fraction of their completions with reward_info 'correct' = 1, counted before any filter."""

    def __init__(self, window: int = 20):
        self.window = window
        self.groups: dict[str, deque[tuple[float, int]]] = {}   # task -> (correct, completions) per group
        self.level: dict[str, int] = {}

    def set_level(self, task: str, level: int) -> None:
        if self.level.get(task) != level:
            self.level[task] = level
            self.groups[task] = deque(maxlen=self.window)   # a new level starts a new count

    def add(self, task: str, correct: float, completions: int) -> None:
        self.groups.setdefault(task, deque(maxlen=self.window)).append((correct, completions))

    def stats(self) -> dict[str, float]:
        """For the status message: curriculum/<task>/{level,groups,rate}."""
        out: dict[str, float] = {}
        for task, q in self.groups.items():
            n = sum(c for _, c in q)
            out[f"curriculum/{task}/level"] = float(self.level.get(task, 0))
            out[f"curriculum/{task}/groups"] = float(len(q))
            out[f"curriculum/{task}/rate"] = sum(k for k, _ in q) / n if n else 0.0
        return out


class Curriculum:
    """The learner's side: one level per task, moved by `next_level` on what the samplers report.

    Each sampler's status carries, per task, the level its window counts at, how many groups it
    holds (at most --curriculum-window) and their success rate (SuccessWindow.stats). The learner
    pools the windows of every sampler at the task's current level (weighted by groups): with one
    sampler that is exactly its last `window` groups; with k samplers up to k windows.
    """

    def __init__(self, dataset: str, low: float, high: float, window: int):
        if not low < high:
            raise TaskSpecError(f"--curriculum-low {low} must be below --curriculum-high {high}")
        self.levels = start_levels(dataset)
        check(parse_spec(dataset[3:]), curriculum=True)
        self.top = {t: max_level(t) for t in self.levels}
        self.low, self.high, self.window = low, high, window
        self.changes: list[dict] = []

    def update(self, reports: list[dict[str, float]], step: int) -> list[dict]:
        """Apply the rule to the samplers' latest reports after `step`; returns the changes made."""
        made = []
        for task, level in self.levels.items():
            groups = correct = 0.0
            for st in reports:
                if st.get(f"curriculum/{task}/level") == level:
                    n = st.get(f"curriculum/{task}/groups", 0.0)
                    groups += n
                    correct += n * st.get(f"curriculum/{task}/rate", 0.0)
            rate = correct / groups if groups else 0.0
            new = next_level(level, rate, int(groups), self.top[task], self.low, self.high, self.window)
            if new != level:
                self.levels[task] = new
                made.append({"step": step, "task": task, "from": level, "to": new, "rate": rate,
                             "groups": int(groups)})
        self.changes += made
        return made
