"""Where problems come from: local files and folders, the Hugging Face hub, reasoning-gym; and
sharding among samplers. Row layouts and file types are grpo.data.formats'; prompts and the
prompt stream grpo.data.prompts'.
"""

from __future__ import annotations

import contextlib
import re
from collections.abc import Iterator
from pathlib import Path

from grpo.data import formats, tasks
from grpo.data.formats import Problem
from grpo.model.hub import unreachable_reason

DEFAULT_DATASET = "openai/gsm8k"
RG_DEFAULT_SIZE = 2000
# The test split of a generated task is drawn with a far-off seed so it never replays train.
RG_TEST_SEED_OFFSET = 1_000_003

_FIXES = (
    "Fix: pass --dataset PATH to a data file or a folder holding train.jsonl and test.jsonl "
    "(e.g. ../shared/data/gsm8k), or --dataset rg:gsm_symbolic for generated GSM8K-style problems."
)
# "owner/name" or a bare canonical name; anything else with a slash is treated as a path.
_HUB_ID_RE = re.compile(r"^[A-Za-z0-9][\w.-]*(/[\w.-]+)?$")


class DatasetUnavailable(Exception):
    """The requested problems cannot be loaded; the message is one line naming problem and fix."""


def load_problems(
    spec: str = DEFAULT_DATASET, split: str = "train", limit: int | None = None, seed: int = 0,
    transform: str = "", levels: dict[str, int] | None = None,
) -> list[Problem]:
    """Problems from `spec`: a local data file (the train split), a folder of <split>.jsonl (or
    .json/.parquet/.csv), "rg:<tasks>" (grpo.data.tasks), or a hub dataset id. `transform` is a
    "module:function" applied to every raw row first (see grpo.data.formats.load_transform);
    `levels`: curriculum levels of rg: tasks.

    Order is the source's own (deterministic); `limit` keeps the first N. Shuffling is the caller's.
    """
    if limit is not None and limit < 0:
        raise ValueError(f"limit must be >= 0, got {limit}")
    fn = formats.load_transform(transform)
    if spec.startswith("rg:"):
        problems = _load_reasoning_gym(spec[3:], split, limit, seed, levels)
        return problems if fn is None else _transform_problems(problems, fn, spec)
    file = local_file(spec, split)
    return _load_hub(spec, split, limit, fn) if file is None else _load_file(file, limit, fn)


def local_file(spec: str, split: str = "train") -> Path | None:
    """The local file `spec` names for `split`, or None for a hub id or rg: tasks (generated); a
    local path that cannot serve (no such folder, one file asked for another split) is a
    DatasetUnavailable. Reads no data: the launcher and the sampler ask it before anything starts."""
    if spec.startswith("rg:"):
        return None
    path = Path(spec).expanduser()
    if path.is_dir():
        return formats.split_file(path, split) or path / f"{split}.jsonl"
    if path.is_file():
        if split != "train":
            raise DatasetUnavailable(
                f"Dataset file {spec!r} is one split (train); for {split!r} pass a folder holding "
                f"train.jsonl and {split}.jsonl (or .json/.parquet/.csv)."
            )
        return path
    # "owner/name" is a hub id unless "owner" is a local folder (then a mistyped path is likelier).
    looks_like_path = spec.startswith((".", "/", "~")) or not _HUB_ID_RE.match(spec)
    if looks_like_path or ("/" in spec and Path(spec.split("/")[0]).is_dir()):
        # named by what it was meant to be: a data file by its type (rows.jsonl), else a folder
        what = "file" if path.suffix.lower() in formats.FILE_TYPES else "folder"
        raise DatasetUnavailable(f"Dataset {what} {spec!r} does not exist. {_FIXES}")
    return None


_LAYOUTS = ("'question'/'answer', 'prompt' (text or chat messages), 'instruction'/'response', "
            "or 'input'/'output'; check with: python -m grpo.data validate PATH")


def _load_file(file: Path, limit: int | None, fn: formats.Transform | None) -> list[Problem]:
    if not file.is_file():
        raise DatasetUnavailable(f"Dataset file {str(file)!r} does not exist. {_FIXES}")
    problems: list[Problem] = []
    try:
        for where, row in formats.iter_file_rows(file):
            if limit is not None and len(problems) >= limit:
                break
            if isinstance(row, formats.RowError):
                raise DatasetUnavailable(f"Bad record in {file}, {where}: {row} (rows need {_LAYOUTS}).")
            try:
                problem = formats.row_to_problem(row, fn)
            except formats.RowError as exc:
                raise DatasetUnavailable(f"Bad record in {file}, {where}: {exc} (rows need {_LAYOUTS}).") from exc
            if problem is not None:
                problems.append(problem)
    except formats.RowError as exc:  # unknown file type
        raise DatasetUnavailable(str(exc)) from exc
    except (OSError, UnicodeDecodeError, ImportError) as exc:
        raise DatasetUnavailable(f"Cannot read {file}: {_one_line(exc)}") from exc
    return problems


