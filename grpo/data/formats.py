"""Rows as users bring them -> Problems: column layouts, local file types, user transforms, and
the `python -m grpo.data validate PATH` checker; the Problem every source yields.

Accepted row layouts (the first whose prompt column is present wins):
  question / answer        GSM8K; the prompt asks for the final answer after '####' ("gsm8k" style)
  prompt (str or messages) [answer|solution|ground_truth|completion|response|output]: TRL's layout;
                           a list of {"role", "content"} dicts goes through the chat template as is
  instruction [/ input] / response|output     Alpaca style; a non-empty input is appended
  input / output
Rows other than question/answer are "plain": the prompt is used verbatim. The reference answer is
optional except for question/answer rows. Every other column is kept and passed to reward
functions as a keyword argument (TRL's convention), e.g. the `tests` column of code tasks.
Local files: .jsonl, .json (a list of objects, or JSON lines), .parquet, .csv.
"""
from __future__ import annotations

import csv
import json
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from grpo.data.plugins import PluginError, load_callable

__all__ = ["FILE_TYPES", "Problem", "RowError", "iter_file_rows", "load_transform", "row_to_problem", "validate_path"]

FILE_TYPES = (".jsonl", ".json", ".parquet", ".csv")
ANSWER_COLUMNS = ("answer", "solution", "ground_truth", "completion", "response", "output")
ROLES = ("system", "user", "assistant", "tool")
Transform = Callable[[dict], "dict | None"]


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


class RowError(ValueError):
    """One row that cannot become a Problem; the message says why (one line)."""


def load_transform(spec: str) -> Transform | None:
    """The --dataset-transform function: fn(row: dict) -> dict (a row in an accepted layout) or
    None to drop the row. Empty spec: no transform."""
    return load_callable(spec, "--dataset-transform") if spec else None


def _text(row: dict, key: str, required: bool = True) -> str:
    value = row.get(key)
    if value is None and not required:
        return ""
    if key not in row:
        raise RowError(f"missing column {key!r}")
    # Some GSM8K-style sets store the final answer as a number; keep it as text.
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        return str(value)
    if not isinstance(value, str):
        raise RowError(f"column {key!r} is {type(value).__name__}, expected a string")
    return value


def _messages(value: Any) -> list[dict]:
    if not isinstance(value, list) or not value:
        raise RowError("column 'prompt' must be a string or a non-empty list of messages")
    for i, m in enumerate(value):
        if not isinstance(m, dict) or not isinstance(m.get("content"), str) or m.get("role") not in ROLES:
            raise RowError(f"prompt message {i} must be {{'role': one of {list(ROLES)}, 'content': str}}")
    return [{"role": m["role"], "content": m["content"]} for m in value]


def row_to_problem(row: Any, transform: Transform | None = None):
    """The Problem for one raw row (after `transform`), or None when the transform drops it."""
    if transform is not None:
        try:
            row = transform(dict(row) if isinstance(row, dict) else row)
        except Exception as exc:  # noqa: BLE001 - a user function: report it per row
            raise RowError(f"--dataset-transform raised {type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}") from exc
        if row is None:
            return None
    if not isinstance(row, dict):
        raise RowError(f"expected an object (a dict of columns), got {type(row).__name__}")
    if "question" in row:
        used = ("question", "answer")
        problem = Problem(question=_text(row, "question"), answer=_text(row, "answer"))
    elif "prompt" in row:
        answer_key = next((k for k in ANSWER_COLUMNS if k in row), None)
        used = ("prompt",)
        answer = _text(row, answer_key, required=False) if answer_key else ""
        raw = row["prompt"]
        if isinstance(raw, str) and raw.lstrip().startswith("[{"):
            try:  # CSV and some exports store the messages as JSON text
                raw = json.loads(raw)
            except ValueError:
                pass  # plain text that happens to start with "[{"
        if isinstance(raw, str):
            problem = Problem(question=raw, answer=answer, style="plain")
        else:
            messages = _messages(raw)
            question = next((m["content"] for m in reversed(messages) if m["role"] == "user"), "")
            problem = Problem(question=question, answer=answer, messages=messages, style="plain")
    elif "instruction" in row:
        used = ("instruction", "input")
        question = _text(row, "instruction")
        context = _text(row, "input", required=False)
        answer_key = "response" if "response" in row else "output"
        problem = Problem(question=f"{question}\n\n{context}" if context.strip() else question,
                          answer=_text(row, answer_key, required=False), style="plain")
    elif "input" in row:
        used = ("input",)
        problem = Problem(question=_text(row, "input"), answer=_text(row, "output", required=False),
                          style="plain")
    else:
        cols = sorted(row)[:8]
        raise RowError(f"no prompt column among {cols}: need 'question', 'prompt', 'instruction' or 'input'")
    if not problem.question.strip():
        raise RowError("the prompt is empty")
    problem.columns = {k: v for k, v in row.items() if k not in used}
    return problem


