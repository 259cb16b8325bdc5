"""Flags and YAML config files from the typed configs in grpo.config: one ``--field-name`` per
dataclass field, its help the docstring under the field; a ``--config`` file's values become
the defaults, so flags on the command line win; and back to flags for the launcher's children.
"""
from __future__ import annotations

import argparse
import ast
import dataclasses
import functools
import inspect
import os
import textwrap
import typing

import yaml

from grpo.config import (SECTIONS, LaunchConfig, LearnerConfig, SamplerConfig, field_sections, flat, flat_fields,
                         from_flat)
from grpo.config.sections import section_class
from grpo.config.bounds import Bounds, bounds_of
from grpo.config.cli import ArgumentParser, did_you_mean
from grpo.data.tasks import TaskSpecError, from_yaml


@functools.cache
def field_docs(cls: type) -> dict[str, str]:
    """Docstrings written under dataclass fields (this class, its bases, and for a role config its
    sections'), by flat field name. Cached: reading them parses the classes' source, and every parse
    of a role's flags asks; callers only read it."""
    docs: dict[str, str] = {}
    parts = [section_class(f) for f in dataclasses.fields(cls) if section_class(f)]
    for klass in [k for part in parts for k in reversed(part.__mro__)] + list(reversed(cls.__mro__)):
        if not dataclasses.is_dataclass(klass):
            continue
        tree = ast.parse(textwrap.dedent(inspect.getsource(klass)))
        body = tree.body[0].body  # type: ignore[attr-defined]
        for node, nxt in zip(body, body[1:]):
            if (isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name)
                    and isinstance(nxt, ast.Expr) and isinstance(nxt.value, ast.Constant)
                    and isinstance(nxt.value.value, str)):
                docs[node.target.id] = nxt.value.value
    return docs


def section_groups(parser: argparse.ArgumentParser, fields: list[tuple[type, list[str]]]) -> dict:
    """An argument group (title and one line, grpo.config.SECTIONS) for each section of the listed
    (class, field names), made in SECTIONS's order, which is the order --help shows them in."""
    used = {field_sections(cls)[name] for cls, names in fields for name in names}
    return {title: parser.add_argument_group(title, line) for title, line in SECTIONS.items() if title in used}


def add_fields(parser: argparse.ArgumentParser, cls: type, names: list[str] | None = None,
               aliases: dict[str, list[str]] | None = None, groups: dict | None = None, note: str = "") -> None:
    """One ``--field-name`` option per dataclass field of `cls` (or only `names`), in the argument
    group of its section (`groups`, made here when not given; a field of no section goes on the
    parser itself); the help is the docstring under the field, `note`, and its default."""
    docs = {k: v.replace("%", "%%") for k, v in field_docs(cls).items()}   # argparse formats help with %
    hints = flat_hints(cls)
    sections = field_sections(cls)
    chosen = [f for _, f in flat_fields(cls).values() if names is None or f.name in names]
    if groups is None:
        groups = section_groups(parser, [(cls, [f.name for f in chosen])])
    note = f"{note}; " if note else ""
    for f in chosen:
        container = groups.get(sections[f.name], parser)
        flag = "--" + f.name.replace("_", "-")
        opts = [flag] + (aliases or {}).get(f.name, [])
        default = f.default if f.default is not dataclasses.MISSING else f.default_factory()  # type: ignore[misc]
        help_text = docs.get(f.name, "") + f" ({note}default: {default!r})"
        tp = hints[f.name]
        if typing.get_origin(tp) is typing.Literal:
            choices = typing.get_args(tp)
            # the choices are the metavar (grpo.config.cli.HelpFormatter), so the help need not list them
            container.add_argument(*opts, dest=f.name, type=str, choices=choices, default=default, help=help_text)
        elif tp is bool and f.name.startswith("no_"):
            # argparse's BooleanOptionalAction reads any "--no-..." flag as False: plain switch.
            container.add_argument(*opts, dest=f.name, action="store_true", help=help_text)
        elif tp is bool:
            container.add_argument(*opts, dest=f.name, action=argparse.BooleanOptionalAction,
                                   default=default, help=help_text)
        else:
            bounds = bounds_of(f)
            if bounds is not None:
                help_text = docs.get(f.name, "") + f" ({note}{bounds.describe()}; default: {default!r})"
            container.add_argument(*opts, dest=f.name, type=tp if bounds is None else in_range(tp, bounds),
                                   default=default, help=help_text)


