"""Screening (--screen-generations K): a prompt's first K completions are generated and scored
before the rest of its group. Where their rewards all agree, the prompt is dropped there, for K
completions instead of G: a group the policy always or never solves carries no advantage, and most
of what it would cost is saved. Where they differ, the other G - K are generated and the group is
whole, G rows like any other, its first K scored once.

The price is a group dropped that would have had signal: all K agree although not all G would.
With pass rate p, the screen agrees with probability p**K + (1 - p)**K (screen_agrees), so a
prompt costs K + (1 - that) * (G - K) completions on average (expected_samples). Per group with
signal that is K / (1 - aK) + G - K against G / (1 - aG) for whole groups (aN the chance that N
agree): less only for prompts solved always or never, more for every other pass rate (p = 0.5,
K = 4, G = 16: 16.6 against 16.0), so screening pays where many prompts are settled either way.
Without torch, so the launcher checks the flag before any worker starts.
"""
from __future__ import annotations


def screen_problem(screen: int, group_size: int) -> str | None:
    """The one-line error for --screen-generations `screen` with --num-generations `group_size`, or None.
    0 is off; otherwise at least 2 (one completion cannot disagree with itself) and fewer than G
    (the rest of the group must be something)."""
    if screen == 0 or 2 <= screen < group_size:
        return None
    return (f"--screen-generations {screen}: give 2..{group_size - 1} (fewer than --num-generations {group_size}, "
            f"and at least 2 to disagree), or 0 to generate whole groups at once")


def screen_agrees(pass_rate: float, screen: int) -> float:
    """The chance that a prompt's first `screen` completions are all right or all wrong, at a pass
    rate of `pass_rate`: p**K + (1 - p)**K. p = 0.5, K = 4: 2 / 16 = 0.125."""
    return pass_rate ** screen + (1.0 - pass_rate) ** screen


def expected_samples(pass_rate: float, screen: int, group_size: int) -> float:
    """Completions a prompt costs on average with screening: K, and G - K more where the screen
    disagreed. p = 0.5, K = 4, G = 16: 4 + 0.875 * 12 = 14.5; p = 0 (never solved): 4."""
    return screen + (1.0 - screen_agrees(pass_rate, screen)) * (group_size - screen)