def _line_rows(path: Path) -> Iterator[tuple[str, Any]]:
    with path.open(encoding="utf-8") as lines:
        for number, line in enumerate(lines, start=1):
            if not line.strip():
                continue  # tolerate blank lines, e.g. a trailing newline pair
            try:
                yield f"line {number}", json.loads(line)
            except ValueError as exc:
                yield f"line {number}", RowError(f"not valid JSON ({str(exc).splitlines()[0]})")


def iter_file_rows(path: Path) -> Iterator[tuple[str, Any]]:
    """(where, row) for every row of a local file; `row` is a RowError for an unreadable one.

    `where` is "line N" for JSON lines and CSV (the header is line 1), "item N" (from 1) for a
    JSON list, "row N" (from 1) for Parquet.
    """
    suffix = path.suffix.lower()
    if suffix == ".jsonl":
        yield from _line_rows(path)
    elif suffix == ".json":
        text = path.read_text(encoding="utf-8")
        try:
            data = json.loads(text)
        except ValueError:
            yield from _line_rows(path)  # JSON lines saved as .json
            return
        if isinstance(data, dict) and isinstance(data.get("data"), list):
            data = data["data"]
        if not isinstance(data, list):
            yield "item 1", RowError("a .json dataset must hold a list of objects (or be JSON lines)")
            return
        for i, row in enumerate(data, start=1):
            yield f"item {i}", row
    elif suffix == ".csv":
        with path.open(encoding="utf-8", newline="") as handle:
            reader = csv.DictReader(handle)
            for row in reader:
                where = f"line {reader.line_num}"
                if None in row or any(v is None for v in row.values()):
                    yield where, RowError(f"{len(reader.fieldnames or [])} columns in the header, "
                                          "a different number in this row")
                else:
                    yield where, row
    elif suffix == ".parquet":
        import pyarrow.parquet as pq  # here: pyarrow brings numpy, and the launcher imports this module; only a .parquet file needs it

        table = pq.read_table(path)
        for i, row in enumerate(table.to_pylist(), start=1):
            yield f"row {i}", row
    else:
        raise RowError(f"{str(path)!r}: unknown file type {suffix!r}; use one of {', '.join(FILE_TYPES)}")


def split_file(folder: Path, split: str) -> Path | None:
    """The file holding `split` in a dataset folder: <split>.jsonl/.json/.parquet/.csv."""
    return next((folder / f"{split}{ext}" for ext in FILE_TYPES if (folder / f"{split}{ext}").is_file()), None)


def validate_path(path: Path, transform: Transform | None = None, out: Callable[[str], None] = print) -> int:
    """Check every row of a file (or of each split file in a folder); print one line per bad row
    and a summary. Returns the number of bad rows."""
    files = [path] if path.is_file() else [f for f in sorted(path.iterdir()) if f.suffix.lower() in FILE_TYPES]
    if not files:
        raise RowError(f"{str(path)!r} holds no dataset file ({', '.join(FILE_TYPES)})")
    bad_total = 0
    for file in files:
        good = bad = dropped = no_answer = 0
        styles: dict[str, int] = {}
        for where, row in iter_file_rows(file):
            try:
                if isinstance(row, RowError):
                    raise row
                problem = row_to_problem(row, transform)
            except RowError as exc:
                bad += 1
                out(f"{file}: {where}: {exc}")
                continue
            if problem is None:
                dropped += 1
                continue
            good += 1
            no_answer += not problem.answer.strip()
            layout = "messages" if problem.messages else problem.style
            styles[layout] = styles.get(layout, 0) + 1
        kinds = ", ".join(f"{n} {k}" for k, n in sorted(styles.items())) or "none"
        extra = f", {dropped} dropped by the transform" if dropped else ""
        extra += f", {no_answer} without a reference answer (only custom rewards can score them)" if no_answer else ""
        out(f"{file}: {good} good rows ({kinds}), {bad} bad{extra}")
        bad_total += bad
    return bad_total


__all__ += ["split_file", "PluginError"]
