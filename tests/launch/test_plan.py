"""Flags derived from the typed configs, DeepSpeed "auto" resolution, and the launch plan."""
import json
from pathlib import Path

import pytest

from grpo.config import LaunchConfig, LearnerConfig, SamplerConfig, TrainingSection, flat_fields
from grpo.flags import build_parser, field_docs, parse_config, to_flags
from grpo.launch.plan import LaunchError, parse, plan, split_passthrough
from grpo.learner.engine import ConfigError, resolve_ds_config

ROOT = Path(__file__).resolve().parents[2]


def test_every_field_has_a_docstring_and_a_flag():
    for cls in (SamplerConfig, LearnerConfig, LaunchConfig):
        docs = field_docs(cls)
        parser = build_parser(cls, "x")
        flags = {a.dest for a in parser._actions}
        for name in flat_fields(cls):   # the flat names flags and docs use
            assert docs.get(name), f"{cls.__name__}.{name} has no docstring"
            if name != "extra":
                assert name in flags


def test_defaults_and_round_trip():
    cfg = parse_config(LearnerConfig, [], "t")
    assert (cfg.run.data_port, cfg.run.sync_port) == (5555, 5556)
    cfg2 = parse_config(LearnerConfig, ["--beta", "0.5", "--no-deepspeed", "--max-steps", "3"], "t")
    assert (cfg2.loss.beta, cfg2.training.no_deepspeed, cfg2.training.max_steps) == (0.5, True, 3)
    assert parse_config(LearnerConfig, to_flags(cfg2), "t") == cfg2


def test_unknown_flag_is_one_line_exit_2(capsys):
    with pytest.raises(SystemExit) as e:
        parse_config(SamplerConfig, ["--no-such-flag"], "sampling_worker.py")
    assert e.value.code == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "--no-such-flag" in err[0]


def test_deepspeed_json_is_the_configs():
    from grpo.config import DEEPSPEED

    assert json.loads((ROOT / "deepspeed.json").read_text()) == DEEPSPEED   # one place: grpo/config/training.py


def test_deepspeed_json_auto_values():
    raw = json.loads((ROOT / "deepspeed.json").read_text())
    # The flags own the batch size and the learning rate; DeepSpeed owns the micro-batch size.
    assert raw["train_batch_size"] == "auto" and raw["optimizer"]["params"]["lr"] == "auto"
    assert raw["train_micro_batch_size_per_gpu"] == 32
    assert raw["zero_optimization"]["stage"] == 2
    assert TrainingSection.train_batch_size == 16                # the default lives in the typed config
    cfg, batch = resolve_ds_config(raw, world=3, train_batch_size=16, group_size=8, learning_rate=1e-6, cuda=True)
    assert batch == 16
    assert cfg["gradient_accumulation_steps"] == 1          # ceil(16 / (32 * 3))
    assert cfg["train_batch_size"] == 32 * 1 * 3             # what DeepSpeed's own check needs
    cfg, _ = resolve_ds_config(raw, world=1, train_batch_size=128, group_size=8, learning_rate=1e-6, cuda=True)
    assert cfg["gradient_accumulation_steps"] == 4          # ceil(128 / 32): 4 micro-steps, not 32
    assert cfg["bf16"]["enabled"] is True and cfg["optimizer"]["params"]["lr"] == 1e-6
    cfg, _ = resolve_ds_config(raw, world=4, train_batch_size=16, group_size=8, learning_rate=1e-6, cuda=False)
    assert cfg["gradient_accumulation_steps"] == 1 and cfg["bf16"]["enabled"] is False
    with pytest.raises(ConfigError, match="multiple of"):
        resolve_ds_config(raw, world=1, train_batch_size=12, group_size=8, learning_rate=1e-6, cuda=False)


@pytest.mark.parametrize("asked,cuda,lora,deepspeed,resolved", [
    ("auto", True, False, True, "autocast"),     # full fine-tuning: TRL's numerics
    ("auto", True, True, True, "bf16"),          # LoRA: the frozen base stays bf16
    ("auto", True, True, False, "autocast"),     # plain AdamW has no master copies
    ("auto", False, False, True, "fp32"),        # CPU
    ("bf16", True, False, True, "bf16"),
    ("autocast", True, True, True, "autocast"),
    ("fp32", False, True, False, "fp32"),
])
def test_precision_rule(asked, cuda, lora, deepspeed, resolved):
    from grpo.config import resolve_precision

    assert resolve_precision(asked, cuda, lora, deepspeed) == resolved


