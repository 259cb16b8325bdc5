"""The flags users type, as every entry script's parser offers them: option strings, dest,
default, choices, action and type. tests/launch/flag_surface.json is the surface captured before
the config was cut into sections; a change to it is a change users see, so it is made on purpose:
regenerate with `python tests/launch/test_flag_surface.py > tests/launch/flag_surface.json`."""
import argparse
import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
EXPECTED = Path(__file__).with_name("flag_surface.json")


def snapshot(parser: argparse.ArgumentParser) -> list[dict]:
    rows = []
    for a in parser._actions:
        if isinstance(a, argparse._HelpAction):
            continue
        rows.append({"options": list(a.option_strings), "dest": a.dest, "default": repr(a.default),
                     "choices": list(a.choices) if a.choices is not None else None,
                     "action": type(a).__name__, "type": getattr(a.type, "__name__", None)})
    return sorted(rows, key=lambda r: r["dest"])


def surface() -> dict[str, list[dict]]:
    from grpo.config import EvalConfig, LearnerConfig, SamplerConfig
    from grpo.flags import build_parser
    from grpo.launch.plan import launcher_parser

    parsers = {"sampling_worker.py": build_parser(SamplerConfig, "sampling_worker.py"),
               "training_worker.py": build_parser(LearnerConfig, "training_worker.py"),
               "run_distributed.py": launcher_parser(),
               "run_distributed.py --help": launcher_parser(with_workers=True),
               "python -m grpo.evaluate": build_parser(EvalConfig, "python -m grpo.evaluate")}
    return {name: snapshot(p) for name, p in parsers.items()}


def test_every_entry_parser_offers_the_flags_it_did():
    expected = json.loads(EXPECTED.read_text())
    got = surface()
    assert sorted(got) == sorted(expected)
    for name in expected:
        want = {r["dest"]: r for r in expected[name]}
        have = {r["dest"]: r for r in got[name]}
        assert sorted(have) == sorted(want), name
        for dest in want:
            assert have[dest] == want[dest], (name, dest)
        assert got[name] == expected[name], name    # no dest offered twice


if __name__ == "__main__":
    sys.path.insert(0, str(ROOT))
    json.dump(surface(), sys.stdout, indent=1, sort_keys=True)
    print()


def test_every_option_is_in_a_section_and_help_groups_them_in_order():
    from grpo.config import SECTIONS, LaunchConfig, LearnerConfig, SamplerConfig, field_sections
    from grpo.flags import build_parser

    for cls in (SamplerConfig, LearnerConfig, LaunchConfig):
        sections = field_sections(cls)
        assert {n for n, title in sections.items() if title not in SECTIONS} == ({"extra"} if cls is LaunchConfig
                                                                                 else set()), cls
        parser = build_parser(cls, "x")
        titles = [g.title for g in parser._action_groups if g.title in SECTIONS]
        assert titles == [t for t in SECTIONS if t in sections.values()], cls
        for group in parser._action_groups:
            if group.title in SECTIONS:
                assert group.description == SECTIONS[group.title]
                assert {sections[a.dest] for a in group._group_actions} == {group.title}
    assert field_sections(LearnerConfig)["loss_type"] == "loss"
    assert field_sections(SamplerConfig)["filter_zero_signal"] == "rollout"
    assert field_sections(LearnerConfig)["filter_zero_signal"] == "loss"
    assert field_sections(LaunchConfig)["max_steps"] == field_sections(LearnerConfig)["max_steps"] == "training"
