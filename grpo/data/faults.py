"""The books of reward failures: a completion a reward could not score costs that completion its
score, never the round or the run (DESIGN.md, contract 9); this counts each such failure by reward
and exception type, logs the first example of each pair once, and says when a reward is broken
rather than its completions: when at least FAIL_SHARE of its last FAIL_WINDOW completions failed.
"""
from __future__ import annotations

import collections
import logging

__all__ = ["FAIL_SHARE", "FAIL_WINDOW", "RewardFaults", "kind_of", "reported_failures"]

log = logging.getLogger(__name__)

# A reward that fails on half of its last 256 completions is broken, not unlucky: most completions
# a model writes are ordinary, and a run that goes on would train on its failure values alone.
FAIL_WINDOW = 256
FAIL_SHARE = 0.5
# Pairs of (reward, exception type) a status names one by one; the rest are summed.
STATS_KINDS = 16


def kind_of(exc: BaseException) -> str:
    """An exception's type name; for one raised in a scoring child (grpo.data.bounded), its own."""
    return getattr(exc, "kind", None) or type(exc).__name__


def first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return text.splitlines()[0][:200] if text else ""


class RewardFaults:
    """Failures by (reward, exception type), and each reward's outcomes over its last `window` completions."""

    def __init__(self, window: int = FAIL_WINDOW, share: float = FAIL_SHARE):
        self.window, self.share = window, share
        self.counts: collections.Counter[tuple[str, str]] = collections.Counter()
        self.examples: dict[tuple[str, str], str] = {}   # the first completion of each pair, cut short
        self._recent: dict[str, collections.deque[bool]] = {}

    def record(self, reward: str, errors: list[BaseException | None], texts: list[str]) -> None:
        """One reward's outcome on each completion it scored (None: scored), in order."""
        recent = self._recent.setdefault(reward, collections.deque(maxlen=self.window))
        for exc, text in zip(errors, texts):
            recent.append(exc is not None)
            if exc is None:
                continue
            key = (reward, kind_of(exc))
            self.counts[key] += 1
            if key not in self.examples:
                self.examples[key] = f"{first_line(exc)} | completion {text[:120]!r}{'...' if len(text) > 120 else ''}"
                log.warning("reward %r raised %s on a completion; it scores that completion's failure value, and "
                            "the run goes on (counted as reward_failures). First example: %s", reward, key[1],
                            self.examples[key])

    def broken(self) -> str | None:
        """The one line that stops a run when a reward failed on at least `share` of its last `window`
        completions (a full window), else None."""
        for reward, recent in self._recent.items():
            failed = sum(recent)
            if len(recent) == self.window and failed >= self.share * self.window:
                kind, n = max(((k, c) for (r, k), c in self.counts.items() if r == reward), key=lambda kc: kc[1])
                return (f"reward {reward!r} failed on {failed} of its last {self.window} completions (mostly {kind}: "
                        f"{self.examples[(reward, kind)].split(' | ')[0] or 'no message'}): the reward is broken, not "
                        f"the completions; fix it or leave it out of --reward")
        return None

    def stats(self, most: int = STATS_KINDS) -> dict[str, float]:
        """The counts as flat metrics: reward_failures (all) and reward_failures/<reward>/<type> for
        the first `most` pairs seen, any later ones summed as reward_failures/other/other (a status's
        map is small: grpo.wire.messages.MAX_MAP_ITEMS). First seen, not commonest: a name once
        given keeps its count, so a caller that updates its stats with these never holds a stale one."""
        out = {"reward_failures": float(sum(self.counts.values()))}
        seen = list(self.counts.items())   # in the order each pair first failed
        out.update({f"reward_failures/{r}/{k}": float(n) for (r, k), n in seen[:most]})
        if rest := sum(n for _, n in seen[most:]):
            out["reward_failures/other/other"] = float(rest)
        return out

    def summary(self) -> str:
        """'correctness OverflowError 3, flaky ValueError 12' (empty without failures)."""
        return ", ".join(f"{r} {k} {n}" for (r, k), n in sorted(self.counts.items()))


def reported_failures(reports: list[dict]) -> dict[str, int]:
    """Several samplers' statuses' failures (RewardFaults.stats), summed by '<reward>/<exception type>'."""
    out: dict[str, int] = {}
    for stats in reports:
        for key, n in stats.items():
            if key.startswith("reward_failures/"):
                name = key.split("/", 1)[1]
                out[name] = out.get(name, 0) + int(n)
    return dict(sorted(out.items()))