@pytest.mark.parametrize("asked,cuda,deepspeed,needle", [
    ("bf16", True, False, "drop --no-deepspeed"), ("autocast", False, True, "needs a CUDA device"),
    ("half", True, True, "choose one of")])
def test_precision_rule_refusals(asked, cuda, deepspeed, needle):
    from grpo.config import resolve_precision

    with pytest.raises(ValueError, match=needle):
        resolve_precision(asked, cuda, False, deepspeed)


def test_precision_owns_deepspeeds_bf16_switch():
    raw = json.loads((ROOT / "deepspeed.json").read_text())
    assert raw["bf16"]["enabled"] == "auto"
    kw = dict(world=1, train_batch_size=16, group_size=8, learning_rate=1e-6)
    # autocast: DeepSpeed gets float32 weights (the learner wraps the forward in torch.autocast)
    assert resolve_ds_config(raw, cuda=True, precision="autocast", **kw)[0]["bf16"]["enabled"] is False
    assert resolve_ds_config(raw, cuda=True, precision="bf16", **kw)[0]["bf16"]["enabled"] is True
    raw["bf16"]["enabled"] = True
    with pytest.raises(ConfigError, match=r"bf16.enabled is True but --precision resolves to autocast.*"
                                          r"--precision bf16"):
        resolve_ds_config(raw, cuda=True, precision="autocast", **kw)
    assert resolve_ds_config(raw, cuda=False, precision="fp32", **kw)[0]["bf16"]["enabled"] is False   # CPU: off


def test_deepspeed_json_number_contradicting_a_flag_is_an_error_naming_both(tmp_path, capsys):
    raw = json.loads((ROOT / "deepspeed.json").read_text())
    raw["train_batch_size"] = 32
    with pytest.raises(ConfigError, match=r"train_batch_size is 32 but --train-batch-size is 16"):
        resolve_ds_config(raw, world=1, train_batch_size=16, group_size=8, learning_rate=1e-6, cuda=False)
    cfg, batch = resolve_ds_config(raw, world=1, train_batch_size=32, group_size=8, learning_rate=1e-6, cuda=False)
    assert batch == 32                                       # the same number: no contradiction
    raw["train_batch_size"] = "auto"
    raw["optimizer"]["params"]["lr"] = 1e-5
    with pytest.raises(ConfigError, match=r"optimizer.params.lr is 1e-05 but --learning-rate is 1e-06"):
        resolve_ds_config(raw, world=1, train_batch_size=16, group_size=8, learning_rate=1e-6, cuda=False)
    cfg, _ = resolve_ds_config(raw, world=1, train_batch_size=16, group_size=8, learning_rate=1e-5, cuda=False)
    assert cfg["optimizer"]["params"]["lr"] == 1e-5
    # A learner given such a file stops with one line naming the file, the key and the flag.
    path = tmp_path / "ds.json"
    path.write_text(json.dumps(raw))
    from grpo.workers import learner_main

    rc = learner_main(["--device", "cpu", "--deepspeed-config", str(path), "--learning-rate", "3e-6",
                       "--run-dir", str(tmp_path / "run"), "--data-port", "1", "--sync-port", "2"])
    err = capsys.readouterr().err.strip().splitlines()
    assert rc == 2 and len(err) == 1, err
    assert str(path) in err[0] and "optimizer.params.lr" in err[0] and "--learning-rate is 3e-06" in err[0]


def _plan(argv, cuda_count):
    cfg, to_s, to_l = parse(argv)
    return plan(cfg, cuda_count, to_s, to_l, master_port=29999)


@pytest.mark.parametrize("gpus", [["--training-gpus", "1,2,3"], ["--training-gpus", " 1, 2,3 "]])
def test_plan_one_sampler_three_learner_gpus(gpus):
    specs = _plan(["--sampling-gpu", "0", *gpus], cuda_count=4)
    learners = [s for s in specs if s.role == "learner"]
    samplers = [s for s in specs if s.role == "sampler"]
    assert [s.env["CUDA_VISIBLE_DEVICES"] for s in learners] == ["1,2,3"] * 3
    assert [s.env["LOCAL_RANK"] for s in learners] == ["0", "1", "2"]
    assert {s.env["WORLD_SIZE"] for s in learners} == {"3"}
    # the sampler's own GPU first (its cuda:0), then learner rank 0's, which ipc weight sync maps
    assert [s.env["CUDA_VISIBLE_DEVICES"] for s in samplers] == ["0,1"]
    assert "--device" in learners[0].argv and learners[0].argv[learners[0].argv.index("--device") + 1] == "cuda"


