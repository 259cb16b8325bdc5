"""Problem sources (local files and folders, Hugging Face hub, reasoning_gym), sharding, prompts,
and the endless shuffled prompt stream that feeds the samplers. Row layouts and file types are in
grpo/dataset_formats.py.

    python -m grpo.data validate PATH [--transform module:function]
checks a dataset file (or folder) row by row: exit 0 when clean, 1 with the bad lines listed.
"""

from __future__ import annotations

import contextlib
import random
import re
import socket
import sys
import threading
import urllib.parse
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from grpo import dataset_formats as formats

__all__ = [
    "DEFAULT_INSTRUCTION",
    "DatasetUnavailable",
    "Problem",
    "PromptStream",
    "build_prompt",
    "load_problems",
    "problem_prompt",
    "shard",
]

DEFAULT_INSTRUCTION = "\nSolve step by step and give the final answer after '####'."
DEFAULT_DATASET = "openai/gsm8k"
RG_DEFAULT_SIZE = 2000
# The test split of a generated task is drawn with a far-off seed so it never replays train.
RG_TEST_SEED_OFFSET = 1_000_003
# How long the hub reachability probe may take before we call the hub unreachable: the hub
# client itself retries for ~25 s on a machine without network, which is too slow to fail on.
HUB_PROBE_TIMEOUT_S = 3.0

_FIXES = (
    "Fix: pass --dataset PATH to a data file or a folder holding train.jsonl and test.jsonl "
    "(e.g. ../shared/data/gsm8k), or --dataset rg:gsm_symbolic for generated GSM8K-style problems."
)
# "owner/name" or a bare canonical name; anything else with a slash is treated as a path.
_HUB_ID_RE = re.compile(r"^[A-Za-z0-9][\w.-]*(/[\w.-]+)?$")


@dataclass
class Problem:
    """One prompt: the question text and its reference (full solution or bare final answer)."""

    question: str
    answer: str
    messages: list[dict] | None = None
    """The prompt as chat messages, when the row gave a list of {role, content}."""
    columns: dict[str, Any] = field(default_factory=dict)
    """The row's other columns, passed to reward functions as keyword arguments."""
    style: str = "gsm8k"
    """'gsm8k': the prompt asks for '#### <answer>'; 'plain': the row's prompt is used verbatim."""


class DatasetUnavailable(Exception):
    """The requested problems cannot be loaded; the message is one line naming problem and fix."""


def load_problems(
    spec: str = DEFAULT_DATASET, split: str = "train", limit: int | None = None, seed: int = 0,
    transform: str = "",
) -> list[Problem]:
    """Problems from `spec`: a local data file (the train split), a folder of <split>.jsonl (or
    .json/.parquet/.csv), "rg:<task>", or a hub dataset id. `transform` is a "module:function"
    applied to every raw row first (see grpo.dataset_formats.load_transform).

    Order is the source's own (deterministic); `limit` keeps the first N. Shuffling is the caller's.
    """
    if limit is not None and limit < 0:
        raise ValueError(f"limit must be >= 0, got {limit}")
    fn = formats.load_transform(transform)
    if spec.startswith("rg:"):
        problems = _load_reasoning_gym(spec[3:], split, limit, seed)
        return problems if fn is None else _transform_problems(problems, fn, spec)
    path = Path(spec).expanduser()
    if path.is_dir():
        file = formats.split_file(path, split) or path / f"{split}.jsonl"
        return _load_file(file, limit, fn)
    if path.is_file():
        if split != "train":
            raise DatasetUnavailable(
                f"Dataset file {spec!r} is one split (train); for {split!r} pass a folder holding "
                f"train.jsonl and {split}.jsonl (or .json/.parquet/.csv)."
            )
        return _load_file(path, limit, fn)
    # "owner/name" is a hub id unless "owner" is a local folder (then a mistyped path is likelier).
    looks_like_path = spec.startswith((".", "/", "~")) or not _HUB_ID_RE.match(spec)
    if looks_like_path or ("/" in spec and Path(spec.split("/")[0]).is_dir()):
        raise DatasetUnavailable(f"Dataset folder {spec!r} does not exist. {_FIXES}")
    return _load_hub(spec, split, limit, fn)


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


def _load_reasoning_gym(task: str, split: str, limit: int | None, seed: int) -> list[Problem]:
    if split not in ("train", "test"):
        raise DatasetUnavailable(f"'rg:{task}' has splits train and test, not {split!r}.")
    size = RG_DEFAULT_SIZE if limit is None else limit
    if size == 0:
        return []
    import reasoning_gym  # lazy: the import alone takes seconds

    split_seed = seed if split == "train" else seed + RG_TEST_SEED_OFFSET
    try:
        dataset = reasoning_gym.create_dataset(task, size=size, seed=split_seed)
    except Exception as exc:  # noqa: BLE001 - unknown tasks raise ValueError, bad configs others
        raise DatasetUnavailable(
            f"reasoning_gym cannot generate task {task!r}: {_one_line(exc)}. Valid task names: "
            "python -c 'import reasoning_gym.factory as f; print(sorted(f.DATASETS))'"
        ) from exc
    # The bare final answer is the reference; the task name and entry let the correctness reward
    # use reasoning_gym's own scorer for answers that are not numbers.
    return [Problem(question=str(it["question"]), answer=str(it["answer"]),
                    columns={"rg_task": task, "rg_entry": it}) for it in dataset]


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


