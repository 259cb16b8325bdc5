"""From problems to model inputs: the prompt text, and the endless shuffled stream of problems
that feeds a sampler.
"""
from __future__ import annotations

import random
import zlib
from collections.abc import Iterator
from typing import Any

from grpo.data.formats import Problem

DEFAULT_INSTRUCTION = "\nSolve step by step and give the final answer after '####'."


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


class Deferrals:
    """The train prompts whose last group had no signal (every completion scored alike: the policy
    then solved it every time, or never), each passed over once when its stream next reaches it, so
    that a sampler does not generate again, at once, a group the learner would drop. A prompt is
    passed over once per mark: the epoch after, it is tried again (the policy moves). Prompts are
    known by their question and answer; the marks live in the sampler process (a restart starts
    with none)."""

    def __init__(self) -> None:
        self._marked: set[int] = set()
        self.deferred = 0   # prompts passed over so far

    @staticmethod
    def key(problem: Problem) -> int:
        return zlib.crc32(f"{problem.question}\0{problem.answer}".encode())

    def mark(self, problem: Problem, signal: bool) -> None:
        """What the prompt's newest group showed: with signal it is kept, without it is passed over next time."""
        if signal:
            self._marked.discard(self.key(problem))
        else:
            self._marked.add(self.key(problem))

    def take(self, problem: Problem) -> bool:
        """Whether to pass over `problem` now (its mark is used up, and counted)."""
        k = self.key(problem)
        if k not in self._marked:
            return False
        self._marked.remove(k)
        self.deferred += 1
        return True

    def __len__(self) -> int:
        return len(self._marked)


class PromptStream:
    """Endless, seeded, reshuffled-every-epoch iterator over a list of Problems.

    The order of epoch e depends only on (seed, e), so (epoch, index) is the whole state: restoring
    `position` after a restart replays exactly the same stream. With `deferrals`, a prompt marked
    there is passed over once (Deferrals); each pass-over uses up its mark, so a stream whose every
    prompt is marked still yields one within two epochs.
    """

    def __init__(self, problems: list[Problem], seed: int, deferrals: Deferrals | None = None) -> None:
        if not problems:
            raise ValueError("PromptStream needs at least one problem")
        self._problems = list(problems)
        self.deferrals = deferrals
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
        while True:   # bounded: every pass-over uses up one of at most len(problems) marks
            if self._index >= len(self._order):
                self._epoch += 1
                self._index = 0
                self._order = self._permutation(self._epoch)
            problem = self._problems[self._order[self._index]]
            self._index += 1
            if self.deferrals is None or not self.deferrals.take(problem):
                return problem

    def next_batch(self, n: int) -> list[Problem]:
        """The next n problems; a batch may straddle two epochs."""
        if n < 0:
            raise ValueError(f"batch size must be >= 0, got {n}")
        return [next(self) for _ in range(n)]
