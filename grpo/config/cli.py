"""The command line every entry point shares: a parser that takes flags only as spelled (no
prefix abbreviations) and says a mistake in one line, and the nearest-name suggestion that flags,
YAML keys, reward names and plugin functions all give ("did you mean ...?").

Here, in the lowest layer and with nothing but the standard library, so that the smoke test
(grpo.wire), `python -m grpo.data` and the report (grpo.obs) use the same parser as the workers.
"""
from __future__ import annotations

import argparse
import difflib
import shutil
import textwrap
import typing
from collections.abc import Iterable


def nearest(word: str, options: Iterable[str], cutoff: float = 0.6) -> str | None:
    """The option closest to `word` (difflib's ratio, at least `cutoff`: difflib's own default, which
    keeps a typo's match and drops a made-up word's, e.g. --bogus-x's --gpus), or None."""
    near = difflib.get_close_matches(word, list(options), n=1, cutoff=cutoff)
    return near[0] if near else None


def did_you_mean(word: str, options: Iterable[str], cutoff: float = 0.6) -> str:
    """'; did you mean X?' for the nearest of `options`, or '' when none is near."""
    near = nearest(word, options, cutoff)
    return f"; did you mean {near}?" if near else ""


def unknown_flag(flag: str, known: Iterable[str]) -> str:
    """'unknown flag --x; did you mean --y?': `flag` as typed (a '=value' dropped), compared with the
    `known` option strings without their dashes, so the shared '--' counts for nothing."""
    name = flag.partition("=")[0]
    bare = {k.lstrip("-"): k for k in known if k.startswith("--")}
    near = nearest(name.lstrip("-"), bare)
    return f"unknown flag {name}" + (f"; did you mean {bare[near]}?" if near else "")


def unknown_arguments(extras: list[str], known: Iterable[str]) -> str:
    """The one line for what a parser left over: the first unknown flag (with the nearest known
    one), or the first stray word when no flag is among them."""
    flag = next((t for t in extras if t.startswith("-")), None)
    if flag is None:
        return f"unexpected argument {extras[0]!r}; flags look like --name value"
    return unknown_flag(flag, known)


class HelpFormatter(argparse.HelpFormatter):
    """--help in one line per option where the help is short: 120 columns (fewer on a narrower
    terminal), help from column 32, a metavar per type (N an int, X a float, TEXT a string, or the
    choices) written once after an option's aliases, and a switch with its negation as --[no-]name."""

    WIDTH = 120
    HELP_COLUMN = 32

    def __init__(self, prog, indent_increment=2, max_help_position=HELP_COLUMN, width=None):
        if width is None:   # not a terminal (a pipe, a file): WIDTH
            width = min(self.WIDTH, shutil.get_terminal_size((self.WIDTH + 2, 24)).columns - 2)
        super().__init__(prog, indent_increment, max_help_position, width)

    def _split_lines(self, text, width):
        # argparse's, without breaking a word at its hyphen: "--num-" and "generations" on two lines
        return textwrap.wrap(" ".join(text.split()), width, break_on_hyphens=False)

    def _get_default_metavar_for_optional(self, action):
        name = getattr(action.type, "__name__", None)
        return {"int": "N", "float": "X", "str": "TEXT"}.get(name) or super()._get_default_metavar_for_optional(action)

    def _format_action_invocation(self, action):
        if not action.option_strings:
            return super()._format_action_invocation(action)
        if isinstance(action, argparse.BooleanOptionalAction):
            return ", ".join("--[no-]" + s[2:] for s in action.option_strings
                             if s.startswith("--") and not s.startswith("--no-"))
        if action.nargs == 0:
            return ", ".join(action.option_strings)
        return ", ".join(action.option_strings) + " " + self._format_args(
            action, self._get_default_metavar_for_optional(action))


class ArgumentParser(argparse.ArgumentParser):
    """argparse that takes flags exactly as spelled and reports a user mistake as one line and exit
    code 2, no usage dump; its usage line is short, since --help lists every option below it, one
    line each where the help is short (HelpFormatter).

    Exact: argparse would read `--max-step 3` as `--max-steps 3` (a prefix of one option is taken
    for it), so a typo trained silently with a value the user never meant for that flag, and a
    flag added later could turn a working prefix into an error. An unknown flag names the nearest
    known one instead."""

    def __init__(self, *args, **kw):
        kw.setdefault("usage", "%(prog)s [options]")
        kw.setdefault("allow_abbrev", False)
        kw.setdefault("formatter_class", HelpFormatter)
        super().__init__(*args, **kw)

    def option_names(self) -> list[str]:
        """Every option string of this parser and of its subcommands' parsers."""
        names: list[str] = []
        for action in self._actions:
            names += action.option_strings
            if isinstance(action, argparse._SubParsersAction):
                for sub in action.choices.values():
                    names += sub.option_names() if isinstance(sub, ArgumentParser) else [
                        s for a in sub._actions for s in a.option_strings]
        return names

    def parse_args(self, args=None, namespace=None):  # type: ignore[override]
        ns, extras = self.parse_known_args(args, namespace)
        if extras:
            self.error(unknown_arguments(extras, self.option_names()))
        return ns

    def error(self, message: str) -> typing.NoReturn:
        # A message that points at --help already (a caller's own) is not given a second pointer.
        hint = "" if "see --help" in message else " (see --help)"
        self.exit(2, f"{self.prog}: error: {message}{hint}\n")
