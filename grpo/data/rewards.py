"""Reward functions chosen on the command line, combined with weights.

    --reward correctness,format=0.2,my_rewards:brevity=0.5     (or --reward-weights 1,0.2,0.5)

Every function follows TRL's GRPOTrainer convention:
    fn(prompts=[...], completions=[...], completion_ids=[...], **columns) -> list[float | None]
`prompts` holds each row's prompt (a string, or its list of chat messages), `completions` the
generated text (for a chat prompt, [{"role": "assistant", "content": text}] as in TRL),
`completion_ids` the generated token ids (EOS included when the model stopped), and every other
dataset column comes as a keyword list, e.g. `answer=[...]`, `tests=[...]`. Accept **kwargs.
None means "does not apply to this sample": it adds nothing to the total (TRL's nansum).
The total reward is sum(weight * value); Completion.reward_info carries each part by name.

Built-ins (short names):
  correctness  1.0 when the final number equals the reference (GSM8K, math-verify), else 0.0; for
               rg: answers that are not numbers, the task's own score_answer on the text after
               '####'. Also fills reward_info 'correct' and 'has_answer', which the learner's
               accuracy, the curriculum and held-out evaluation (score_correctness) read.
  format       1.0 when the answer has the expected form, else 0.0. The form is per dataset
               (--format-style auto): question/answer data and rg: tasks ask for GSM8K's
               '#### <number>' on the last line; other layouts for '<think>...</think>' followed by
               a non-empty answer.
  overlong     DAPO's soft overlong punishment: 0 up to max_new_tokens - overlong_buffer tokens, then
               linear down to -1 at max_new_tokens (length counts the EOS).
  code         fraction of the row's `tests` passed by the completion's ```python block, run in a
               sandbox (grpo/data/sandbox.py).
"""
from __future__ import annotations

import functools
import math
import numbers
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from grpo.config.cli import did_you_mean
from grpo.data.bounded import run_bounded
from grpo.data.faults import RewardFaults, first_line, kind_of
from grpo.data.gsm8k import RewardResult, extract_gsm8k_answer, gsm8k_correct
from grpo.data.plugins import PluginError, load_callable
from grpo.data.sandbox import SandboxLimits, code_reward
from grpo.data.tasks import answer_scorer

__all__ = ["BUILTINS", "RewardBroken", "RewardError", "RewardSet", "correctness_reward", "format_reward",
           "overlong_reward", "score_correctness"]


class RewardError(ValueError):
    """A reward choice or reward function that cannot be used; one line naming it and the fix."""


class RewardBroken(RewardError):
    """A reward failed on most of its recent completions (grpo.data.faults): the run stops."""


# reasoning-gym's scorers parse answers with sympy, which can compute for ever on a short one
# ("9**9**9**9"): each runs in a forked child (grpo.data.bounded) with this many seconds per completion.
RG_SCORE_LIMIT_S = 10.0
# reasoning-gym judges the line after the last '####' up to this many characters; a longer answer
# scores 0 without a call (no task's answer comes near it, and sympy's parse time grows with it).
RG_MAX_ANSWER_CHARS = 10_000


def _text(completion: Any) -> str:
    if isinstance(completion, list):  # chat style: [{"role": "assistant", "content": ...}]
        return str(completion[-1].get("content", "")) if completion else ""
    return str(completion)


_NUMBER = re.compile(r"\s*-?\$?\d[\d,]*(?:\.\d+)?\s*")


@functools.lru_cache(maxsize=None)
def _rg_scorer(task: str) -> Callable[[str | None, dict], float]:
    return answer_scorer(task)   # (reasoning_gym, imported on first use: grpo.data.tasks)


def _marked_answer(text: str) -> str | None:
    """The rest of the line after the last '####', for answers that are not numbers."""
    at = text.rfind("####")
    if at < 0:
        return None
    line = text[at + 4:].strip().split("\n", 1)[0].strip()
    return line or None