@functools.cache
def flat_hints(cls: type) -> dict[str, type]:
    """The type of each flat field of role config `cls` (its sections' hints, and its own)."""
    hints = {name: tp for name, tp in typing.get_type_hints(cls).items() if name in flat_fields(cls)}
    for f in dataclasses.fields(cls):
        if kind := section_class(f):
            hints.update(typing.get_type_hints(kind))
    return hints


def in_range(tp: type, bounds: Bounds):
    """An argparse type: `tp` of the text, refused in one line when outside `bounds`."""
    def convert(text: str):
        value = tp(text)   # a ValueError here reads "invalid int value", as for a plain type
        if problem := bounds.problem(value):
            raise argparse.ArgumentTypeError(problem)
        return value

    convert.__name__ = tp.__name__
    return convert


def build_parser(cls: type, prog: str, description: str = "",
                 aliases: dict[str, list[str]] | None = None,
                 skip: tuple[str, ...] = ("extra",)) -> ArgumentParser:
    parser = ArgumentParser(prog=prog, description=description or cls.__doc__)
    add_fields(parser, cls, [name for name in flat_fields(cls) if name not in skip], aliases)
    return parser


def _all_fields() -> dict[str, dataclasses.Field]:
    """Every option of every role: one YAML file can configure a whole run."""
    out: dict[str, dataclasses.Field] = {}
    for klass in (SamplerConfig, LearnerConfig, LaunchConfig):
        out.update({name: f for name, (_, f) in flat_fields(klass).items() if name not in ("extra", "config")})
    return out


def _coerce(key: str, value, tp, path: str):
    """A YAML value as the field's type; a mismatch is a ConfigFileError naming the key."""
    if key in ("dataset", "eval_dataset") and isinstance(value, dict):
        try:
            return from_yaml(value, f"--config {path}")
        except TaskSpecError as exc:
            raise ConfigFileError(str(exc)) from None
    if typing.get_origin(tp) is typing.Literal:
        if isinstance(value, str) and value in typing.get_args(tp):
            return value
        raise ConfigFileError(f"--config {path}: {key}: {value!r} is not one of {', '.join(typing.get_args(tp))}")
    if tp is bool:
        if isinstance(value, bool):
            return value
    elif tp is float and isinstance(value, (int, float)) and not isinstance(value, bool):
        return float(value)
    elif tp is int and isinstance(value, int) and not isinstance(value, bool):
        return value
    elif tp is str and isinstance(value, (str, int, float)) and not isinstance(value, bool):
        return str(value)
    elif tp in (int, float) and isinstance(value, str):
        # YAML 1.1 reads 2e-6 (no dot) as a string; accept what the flag would accept.
        try:
            return tp(value)
        except ValueError:
            pass
    elif tp is str and isinstance(value, list) and all(isinstance(v, (str, int)) for v in value):
        return ",".join(map(str, value))  # lists like [q_proj, v_proj] or GPU ids [1, 2]
    raise ConfigFileError(f"--config {path}: {key}: expected {tp.__name__}, got {value!r}")


class ConfigFileError(ValueError):
    """A bad --config file; one line naming the file, the key and the fix."""