def _transform_problems(problems: list[Problem], fn: formats.Transform, spec: str) -> list[Problem]:
    """Generated problems through the user transform, as rows of question/answer."""
    out = []
    for i, p in enumerate(problems):
        try:
            problem = formats.row_to_problem({"question": p.question, "answer": p.answer, **p.columns}, fn)
        except formats.RowError as exc:
            raise DatasetUnavailable(f"Bad record from {spec}, problem {i}: {exc}") from exc
        if problem is not None:
            out.append(problem)
    return out


def _load_reasoning_gym(text: str, split: str, limit: int | None, seed: int,
                        levels: dict[str, int] | None = None) -> list[Problem]:
    """Problems of `rg:<text>` (grpo.data.tasks: one task or a mixture, with their settings),
    at curriculum `levels` when given."""
    if split not in ("train", "test"):
        raise DatasetUnavailable(f"'rg:{text}' has splits train and test, not {split!r}.")
    size = RG_DEFAULT_SIZE if limit is None else limit
    if size == 0:
        return []
    split_seed = seed if split == "train" else seed + RG_TEST_SEED_OFFSET
    try:
        specs = tasks.parse_spec(text)
        tasks.check(specs, curriculum=levels is not None)
        dataset = tasks.make_dataset(specs, size, split_seed, levels)
    except tasks.TaskSpecError as exc:
        raise DatasetUnavailable(str(exc)) from None
    except Exception as exc:  # noqa: BLE001 - reasoning_gym's own errors come in several types
        raise DatasetUnavailable(f"reasoning_gym cannot generate rg:{text}: {_one_line(exc)}") from exc
    # The bare final answer is the reference; the task name and entry let the correctness reward
    # use reasoning_gym's own scorer for answers that are not numbers.
    return [Problem(question=str(it["question"]), answer=str(it["answer"]),
                    columns={"rg_task": tasks.task_of(it, specs), "rg_entry": it}) for it in dataset]


@contextlib.contextmanager
def _hub_offline() -> Iterator[None]:
    """Force offline mode for one load so a cached copy is used without any network round trip.

    The env vars are read at import time, so the flags are flipped on the imported modules.
    """
    import datasets
    from huggingface_hub import constants

    saved = (datasets.config.HF_HUB_OFFLINE, constants.HF_HUB_OFFLINE)
    datasets.config.HF_HUB_OFFLINE = constants.HF_HUB_OFFLINE = True
    try:
        yield
    finally:
        datasets.config.HF_HUB_OFFLINE, constants.HF_HUB_OFFLINE = saved


def _load_hub(spec: str, split: str, limit: int | None, fn: formats.Transform | None = None) -> list[Problem]:
    import datasets  # lazy: ~2-3 s import, not needed for local or generated data
    from huggingface_hub import constants

    name = "GSM8K" if spec == DEFAULT_DATASET else f"Dataset {spec!r}"
    config = "main" if spec == DEFAULT_DATASET else None
    dataset = None
    try:
        with _hub_offline():
            dataset = datasets.load_dataset(spec, config, split=split)
    except (ConnectionError, FileNotFoundError):
        pass  # not in the local cache: try the network below
    except Exception as exc:  # noqa: BLE001 - cached but unusable, e.g. an unknown split
        raise DatasetUnavailable(
            f"{name} cannot be loaded from the local cache: {_one_line(exc)}. {_FIXES}"
        ) from exc
    if dataset is None:
        if datasets.config.HF_HUB_OFFLINE or constants.HF_HUB_OFFLINE:
            reason = "offline mode (HF_HUB_OFFLINE) is set"
        else:
            reason = unreachable_reason()   # the same bounded probe as a hub --model's
        if reason is not None:
            raise DatasetUnavailable(
                f"{name} is not reachable: no network for {spec!r} ({reason}) "
                f"and no local copy. {_FIXES}"
            )
        try:
            dataset = datasets.load_dataset(spec, config, split=split)
        except Exception as exc:  # noqa: BLE001 - hub errors come in many types
            raise DatasetUnavailable(
                f"{name} could not be downloaded: {_one_line(exc)}. {_FIXES}"
            ) from exc
    if limit is not None and fn is None:  # a transform may drop rows: limit after it
        dataset = dataset.select(range(min(limit, len(dataset))))
    problems: list[Problem] = []
    for i, row in enumerate(dataset):
        if limit is not None and len(problems) >= limit:
            break
        try:
            problem = formats.row_to_problem(row, fn)
        except formats.RowError as exc:
            raise DatasetUnavailable(f"{name} split {split!r}, row {i}: {exc} (rows need {_LAYOUTS}).") from exc
        if problem is not None:
            problems.append(problem)
    return problems


def _one_line(exc: BaseException) -> str:
    """First line of an exception, so DatasetUnavailable messages stay one line."""
    lines = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {lines[0].rstrip('.')}" if lines else type(exc).__name__


def shard(problems: list[Problem], index: int, count: int) -> list[Problem]:
    """The index-th of `count` disjoint, covering slices: problems[i] for i % count == index."""
    if count < 1 or not 0 <= index < count:
        raise ValueError(f"shard index {index} out of range for count {count}")
    return problems[index::count]