def _rg_judged(answer: str, task: Any, entry: Any) -> bool:
    """Whether reasoning-gym's own scorer judges this row: a reasoning-gym row (rg_task/rg_entry
    columns) whose reference answer is not a number; numbers go by the GSM8K rules."""
    return bool(task) and entry is not None and not _NUMBER.fullmatch(answer)


def correctness_reward(prompts: list, completions: list, answer: list[str], errors: list | None = None,
                       **kwargs: Any) -> list[float]:
    """1.0 when the completion's final answer equals the reference answer (GSM8K rules). For
    reasoning-gym rows (rg_task/rg_entry columns) whose answer is not a number, the task's own
    score_answer judges the text after '####' (in [0, 1]; some tasks give partial credit), each
    within RG_SCORE_LIMIT_S. A completion the scorer fails on (raises, or passes the limit) scores
    0.0; with `errors` (a list of len(completions), as RewardSet passes it) its exception goes there."""
    tasks = kwargs.get("rg_task") or [None] * len(completions)
    entries = kwargs.get("rg_entry") or [None] * len(completions)
    out: list[float] = []
    rg_calls, rg_at = [], []
    for i, (c, a, task, entry) in enumerate(zip(completions, answer, tasks, entries)):
        text = _text(c)
        if _rg_judged(a, task, entry):
            marked = _marked_answer(text)
            if marked is not None and len(marked) > RG_MAX_ANSWER_CHARS:
                out.append(0.0)
                continue
            scorer = _rg_scorer(task)   # here: the child then inherits reasoning-gym's import
            rg_calls.append(functools.partial(scorer, marked, entry))
            rg_at.append(i)
            out.append(0.0)   # (replaced below)
        else:
            out.append(float(gsm8k_correct(text, a)))
    for i, value in zip(rg_at, run_bounded(rg_calls, RG_SCORE_LIMIT_S)):
        if isinstance(value, BaseException):
            if errors is not None:
                errors[i] = value   # RewardSet.score counts it: that completion alone is lost
        else:
            out[i] = value
    return out


# '#### <number>' on the text's last line that is not blank, with no digit after the number. Matched
# against that line alone: over the whole text, a trailing part that both [^\n\d]* and \s* can take
# (a long run of spaces before a last word) made the search quadratic, minutes on 100,000 characters.
_GSM8K_FORM = re.compile(r"####[ \t]*[-\u2212]?\$?[ \t]?\d[\d,]*(?:\.\d+)?[^\d]*\Z")


def _gsm8k_form(text: str) -> bool:
    """Whether the text ends with a '#### <number>' line (units after the number allowed)."""
    body = text.rstrip()
    return _GSM8K_FORM.search(body, body.rfind("\n") + 1) is not None


_THINK_FORM = re.compile(r"\A\s*<think>(?:(?!<think>|</think>).)+</think>\s*\S.*\Z", re.DOTALL)
_THINK_AGAIN = re.compile(r"</?think>")


def format_reward(prompts: list, completions: list, style: Sequence[str] | None = None,
                  **kwargs: Any) -> list[float]:
    """1.0 for the expected answer form: style 'gsm8k' wants the text to end with a
    '#### <number>' line (units after the number allowed); 'think' wants '<think>...</think>' first,
    then a non-empty answer without further think tags."""
    out = []
    for i, c in enumerate(completions):
        text = _text(c)
        if (style[i] if style else "gsm8k") == "gsm8k":
            out.append(1.0 if _gsm8k_form(text) else 0.0)
        else:
            m = _THINK_FORM.match(text)
            after = text[text.find("</think>") + len("</think>"):] if m else ""
            out.append(1.0 if m and not _THINK_AGAIN.search(after) else 0.0)
    return out


def overlong_reward(prompts: list, completions: list, completion_ids: list[Sequence[int]],
                    max_completion_length: int = 256, overlong_buffer: int = 64,
                    **kwargs: Any) -> list[float]:
    """DAPO soft overlong punishment (Yu et al. 2025, eq. 13), in [-1, 0]."""
    safe = max_completion_length - overlong_buffer
    out = []
    for ids in completion_ids:
        n = len(ids)
        out.append(0.0 if n <= safe else -1.0 if n > max_completion_length
                   else (safe - n) / overlong_buffer)
    return out


