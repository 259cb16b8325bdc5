"""Where problems come from: local files and folders, the Hugging Face hub, reasoning-gym; and
sharding among samplers. Row layouts and file types are grpo.data.formats'; prompts and the
prompt stream grpo.data.prompts'.
"""

from __future__ import annotations

import contextlib
import json
import logging
import math
import re
from collections.abc import Iterable, Iterator
from pathlib import Path

from huggingface_hub import constants as hub_constants   # torch-free and light (no datasets, no numpy)

from grpo.data import formats, tasks
from grpo.data.formats import Problem
from grpo.model.hub import unreachable_reason

log = logging.getLogger(__name__)

DEFAULT_DATASET = "openai/gsm8k"
RG_DEFAULT_SIZE = 2000
# The test split of a generated task is drawn with a far-off seed so it never replays train.
RG_TEST_SEED_OFFSET = 1_000_003

_FIXES = (
    "Fix: pass --dataset PATH to a data file or a folder holding train.jsonl and test.jsonl "
    "(e.g. ../shared/data/gsm8k), or --dataset rg:gsm_symbolic for generated GSM8K-style problems."
)
# A data set given as one file has no test split of its own, so a fixed share of its rows is held
# out for evaluation, and training never sees them: the rows `datasets` users would get from
# Dataset.train_test_split(test_size=0.1, seed=42) (held_out_rows computes the same rows without
# importing datasets; a test checks it against datasets itself). The rule depends on the file alone
# (not on --seed, --eval-size or --dataset-limit), so every process and every later
# `python -m grpo.evaluate` on the same file agrees on which rows are held out.
HELD_OUT_FRACTION = 0.1
HELD_OUT_SEED = 42
# A file of fewer rows holds none out (one or two held-out rows measure nothing, and training would
# lose rows it needs): all of it trains, and evaluation asks for --eval-dataset.
HELD_OUT_MIN_ROWS = 10
_EVAL_ELSEWHERE = ("evaluate on another set: --eval-dataset PATH in a training run, "
                   "--dataset PATH for python -m grpo.evaluate")

# "owner/name" or a bare canonical name; anything else with a slash is treated as a path.
_HUB_ID_RE = re.compile(r"^[A-Za-z0-9][\w.-]*(/[\w.-]+)?$")


class DatasetUnavailable(Exception):
    """The requested problems cannot be loaded; the message is one line naming problem and fix."""


def load_problems(
    spec: str = DEFAULT_DATASET, split: str = "train", limit: int | None = None, seed: int = 0,
    transform: str = "", levels: dict[str, int] | None = None,
) -> list[Problem]:
    """Problems from `spec`: a local data file (split "train": its rows but the held-out ones; "test":
    the held-out ones, see held_out_rows), a folder of <split>.jsonl (or
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
    if file is None:
        return _load_hub(spec, split, limit, fn)
    one_file = Path(spec).expanduser().is_file()   # not a folder's split file: its rows are carved
    return _load_file(file, limit, fn, part=split if one_file else None)


def held_out_rows(n: int) -> list[int]:
    """The positions (from 0, ascending) of the rows an n-row data file holds out for evaluation:
    those of `Dataset.train_test_split(test_size=HELD_OUT_FRACTION, seed=HELD_OUT_SEED)["test"]`
    (numpy's default_rng(seed) permutes the positions; the first ceil(fraction * n) are the test
    rows). None (an empty list) for a file of fewer than HELD_OUT_MIN_ROWS rows."""
    if n < HELD_OUT_MIN_ROWS:
        return []
    import numpy as np   # here: this module is the launcher's (which loads no numpy); only a file's split needs it

    n_test = math.ceil(HELD_OUT_FRACTION * n)
    return sorted(np.random.default_rng(HELD_OUT_SEED).permutation(n)[:n_test].tolist())


def local_file(spec: str, split: str = "train") -> Path | None:
    """The local file `spec` names for `split`, or None for a hub id or rg: tasks (generated); a
    local path that cannot serve (no such folder, one file asked for another split) is a
    DatasetUnavailable. Reads no data: the launcher and the sampler ask it before anything starts."""
    if spec.startswith("rg:"):
        return None
    path = Path(spec).expanduser()
    if path.is_dir():
        found = formats.split_file(path, split)
        if found is None and split != "train":
            raise DatasetUnavailable(
                f"Dataset folder {spec!r} has no {split} split ({split}.jsonl/.json/.parquet/.csv); "
                f"add one, or {_EVAL_ELSEWHERE}."
            )
        return found or path / f"{split}.jsonl"
    if path.is_file():
        if split not in ("train", "test"):   # a file is carved into these two only (held_out_rows)
            raise DatasetUnavailable(
                f"Dataset file {spec!r} has a train split and a held-out test split, not {split!r}; "
                f"pass a folder holding {split}.jsonl (or .json/.parquet/.csv), or {_EVAL_ELSEWHERE}."
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


def _load_file(file: Path, limit: int | None, fn: formats.Transform | None,
               part: str | None = None) -> list[Problem]:
    """`part`: "train" or "test" of a data file given alone (_carve), None for every row."""
    if not file.is_file():
        raise DatasetUnavailable(f"Dataset file {str(file)!r} does not exist. {_FIXES}")
    try:
        rows = formats.iter_file_rows(file)
        if part is not None:
            rows = _carve(file, list(rows), part)
        # inside the try: the file is read as the rows are taken
        problems = _problems(rows, fn, limit, f"Bad record in {file}, ", f" (rows need {_LAYOUTS}).")
    except formats.RowError as exc:  # unknown file type
        raise DatasetUnavailable(str(exc)) from exc
    except (OSError, UnicodeDecodeError, ImportError) as exc:
        raise DatasetUnavailable(f"Cannot read {file}: {_one_line(exc)}") from exc
    return problems


def _carve(file: Path, rows: list[tuple[str, object]], part: str) -> list[tuple[str, object]]:
    """The rows of a data file that `part` ("train" or "test") takes, in the file's order; says so in one
    line. Positions are of the raw rows, before --dataset-transform and --dataset-limit, so a run
    with a transform and an evaluation without one hold out the same rows. Training also leaves out
    any row equal (in every column) to a held-out one: a duplicate would be a held-out row trained on."""
    held = held_out_rows(len(rows))
    rule = f"datasets' train_test_split(test_size={HELD_OUT_FRACTION}, seed={HELD_OUT_SEED})"
    if part == "test":
        if not held:
            raise DatasetUnavailable(
                f"Dataset file {str(file)!r} has {len(rows)} rows, too few to hold out evaluation rows "
                f"(a file of {HELD_OUT_MIN_ROWS} or more holds out {HELD_OUT_FRACTION:.0%}); {_EVAL_ELSEWHERE}."
            )
        log.info("%s is one file: evaluating on its %d held-out rows of %d (%s), which training never uses",
                 file, len(held), len(rows), rule)
        return [rows[i] for i in held]
    if not held:
        log.info("%s is one file of %d rows (fewer than %d): every row trains, none is held out for evaluation",
                 file, len(rows), HELD_OUT_MIN_ROWS)
        return rows
    taken = set(held)
    keys = {_row_key(rows[i][1]) for i in held} - {None}
    kept = [r for i, r in enumerate(rows) if i not in taken and _row_key(r[1]) not in keys]
    dup = len(rows) - len(held) - len(kept)
    log.info("%s is one file: training on %d of its %d rows; %d are held out for evaluation (%s)%s",
             file, len(kept), len(rows), len(held), rule,
             f", and {dup} duplicate(s) of held-out rows are left out too" if dup else "")
    return kept


def _row_key(row: object) -> str | None:
    """A row's content, for telling duplicates apart (None for an unreadable one)."""
    if isinstance(row, formats.RowError):
        return None
    return json.dumps(row, sort_keys=True, default=str)