def test_plan_two_samplers_and_shared_gpu():
    specs = _plan(["--sampling-gpus", "0,1", "--training-gpus", "0", "--share-gpus"], cuda_count=2)
    samplers = [s for s in specs if s.role == "sampler"]
    assert [s.env["CUDA_VISIBLE_DEVICES"] for s in samplers] == ["0", "1,0"]
    assert [s.argv[s.argv.index("--sampler-id") + 1] for s in samplers] == ["0", "1"]
    assert {s.argv[s.argv.index("--num-samplers") + 1] for s in samplers} == {"2"}


def test_plan_cpu_and_errors():
    specs = _plan(["--device", "cpu", "--training-ranks", "2", "--num-samplers", "2", "--max-steps", "3",
                   "--beta", "0.1", "--prompts-per-round", "7", "--dataset", "x"], cuda_count=0)
    assert [s.name for s in specs] == ["learner0", "learner1", "sampler0", "sampler1"]
    assert all(s.env["CUDA_VISIBLE_DEVICES"] == "" for s in specs)
    assert "--beta" in specs[0].argv and "--beta" not in specs[2].argv      # learner-only flag
    assert "--prompts-per-round" in specs[2].argv and "--prompts-per-round" not in specs[0].argv  # sampler-only
    # --dataset is common: the learner reads it for --curriculum and its evaluation
    assert all(s.argv[s.argv.index("--dataset") + 1] == "x" for s in specs)
    with pytest.raises(LaunchError, match="GPU 5 does not exist"):
        _plan(["--sampling-gpu", "0", "--training-gpus", "5"], cuda_count=2)
    with pytest.raises(LaunchError, match="CUDA is not available"):
        _plan(["--sampling-gpu", "0", "--training-gpus", "1"], cuda_count=0)
    with pytest.raises(LaunchError, match="twice"):
        _plan(["--training-gpus", "1,1"], cuda_count=4)


def test_split_passthrough_routes_and_rejects():
    to_s, to_l = split_passthrough(["--temperature", "0.7", "--learning-rate=1e-5", "--no-scale-rewards"])
    assert to_s == ["--temperature", "0.7"] and to_l == ["--temperature", "0.7", "--learning-rate=1e-5",
                                                         "--no-scale-rewards"]
    with pytest.raises(LaunchError, match="unknown flag --bogus"):
        split_passthrough(["--bogus", "1"])


def test_launcher_help_lists_the_options_it_passes_on_by_section(capsys):
    from grpo.config import SECTIONS

    with pytest.raises(SystemExit) as exc:
        parse(["--help"])
    assert exc.value.code == 0
    out = capsys.readouterr().out
    assert out.startswith("usage: run_distributed.py [options]\n")   # not every option twice
    at = [out.index(f"\n{title}:\n  {line.split()[0]}") for title, line in SECTIONS.items()]
    assert at == sorted(at)                                             # every section, in SECTIONS's order
    section = {title: out[start:end] for title, start, end in zip(SECTIONS, at, at[1:] + [len(out)])}

    def option(title: str, flag: str) -> str:
        """The help of `flag` in `title`'s section, joined into one line."""
        text = section[title]
        start = text.index(f"\n  {flag}")
        end = text.find("\n  --", start + 1)
        return " ".join(text[start:end if end > 0 else len(text)].split())

    assert "(to the samplers; default: 'correctness')" in option("data and rewards", "--reward ")
    assert "to the samplers; at least 0; default: 0)" in option("rollout", "--prompts-per-round")
    assert "(to the learner; at least 0; default: 1e-06)" in option("training", "--learning-rate")
    assert "(to the learner; at least 0; default: 0)" in option("training", "--lora-r")
    assert "to both; default: False)" in option("rollout", "--[no-]filter-zero-signal")
    assert "--filter-zero-signal" not in section["loss"]               # both roles' option: listed once
    assert "default: 'openai/gsm8k')" in option("data and rewards", "--dataset ")       # common: the launcher's own
    assert " to " not in option("data and rewards", "--dataset ").split("(default")[-1]
    assert option("placement", "--sampling-gpus").startswith("--sampling-gpus, --sampling-gpu TEXT")
    assert "--sampler-id" not in out and "--gpu-id" not in out        # the launcher sets those itself
    assert out.count("\n  --num-generations") == 1                    # a common option: listed once