BUILTINS: dict[str, Callable[..., list]] = {
    "correctness": correctness_reward, "format": format_reward, "overlong": overlong_reward,
    "code": code_reward,
}


# Argument names the call itself uses: a dataset column of that name is not passed (as in TRL).
_RESERVED = frozenset({"prompts", "completions", "completion_ids"})


@dataclass
class _Part:
    name: str
    fn: Callable[..., list]
    weight: float
    builtin: str | None  # the built-in's short name, None for user functions


def parse_reward_spec(spec: str, weights: str = "") -> list[tuple[str, float | None]]:
    """[(name or module:function, weight or None)] from --reward and --reward-weights."""
    items = [s.strip() for s in spec.split(",") if s.strip()]
    if not items:
        raise RewardError("--reward is empty; name at least one reward, e.g. --reward correctness")
    parsed: list[tuple[str, float | None]] = []
    for item in items:
        target, eq, w = item.rpartition("=")
        if not eq:
            target, w = item, ""
        parsed.append((target.strip(), _weight(w, item) if eq else None))
    if weights.strip():
        values = [w.strip() for w in weights.split(",")]
        if len(values) != len(parsed):
            raise RewardError(f"--reward-weights has {len(values)} values for {len(parsed)} rewards; "
                              "give one weight per --reward entry")
        if any(w is not None for _, w in parsed):
            raise RewardError("weights given both inline (--reward name=W) and in --reward-weights; use one")
        parsed = [(t, _weight(v, v)) for (t, _), v in zip(parsed, values)]
    return parsed


