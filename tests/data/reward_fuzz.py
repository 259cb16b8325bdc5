"""A seeded corpus of completions that a model can write and a reward must survive: huge and odd
numbers, non-finite words, unicode digits and minus signs, deep brackets, markers and think tags in
the wrong places, regex-hostile runs, control characters and very long answers. `corpus(seed)` gives
the same few hundred strings for the same seed; `REAL` are completions seen in real runs."""
from __future__ import annotations

import random

# The completion that ended a 300 s one-GPU run's final evaluation (issue 57, Qwen2.5-Coder-0.5B on
# GSM8K): greedy decoding ended in a repeating decimal of several hundred digits. The run's text was
# not kept; this is its shape (a number past 1e308, which float() cannot hold), rebuilt from the report.
REAL = [
    "Each share is 10 / 3 = 3.3333333333 dollars.\n#### " + "3" * 400,
    "The ratio is 1/3, so the answer is 0." + "3" * 600,
]

_NUMBERS = [
    "9" * 310, "1" + "0" * 400, "-" + "7" * 350, "3." + "3" * 500, "0." + "0" * 400 + "1",
    "1" * 5000, "1,000" * 300, "1/" + "9" * 400, "9" * 400 + "/7", "1/0", "0/0", "-0", "-0.0", "+5",
    "1e999", "-1e999", "1e-999", "10^400", "2**100000", "1E308", "1.7976931348623157e309",
    "nan", "NaN", "inf", "-inf", "Infinity", "∞", "１２３", "٣", "۷۲", "߂", "\u22127", "−72",
    "0x48", "0b1001000", "072", "7_2", "72.", ".5", "..5", "5..", "1.2.3", "$72", "$ 72", "72%",
    "\\frac{1}{3}", "\\frac{" * 50 + "1" + "}{3}" * 50, "\\sqrt{" * 40 + "2" + "}" * 40,
    "(" * 500 + "1" + ")" * 500, "[" * 300, "{" * 300, "1/3 + 1/3 + 1/3", "3 \\times 10^{400}",
    "72 \\div 0", "x = 72", "\\boxed{72}", "\\boxed{" * 100 + "72" + "}" * 100,
]

_PIECES = [
    "####", "#### ", "<think>", "</think>", "\n", " ", "\t", "\r", "\x00", "\x1b[31m", "\ufeff", "\u200b",
    "\U0001f600", "$", ",", ".", "/", "-", "−", "e", "^", "\\", "{", "}", "(", ")", "=", "*", "%",
    "The answer is ", "So", "Step 1:", "```python\n", "```", "boxed", "0", "7", "9",
]


def _run(rng: random.Random) -> str:
    """A long run of one or two pieces: the inputs that make backtracking regexes slow."""
    a, b = rng.choice(_PIECES), rng.choice(_PIECES)
    n = rng.choice([1000, 20_000, 100_000])
    return (a + b) * (n // max(len(a + b), 1))


def _char(rng: random.Random) -> str:
    """Any character of unicode's first three planes but a lone surrogate (decoded tokens never hold one)."""
    c = rng.randrange(1, 0x2FFFF - 0x800)
    return chr(c if c < 0xD800 else c + 0x800)


def corpus(seed: int = 0, size: int = 300) -> list[str]:
    """`size` adversarial completions (the fixed shapes first, then seeded mixtures), plus REAL."""
    rng = random.Random(seed)
    fixed = [f"#### {n}" for n in _NUMBERS] + [f"so it is {n}" for n in _NUMBERS] + [
        "", " ", "####", "#### ", "####\n", "#" * 100_000, "#### " * 20_000, "1" * 100_000,
        "1,111," * 20_000 + "1111", "1" + " " * 100_000 + "\nx", "#### 1" + " " * 100_000 + "\nx",
        "#### 1" + "\t \r" * 30_000 + "\n\nx", "<think>" * 10_000, "</think>" * 10_000,
        "<think>" + "a" * 100_000 + "</think>" * 2, "<think>x</think>" * 5_000 + "#### 72",
        ("7" * 99 + ".") * 1_000, "-" * 100_000 + "72", "/" * 50_000 + "3", "1/" * 50_000,
        "." * 100_000 + "5", "$" * 100_000 + "72", "−" * 50_000 + "72",
    ]
    out = list(fixed)
    while len(out) < size:
        kind = rng.randrange(4)
        if kind == 0:
            out.append(_run(rng))
        elif kind == 1:   # text with a hostile number at the end, where the answer is read
            out.append("".join(rng.choice(_PIECES) for _ in range(rng.randrange(1, 40)))
                       + "\n#### " + rng.choice(_NUMBERS))
        elif kind == 2:   # random characters over the whole of unicode's first planes
            out.append("".join(_char(rng) for _ in range(rng.randrange(1, 400))))
        else:
            out.append(rng.choice(_NUMBERS) + rng.choice(_PIECES) + rng.choice(_NUMBERS))
    return out[:size] + REAL
