"""Ranges of numeric options, declared beside their field: ``num_generations: int = at_least(2, 8, why)``.

grpo.flags refuses a value out of range where it is read, on the command line or in a --config
file, in one line that names the flag, the range and why, with exit code 2: before any process
starts, so a launcher never starts workers that would fail (or wait forever) on a bad count.
A field made directly in Python (tests, library use) is not checked: the range belongs to the flag.
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass


@dataclass(frozen=True)
class Bounds:
    """A closed or open range; None leaves that side unbounded."""
    least: float | None = None    # value >= least
    above: float | None = None    # value > above
    most: float | None = None     # value <= most
    below: float | None = None    # value < below
    why: str = ""

    def problem(self, value) -> str | None:
        """None if `value` lies in the range, else what is wrong with it (no flag name)."""
        if self.least is not None and value < self.least:
            need = f"at least {self.least:g}"
        elif self.above is not None and value <= self.above:
            need = f"above {self.above:g}"
        elif self.most is not None and value > self.most:
            need = f"at most {self.most:g}"
        elif self.below is not None and value >= self.below:
            need = f"below {self.below:g}"
        else:
            return None
        return f"{value!r} must be {need}" + (f" ({self.why})" if self.why else "")

    def describe(self) -> str:
        """The range in words, for --help: 'at least 2', 'above 0', '1 to 65535', 'at least 0 and below 1'."""
        if self.least is not None and self.most is not None:
            return f"{self.least:g} to {self.most:g}"
        parts = [f"{word} {edge:g}" for word, edge in (("at least", self.least), ("above", self.above),
                                                        ("at most", self.most), ("below", self.below))
                 if edge is not None]
        return " and ".join(parts)


def bounded(default, *, why: str = "", **edges) -> dataclasses.Field:
    """A dataclass field with `default` whose flag refuses values outside `edges` (Bounds' names)."""
    return dataclasses.field(default=default, metadata={"bounds": Bounds(**edges, why=why)})


def at_least(least, default, why: str = "") -> dataclasses.Field:
    """value >= least."""
    return bounded(default, least=least, why=why)


def positive(default, why: str = "") -> dataclasses.Field:
    """value > 0."""
    return bounded(default, above=0, why=why)


def bounds_of(f: dataclasses.Field) -> Bounds | None:
    return f.metadata.get("bounds")