def _weight(text: str, item: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise RewardError(f"--reward: weight {text!r} in {item!r} is not a number") from None
    if not math.isfinite(value):
        raise RewardError(f"--reward: weight in {item!r} must be finite")
    return value


class RewardSet:
    """The configured reward functions: scores completions, checks what user functions return."""

    def __init__(self, spec: str = "correctness", weights: str = "", *, max_new_tokens: int = 256,
                 overlong_buffer: int = 64, format_style: str = "auto",
                 code_limits: SandboxLimits | None = None) -> None:
        if format_style not in ("auto", "gsm8k", "think"):
            raise RewardError(f"--format-style must be auto, gsm8k or think, not {format_style!r}")
        self.format_style = format_style
        self.parts: list[_Part] = []
        self.faults = RewardFaults()   # the completions each reward failed on, and whether it is broken
        for target, weight in parse_reward_spec(spec, weights):
            if target in BUILTINS:
                name, fn, builtin = target, BUILTINS[target], target
            elif ":" in target:
                try:
                    fn = load_callable(target, "--reward")
                except PluginError as exc:
                    raise RewardError(str(exc)) from exc
                name, builtin = target.rpartition(":")[2].split(".")[-1], None
            else:
                hint = did_you_mean(target, BUILTINS)   # a misspelt built-in: its name, first
                raise RewardError(f"--reward: unknown reward {target!r}{hint} (the built-ins are "
                                  f"{', '.join(BUILTINS)}; or give module:function)")
            taken = {p.name for p in self.parts}
            base, k = name, 2
            while name in taken:
                name, k = f"{base}_{k}", k + 1
            self.parts.append(_Part(name, fn, 1.0 if weight is None else weight, builtin))
        if "overlong" in self.builtins and not 0 < overlong_buffer <= max_new_tokens:
            raise RewardError(f"--overlong-buffer must be in 1..--max-new-tokens ({max_new_tokens}) for "
                              f"the overlong reward, got {overlong_buffer}")
        self._internal = {
            "overlong": {"max_completion_length": max_new_tokens, "overlong_buffer": overlong_buffer},
            "code": {"limits": code_limits or SandboxLimits()},
        }

    @property
    def builtins(self) -> set[str]:
        return {p.builtin for p in self.parts if p.builtin}

    @property
    def names(self) -> list[str]:
        return [p.name for p in self.parts]

    def _style(self, problem_style: str) -> str:
        if self.format_style != "auto":
            return self.format_style
        return "gsm8k" if problem_style == "gsm8k" else "think"

    def score(self, problems: Sequence[Any], texts: Sequence[str],
              completion_ids: Sequence[Sequence[int]], strict: bool = False) -> list[RewardResult]:
        """One RewardResult per completion; problems[i] is the Problem completion i answers.

        A reward that fails on a completion (raises, returns a value that is not a finite number)
        costs that completion alone: a batch call that raises is made again one completion at a
        time, and each completion a reward failed on gets the reward's failure value (0.0, or the
        function's `failure_value` attribute; None leaves it out), counted in `faults`. RewardBroken
        when a reward failed on most of its recent completions (grpo.data.faults). `strict` (the
        start-up probe): the first failure raises RewardError instead."""
        n = len(texts)
        if not len(problems) == len(completion_ids) == n:
            raise ValueError(f"{len(problems)} problems, {len(texts)} texts, {len(completion_ids)} id lists")
        chat = [p.messages is not None for p in problems]
        prompts = [p.messages if c else p.question for p, c in zip(problems, chat)]
        completions = [[{"role": "assistant", "content": t}] if c else t for t, c in zip(texts, chat)]
        columns: dict[str, list] = {}
        for i, p in enumerate(problems):
            for key, value in p.columns.items():
                if key not in _RESERVED:
                    columns.setdefault(key, [None] * n)[i] = value
        columns["answer"] = [p.answer for p in problems]
        columns["completion_ids"] = [list(ids) for ids in completion_ids]
        results = [RewardResult(0.0, {}) for _ in range(n)]
        for part in self.parts:
            rows = dict(columns)   # one value per completion: what a call on one completion takes a slice of
            rows["prompts"], rows["completions"] = prompts, completions
            if part.builtin == "format":
                rows["style"] = [self._style(p.style) for p in problems]
            values, errors = self._values(part, rows, self._internal.get(part.builtin or "", {}), n, strict)
            if not strict:   # (the probe's made-up completions are not the run's)
                self.faults.record(part.name, errors, list(texts))
            for i, (value, exc) in enumerate(zip(values, errors)):
                if exc is not None:
                    value = getattr(part.fn, "failure_value", 0.0) if part.builtin is None else 0.0
                if value is None:
                    continue
                results[i].reward += part.weight * value
                results[i].info[part.name] = value
        if "correctness" in self.builtins:  # the learner's accuracy and the eval read these
            name = next(p.name for p in self.parts if p.builtin == "correctness")
            for r, t, p in zip(results, texts, problems):
                r.info["correct"] = float(r.info[name] == 1.0)
                r.info["has_answer"] = float(final_answer(p, t) is not None)
        if (line := self.faults.broken()) is not None:
            raise RewardBroken(line)
        return results

    def _values(self, part: _Part, rows: dict[str, list], internal: dict, n: int,
                strict: bool) -> tuple[list[float | None], list[BaseException | None]]:
        """One reward's value and failure (None: none) for each completion: the whole batch in one
        call, and where that call raises, one call per completion."""
        try:
            return self._call(part, rows, internal, n, strict)
        except Exception as exc:  # noqa: BLE001 - whatever a reward raises costs its completions, not the run
            if strict:
                if isinstance(exc, RewardError):
                    raise
                raise RewardError(f"reward {part.name!r} raised {type(exc).__name__}: {first_line(exc)}") from exc
            if n == 1:
                return [None], [exc]
        values: list[float | None] = []
        errors: list[BaseException | None] = []
        for i in range(n):
            try:
                (v,), (e,) = self._call(part, {k: [col[i]] for k, col in rows.items()}, internal, 1, False)
            except Exception as exc:  # noqa: BLE001
                v, e = None, exc
            values.append(v)
            errors.append(e)
        return values, errors

    def _call(self, part: _Part, rows: dict[str, list], internal: dict, n: int,
              strict: bool) -> tuple[list[float | None], list[BaseException | None]]:
        errors: list[BaseException | None] = [None] * n
        extra = {"errors": errors} if part.builtin == "correctness" else {}   # its failures, one by one
        values = part.fn(**rows, **internal, **extra)
        checked = self._check(part, values, n, errors, strict)
        if strict and (e := next((e for e in errors if e is not None), None)) is not None:
            raise RewardError(f"reward {part.name!r} raised {kind_of(e)}: {first_line(e)}")
        return checked, errors

    @staticmethod
    def _check(part: _Part, values: Any, n: int, errors: list[BaseException | None],
               strict: bool) -> list[float | None]:
        """The values as floats (None kept); a value that is not a finite number is that
        completion's failure in `errors` (with `strict`, a RewardError); a result that is not n
        values is the call's failure (RewardError)."""
        if not isinstance(values, (list, tuple)) and not hasattr(values, "tolist"):
            raise RewardError(f"reward {part.name!r} returned {type(values).__name__}, expected a list "
                              f"of {n} floats (one per completion)")
        values = values.tolist() if hasattr(values, "tolist") else list(values)
        if len(values) != n:
            raise RewardError(f"reward {part.name!r} returned {len(values)} values for {n} completions")
        out: list[float | None] = []
        for i, v in enumerate(values):
            if v is None or errors[i] is not None:
                out.append(None)
                continue
            if not isinstance(v, numbers.Real) or not math.isfinite(v):
                msg = f"reward {part.name!r} returned {v!r} at index {i}; rewards must be finite numbers (or None to skip)"
                if strict:
                    raise RewardError(msg)
                errors[i] = ValueError(msg)
                out.append(None)
                continue
            out.append(float(v))
        return out

    def probe(self, problem: Any) -> None:
        """Call every reward once on two made-up completions of `problem`, so a broken function
        fails at start-up (before any model loads) instead of mid-run."""
        self.score([problem, problem], ["", "#### 0"], [[], [0]], strict=True)


def final_answer(problem: Any, text: str) -> str | None:
    """The answer the correctness reward reads from `text`: the line after the last '####' where
    reasoning-gym's scorer judges the row (answers that are not numbers), else the GSM8K final
    number, normalised. None when there is none."""
    if _rg_judged(problem.answer, problem.columns.get("rg_task"), problem.columns.get("rg_entry")):
        return _marked_answer(text)
    return extract_gsm8k_answer(text)


def score_correctness(problems: Sequence[Any], texts: Sequence[str]) -> list[RewardResult]:
    """The correctness part of every reward set, alone: info 'correct' (1.0 when the correctness
    reward is exactly 1.0) and 'has_answer', as RewardSet.score fills them for the curriculum and
    the learner's accuracy. Held-out evaluation (grpo.evaluate) scores with this, so a task is
    measured by the rule it trains on: reasoning-gym's score_answer for rg: answers that are not
    numbers, the GSM8K final-number rule otherwise. Its failures: correctness_scorer's faults."""
    return correctness_scorer().score(problems, texts, [[] for _ in texts])


def correctness_scorer() -> RewardSet:
    """The correctness part alone, with books of its own (RewardSet.faults): an evaluation that
    scores with it reports the completions it could not score."""
    return RewardSet("correctness")


def reward_set_from_config(cfg: Any) -> RewardSet:
    """The RewardSet a SamplerConfig asks for."""
    limits = SandboxLimits(timeout_s=cfg.data.code_timeout_s, memory_mb=cfg.data.code_memory_mb,
                           max_workers=cfg.data.code_workers)
    if not (limits.timeout_s > 0 and limits.memory_mb >= 64 and limits.max_workers >= 1):
        raise RewardError("--code-timeout-s must be > 0, --code-memory-mb >= 64 (Python itself needs "
                          "~30 MiB) and --code-workers >= 1")
    return RewardSet(cfg.data.reward, cfg.data.reward_weights, max_new_tokens=cfg.rollout.max_new_tokens,
                     overlong_buffer=cfg.data.overlong_buffer, format_style=cfg.data.format_style,
                     code_limits=limits)