def load_config_file(path: str, cls: type) -> dict:
    """The options a YAML file sets for `cls`, checked against every role's fields.

    Keys may use dashes or underscores. A key that no role knows fails with the nearest
    valid name; keys of other roles are accepted and left to those roles (one file serves
    the launcher, the learner and the samplers).
    """
    try:
        with open(path) as fh:
            data = yaml.safe_load(fh)
    except FileNotFoundError:
        raise ConfigFileError(f"--config {path}: no such file") from None
    except yaml.YAMLError as exc:
        raise ConfigFileError(f"--config {path}: not valid YAML ({str(exc).splitlines()[0]})") from None
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise ConfigFileError(f"--config {path}: expected a mapping of option: value, got {type(data).__name__}")
    known = _all_fields()
    mine = set(flat_fields(cls))
    hints = {**flat_hints(SamplerConfig), **flat_hints(LearnerConfig), **flat_hints(LaunchConfig)}
    out: dict = {}
    for raw_key, value in _flat_items(data, path):
        key = str(raw_key).replace("-", "_")
        if key not in known:
            hint = did_you_mean(key, known, cutoff=0.5) or "; see --help for the options"
            raise ConfigFileError(f"--config {path}: unknown key {raw_key!r}{hint}")
        value = _coerce(key, value, hints[key], path)
        if (bounds := bounds_of(known[key])) and (problem := bounds.problem(value)):
            raise ConfigFileError(f"--config {path}: {key}: {problem}")
        if key in mine:
            out[key] = value
    return out


def _section_keys() -> dict[str, set[str]]:
    """Each section attribute (grpo.config.sections.ATTRS) -> the flat keys any role holds in it."""
    out: dict[str, set[str]] = {}
    for klass in (SamplerConfig, LearnerConfig, LaunchConfig):
        for name, (attr, _) in flat_fields(klass).items():
            if attr:
                out.setdefault(attr, set()).add(name)
    return out


def _flat_items(data: dict, path: str) -> list[tuple]:
    """The file's (key, value) pairs with a section's mapping (``rollout: {in_flight_rows: 4}``)
    opened into its keys; a section name with a scalar value is the field of that name
    (``instances: 2``, ``weight_sync: ipc``)."""
    sections = _section_keys()
    out = []
    for raw_key, value in data.items():
        attr = str(raw_key).replace("-", "_")
        if attr not in sections or not isinstance(value, dict):
            out.append((raw_key, value))
            continue
        for inner, v in value.items():
            if str(inner).replace("-", "_") not in sections[attr]:
                near = did_you_mean(str(inner).replace("-", "_"), sections[attr], cutoff=0.5)
                raise ConfigFileError(f"--config {path}: {raw_key}: no key {inner!r} in this section{near}")
            out.append((inner, v))
    return out


def apply_config_file(parser: argparse.ArgumentParser, cls: type, argv: list[str] | None) -> None:
    """Make the --config file's values the parser's defaults, so flags on the command line win."""
    # exact, as the parser it serves: a prefix (--conf) is that parser's unknown flag, not a file to read
    pre = argparse.ArgumentParser(add_help=False, allow_abbrev=False)
    pre.add_argument("--config", default="")
    ns, _ = pre.parse_known_args(argv)
    if not ns.config:
        return
    try:
        values = load_config_file(ns.config, cls)
    except ConfigFileError as exc:
        parser.error(str(exc))
    # Absolute, so children started from another directory (the launcher's) find it too.
    parser.set_defaults(**values, config=os.path.abspath(ns.config))


def parse_config(cls: type, argv: list[str] | None, prog: str, **kw):
    parser = build_parser(cls, prog, **kw)
    apply_config_file(parser, cls, argv)
    ns = parser.parse_args(argv)
    if getattr(ns, "config", ""):
        ns.config = os.path.abspath(ns.config)
    return from_flat(cls, {k: v for k, v in vars(ns).items() if k in flat_fields(cls)})


def to_flags(cfg, cls: type | None = None) -> list[str]:
    """The inverse of parse_config for the fields `cls` knows (used by the launcher)."""
    names = flat_fields(cls or type(cfg))
    out: list[str] = []
    for name, value in flat(cfg).items():
        if name not in names or name == "extra":
            continue
        flag = "--" + name.replace("_", "-")
        if isinstance(value, bool):
            if value or not name.startswith("no_"):
                out.append(flag if value else "--no-" + name.replace("_", "-"))
        else:
            out += [flag, str(value)]
    return out