def _hub_unreachable_reason(timeout: float = HUB_PROBE_TIMEOUT_S) -> str | None:
    """Why the hub (or the proxy in front of it) cannot be reached, or None if a TCP connect works.

    Runs in a daemon thread because socket timeouts do not bound DNS resolution.
    """
    from huggingface_hub import constants

    url = urllib.parse.urlsplit(constants.ENDPOINT)
    host = url.hostname or "huggingface.co"
    port = url.port or (443 if url.scheme == "https" else 80)
    proxy = urllib.request.getproxies().get(url.scheme)
    if proxy and not urllib.request.proxy_bypass(host):
        proxy_url = urllib.parse.urlsplit(proxy if "://" in proxy else f"http://{proxy}")
        host, port = proxy_url.hostname or host, proxy_url.port or 80
    outcome: list[str | None] = []

    def probe() -> None:
        try:
            socket.create_connection((host, port), timeout=timeout).close()
            outcome.append(None)
        except OSError as exc:
            outcome.append(f"{host}:{port}: {exc}")

    worker = threading.Thread(target=probe, name="hub-probe", daemon=True)
    worker.start()
    worker.join(timeout)
    return outcome[0] if outcome else f"{host}:{port}: no answer in {timeout:.0f} s"


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
            reason = _hub_unreachable_reason()
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


def build_prompt(tokenizer: Any, question: str, system_prompt: str | None = None,
                 instruction: str = DEFAULT_INSTRUCTION) -> str:
    """The model input for one question: the tokenizer's chat template with the assistant turn
    opened, or a plain "Question/Answer" layout for base models that have no template."""
    content = question + instruction
    if tokenizer is None or not getattr(tokenizer, "chat_template", None):
        head = f"{system_prompt}\n\n" if system_prompt else ""
        return f"{head}Question: {content}\nAnswer:"
    messages = [{"role": "system", "content": system_prompt}] if system_prompt else []
    messages.append({"role": "user", "content": content})
    prompt = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
    if not isinstance(prompt, str):
        raise TypeError(f"chat template returned {type(prompt).__name__}, expected str")
    return prompt


def problem_prompt(tokenizer: Any, problem: Problem, system_prompt: str | None = None) -> str:
    """The model input for a Problem: chat messages as given, a 'gsm8k'-style question with the
    '####' instruction, a 'plain' one verbatim."""
    if problem.messages is None:
        instruction = DEFAULT_INSTRUCTION if problem.style == "gsm8k" else ""
        return build_prompt(tokenizer, problem.question, system_prompt, instruction)
    messages = list(problem.messages)
    if system_prompt and messages[0]["role"] != "system":
        messages.insert(0, {"role": "system", "content": system_prompt})
    if tokenizer is None or not getattr(tokenizer, "chat_template", None):
        return "".join(f"{m['role'].capitalize()}: {m['content']}\n" for m in messages) + "Assistant:"
    prompt = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
    if not isinstance(prompt, str):
        raise TypeError(f"chat template returned {type(prompt).__name__}, expected str")
    return prompt


class PromptStream:
    """Endless, seeded, reshuffled-every-epoch iterator over a list of Problems.

    The order of epoch e depends only on (seed, e), so (epoch, index) is the whole state: restoring
    `position` after a restart replays exactly the same stream.
    """

    def __init__(self, problems: list[Problem], seed: int) -> None:
        if not problems:
            raise ValueError("PromptStream needs at least one problem")
        self._problems = list(problems)
        self._seed = seed
        self._epoch = 0
        self._index = 0
        self._order = self._permutation(0)

    def _permutation(self, epoch: int) -> list[int]:
        # A string seed hashes the same in every process (unlike hash() of a tuple).
        order = list(range(len(self._problems)))
        random.Random(f"prompt-stream:{self._seed}:{epoch}").shuffle(order)
        return order

    @property
    def position(self) -> tuple[int, int]:
        """(epoch, index within that epoch's order): what a checkpoint must save."""
        return self._epoch, self._index

    @position.setter
    def position(self, value: tuple[int, int]) -> None:
        epoch, index = value
        if epoch < 0 or not 0 <= index <= len(self._problems):
            raise ValueError(f"position {value} out of range for {len(self._problems)} problems")
        self._epoch, self._index = epoch, index
        self._order = self._permutation(epoch)

    def __len__(self) -> int:
        return len(self._problems)

    def __iter__(self) -> Iterator[Problem]:
        return self

    def __next__(self) -> Problem:
        if self._index >= len(self._order):
            self._epoch += 1
            self._index = 0
            self._order = self._permutation(self._epoch)
        problem = self._problems[self._order[self._index]]
        self._index += 1
        return problem

    def next_batch(self, n: int) -> list[Problem]:
        """The next n problems; a batch may straddle two epochs."""
        if n < 0:
            raise ValueError(f"batch size must be >= 0, got {n}")
        return [next(self) for _ in range(n)]


def main(argv: list[str] | None = None) -> int:
    """`python -m grpo.data validate PATH [--transform module:function]`."""
    import argparse

    parser = argparse.ArgumentParser(prog="python -m grpo.data", description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    check = sub.add_parser("validate", help="check a dataset file or folder row by row")
    check.add_argument("path", help="a .jsonl/.json/.parquet/.csv file, or a folder of them")
    check.add_argument("--transform", default="", help="module:function applied to each row first")
    args = parser.parse_args(argv)
    path = Path(args.path).expanduser()
    try:
        if not path.exists():
            raise DatasetUnavailable(f"{args.path!r} does not exist; pass a dataset file or folder")
        bad = formats.validate_path(path, formats.load_transform(args.transform))
    except (DatasetUnavailable, formats.RowError, formats.PluginError) as exc:
        print(f"python -m grpo.data: error: {exc}", file=sys.stderr)
        return 2
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