def _transform_problems(problems: list[Problem], fn: formats.Transform, spec: str) -> list[Problem]:
    """Generated problems through the user transform, as rows of question/answer."""
    rows = ((f"problem {i}", {"question": p.question, "answer": p.answer, **p.columns})
            for i, p in enumerate(problems))
    return _problems(rows, fn, None, f"Bad record from {spec}, ")   # generated rows: no layout to hint at


def _problems(rows: Iterable[tuple[str, object]], fn: formats.Transform | None, limit: int | None, at: str,
              hint: str = "") -> list[Problem]:
    """The one row loop of every source: each (where, row) through the transform to a Problem (a row
    the transform drops is skipped), the first `limit` kept. A row that cannot be read or has no
    known layout is a DatasetUnavailable of one line: `at` + where + the reason + `hint`."""
    problems: list[Problem] = []
    for where, row in rows:
        if limit is not None and len(problems) >= limit:
            break
        if isinstance(row, formats.RowError):
            raise DatasetUnavailable(f"{at}{where}: {row}{hint}")
        try:
            problem = formats.row_to_problem(row, fn)
        except formats.RowError as exc:
            raise DatasetUnavailable(f"{at}{where}: {exc}{hint}") from exc
        if problem is not None:
            problems.append(problem)
    return problems


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
def _hub_offline(datasets_config) -> Iterator[None]:
    """Force offline mode for one load so a cached copy is used without any network round trip.

    The env vars are read at import time, so the flags are flipped on the imported modules
    (datasets' config, which _load_hub imports, and huggingface_hub's constants).
    """
    saved = (datasets_config.HF_HUB_OFFLINE, hub_constants.HF_HUB_OFFLINE)
    datasets_config.HF_HUB_OFFLINE = hub_constants.HF_HUB_OFFLINE = True
    try:
        yield
    finally:
        datasets_config.HF_HUB_OFFLINE, hub_constants.HF_HUB_OFFLINE = saved


def _load_hub(spec: str, split: str, limit: int | None, fn: formats.Transform | None = None) -> list[Problem]:
    import datasets  # here: ~1.5-3 s to import, and the launcher's path; only a hub data set needs it

    name = "GSM8K" if spec == DEFAULT_DATASET else f"Dataset {spec!r}"
    config = "main" if spec == DEFAULT_DATASET else None
    dataset = None
    try:
        with _hub_offline(datasets.config):
            dataset = datasets.load_dataset(spec, config, split=split)
    except (ConnectionError, FileNotFoundError):
        pass  # not in the local cache: try the network below
    except Exception as exc:  # noqa: BLE001 - cached but unusable, e.g. an unknown split
        raise DatasetUnavailable(
            f"{name} cannot be loaded from the local cache: {_one_line(exc)}. {_FIXES}"
        ) from exc
    if dataset is None:
        if datasets.config.HF_HUB_OFFLINE or hub_constants.HF_HUB_OFFLINE:
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
    rows = ((f"row {i}", row) for i, row in enumerate(dataset))
    return _problems(rows, fn, limit, f"{name} split {split!r}, ", f" (rows need {_LAYOUTS}).")


def _one_line(exc: BaseException) -> str:
    """First line of an exception, so DatasetUnavailable messages stay one line."""
    lines = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {lines[0].rstrip('.')}" if lines else type(exc).__name__


def shard(problems: list[Problem], index: int, count: int) -> list[Problem]:
    """The index-th of `count` disjoint, covering slices: problems[i] for i % count == index."""
    if count < 1 or not 0 <= index < count:
        raise ValueError(f"shard index {index} out of range for count {count}")
    return problems[index::count]
