"""The docs as tests: every command in the fenced bash blocks of README.md and docs/*.md either runs
here as written or is checked by parsing, so a documented command that stops working fails the suite.

Conventions (the docs keep them; docs/operations.md, "Tests", says them for writers):
  - A command runs here when it is a CPU one: `python run_distributed.py` whose --device (on the line
    or in its --config file) is cpu, and `python -m grpo...` tools. It runs in a folder beside
    ../shared (so `../shared/data/gsm8k` is the real data set), with free ports and a run folder
    added (the docs' ports are the defaults, which other runs on this machine may hold), and must
    exit 0 having trained to its --max-steps. A launcher line that names no --model runs with
    --model tiny-random: the suite pays for every command at every `make test`, and the default
    model's CPU run is run by tests/e2e/test_e2e.py (the docs give its times, measured by hand).
  - Every other command is checked without starting anything: its flags parsed as its script
    parses them, and a launcher line planned as the launcher plans it (on a made-up machine of 8
    GPUs), so an unknown flag or a bad value fails. GPU commands are these: those with --gpus,
    --sampling-gpu(s), --training-gpus, --gpu-id, --nodes, or no --device cpu.
  - `...` stands for flags left out (checked: the ones shown); `[--flag]` is optional (checked with
    it); a line that begins with `--` is a fragment of a launcher command; `$k` is 0; a redirection,
    `&` or `&&` ends the command.
  - Placeholders are files the test makes: a fenced block whose first line is `# NAME.py` or
    `# NAME.yaml` is written as NAME (my_data.py, my_reward.py, run.yaml), and `data/` holds a
    small data set in each form the docs name (mine.parquet, mine.jsonl, raw.csv, train/test.jsonl).
  - COVERED: commands another test already runs as a user would; here they are parsed and planned
    like the GPU ones, and that test is checked to be still there, so the suite does not pay twice.
"""
from __future__ import annotations

import json
import os
import re
import shlex
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import pytest
import yaml
from netutil import free_ports

from grpo.config import LearnerConfig, SamplerConfig
from grpo.flags import parse_config

ROOT = Path(__file__).resolve().parents[1]
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
SCRIPTS = {"run_distributed.py", "sampling_worker.py", "training_worker.py", "communication_test.py"}
# Words a bash block may begin a line with that are not ours to run: install steps and shell.
SHELL = {"pip", "-m venv", "cd", "for", "done", "wait"}
GPU_FLAGS = {"--gpus", "--sampling-gpu", "--sampling-gpus", "--training-gpu", "--training-gpus", "--gpu-id",
             "--nodes"}
# Commands another test runs as a user would: (the command as the docs write it, the test that runs it).
COVERED = {
    "python communication_test.py": ("tests/e2e/test_e2e.py", "def test_communication_test_script"),
    # the same layout, data and tiny model, sized by hand, with more checked on the way
    "python run_distributed.py --device cpu --training-ranks 2 --num-samplers 2 --max-steps 3 --dataset "
    "../shared/data/gsm8k": ("tests/e2e/test_e2e.py", "def test_run_distributed_cpu_two_ranks_two_samplers"),
    # a LoRA learner through the launcher from a YAML file with --beta 0.0 after it: both LoRA examples
    "python run_distributed.py --config run.yaml --beta 0.0":
        ("tests/learner/test_lora.py", "def test_lora_run_distributed_zero2_with_config_file"),
    "python run_distributed.py --device cpu --model tiny-random --lora-r 4 --lora-target-modules q_proj,v_proj "
    "--max-steps 2 --num-generations 4 --prompts-per-round 2 --train-batch-size 8 --max-new-tokens 16 --dataset "
    "../shared/data/gsm8k": ("tests/learner/test_lora.py", "def test_lora_run_distributed_zero2_with_config_file"),
    # the suite itself, and the demo: its run is 60 s by design (max_time_s); its configs are held to
    # the launcher's and the workers' parsers there
    "make test": ("Makefile", "test: lint"),
    "make demo": ("tests/launch/test_demo_configs.py", "def test_demo_config_reaches_every_role"),
}


@dataclass
class Command:
    page: str
    line: int
    text: str          # as written, continuation lines joined, comment dropped
    argv: list[str]    # shell words, `...` and brackets taken out, $k as 0

    def __str__(self):
        return f"{self.page}:{self.line}: {self.text}"


def blocks(page: Path, lang: str) -> list[tuple[int, list[str]]]:
    """(first line's number, lines) of each ```lang fenced block of `page`."""
    out, lines, start = [], None, 0
    for n, line in enumerate(page.read_text().splitlines(), 1):
        if lines is None and line.strip() == f"```{lang}":
            lines, start = [], n + 1
        elif lines is not None and line.strip().startswith("```"):
            out.append((start, lines))
            lines = None
        elif lines is not None:
            lines.append(line)
    return out


def commands() -> list[Command]:
    found = []
    for page in PAGES:
        for start, lines in blocks(page, "bash"):
            i = 0
            while i < len(lines):
                first, text = i, lines[i]
                while text.rstrip().endswith("\\") and i + 1 < len(lines):
                    i += 1
                    text = text.rstrip()[:-1] + " " + lines[i].strip()
                i += 1
                words = shlex.split(text.replace("$k", "0"), comments=True)
                if not words:
                    continue
                shown = " ".join(shlex.split(text, comments=True))
                # the command itself: up to a redirection, a background & or the next command
                cut = next((j for j, w in enumerate(words) if w in ("&", "&&", "|", ";") or
                            re.match(r"\d?>", w)), len(words))
                argv = [w.strip("[]") for w in words[:cut] if "..." not in w]
                found.append(Command(str(page.relative_to(ROOT)), start + first, shown, argv))
    return found


ALL = commands()


def script_and_args(cmd: Command) -> tuple[str, list[str]]:
    """('run_distributed.py', its flags), ('-m grpo.data', ...), ('deepspeed', the worker's flags),
    ('make', [target]), ('--', a fragment), or (the shell word, [])."""
    argv = [w for w in cmd.argv if not re.fullmatch(r"[A-Z_]+=.*", w)]   # CUDA_VISIBLE_DEVICES=0 python ...
    head = argv[0]
    if head.startswith("--"):
        return "--", argv
    if head == "python" and argv[1] == "-m":
        return f"-m {argv[2]}", argv[3:]
    if head == "python":
        return argv[1], argv[2:]
    if head == "deepspeed":
        at = next(i for i, w in enumerate(argv) if w.endswith("training_worker.py"))
        return "deepspeed", argv[at + 1:]
    return head, argv[1:]


def placeholders() -> dict[str, str]:
    """NAME: text of each fenced python or yaml block whose first line is `# NAME.py` / `# NAME.yaml`."""
    files = {}
    for page in PAGES:
        for lang in ("python", "yaml"):
            for _, lines in blocks(page, lang):
                if lines and (m := re.fullmatch(r"#\s*([\w.-]+\.(?:py|yaml))\b.*", lines[0].strip())):
                    files[m.group(1)] = "\n".join(lines) + "\n"
    return files


PLACEHOLDERS = placeholders()


def yaml_keys(args: list[str]) -> set[str]:
    """The keys (underscored) of the --config file of a launcher line: a placeholder or a file of the tree."""
    if "--config" not in args:
        return set()
    name = args[args.index("--config") + 1]
    data = yaml.safe_load(PLACEHOLDERS.get(name) or (ROOT / name).read_text()) or {}
    return {str(k).replace("-", "_") for k in data}


def runs_on_cpu(script: str, args: list[str]) -> bool:
    """Whether the suite runs this command: a launcher line on --device cpu (the line's, or its
    --config file's: a placeholder or a file of the tree), or one of our python -m tools."""
    if script.startswith("-m grpo"):
        return True
    if script != "run_distributed.py" or GPU_FLAGS & {a.partition("=")[0] for a in args}:
        return False
    device = "auto"
    if "--config" in args:
        name = args[args.index("--config") + 1]
        text = PLACEHOLDERS.get(name) or (ROOT / name).read_text()
        device = (yaml.safe_load(text) or {}).get("device", device)
    if "--device" in args:
        device = args[args.index("--device") + 1]
    return device == "cpu"


@pytest.fixture(scope="module")
def workdir(tmp_path_factory):
    """A folder beside a `shared` that is ../shared, holding every file the docs name as a placeholder."""
    top = tmp_path_factory.mktemp("docs")
    (top / "shared").symlink_to(ROOT.parent / "shared")
    work = top / "work"
    (work / "data").mkdir(parents=True)
    for name, text in PLACEHOLDERS.items():
        (work / name).write_text(text)
    gsm8k = [json.loads(x) for x in (ROOT.parent / "shared" / "data" / "gsm8k" / "train.jsonl").read_text()
             .splitlines()[:32]]
    for split in ("train", "test"):
        (work / "data" / f"{split}.jsonl").write_text("".join(json.dumps(r) + "\n" for r in gsm8k))
    (work / "data" / "mine.jsonl").write_text("".join(json.dumps(r) + "\n" for r in gsm8k))
    # my_data.to_gsm8k's layout (docs/data-and-rewards.md): a problem and its result
    import pandas as pd

    raw = pd.DataFrame({"problem": [r["question"] for r in gsm8k],
                        "result": [r["answer"].rpartition("####")[2].strip() for r in gsm8k]})
    raw.to_parquet(work / "data" / "mine.parquet")
    raw.to_csv(work / "data" / "raw.csv", index=False)
    return work


def test_every_command_is_known():
    """Every line of a bash block is a command this test checks or runs, or an install or shell word:
    a new kind of command needs a decision here, not silence."""
    kinds = {script_and_args(c)[0] for c in ALL}
    assert kinds <= SCRIPTS | SHELL | {"--", "deepspeed", "make"} | {k for k in kinds if k.startswith("-m grpo")}, kinds
    # the docs have commands of every kind the conventions name, so the parser below is not vacuous
    assert {"run_distributed.py", "--", "deepspeed", "make", "-m grpo.data"} <= kinds
    assert sum(run_here(c) for c in ALL) >= 3 and set(COVERED) <= {c.text for c in ALL}   # none left stale


def run_here(cmd: Command) -> bool:
    return runs_on_cpu(*script_and_args(cmd)) and cmd.text not in COVERED


@pytest.mark.parametrize("cmd", [c for c in ALL if not run_here(c)], ids=str)
def test_a_command_not_run_here_parses(cmd, workdir, monkeypatch):
    """Flags known and values valid, as the script parses them; a launcher line also planned as the
    launcher plans it (GPUs chosen, processes placed, each role's flags parsed) on 8 GPUs."""
    from grpo.launch import main as launch_main
    from grpo.launch import nodes
    from grpo.launch.plan import check_gpus_flags, choose_gpus, parse, plan, plan_instances

    monkeypatch.chdir(workdir)   # --config run.yaml and the like name the placeholders made there
    script, args = script_and_args(cmd)
    if cmd.text in COVERED:
        path, marker = COVERED[cmd.text]
        assert marker in (ROOT / path).read_text(), f"{cmd}: {path} no longer runs it"
    if script == "make":
        assert re.search(rf"^{re.escape(args[0])}:", (ROOT / "Makefile").read_text(), re.M), cmd
    elif script in SHELL or script == "communication_test.py":   # install words; the smoke test, COVERED
        return
    elif script in ("sampling_worker.py",):
        parse_config(SamplerConfig, args, script)
    elif script in ("training_worker.py", "deepspeed"):
        parse_config(LearnerConfig, args, "training_worker.py")
    else:
        if script == "--":   # a fragment of a launcher line: the flags it shows
            args = ["--device", "cpu", *args]
        assert script in ("--", "run_distributed.py"), cmd
        cfg, to_s, to_l = parse(args)
        check_gpus_flags(cfg)
        if cfg.nodes.nodes:
            nodes.plan_nodes(cfg, to_s, to_l)
            return
        if cfg.placement.gpus:
            cfg, _ = choose_gpus(cfg, 8, *launch_main.layout_inputs(cfg, to_l))
        if cfg.instances.instances != 1 or cfg.instances.seeds:
            plan_instances(cfg, 8)
        else:
            launch_main.check_role_flags(plan(cfg, 0 if cfg.run.device == "cpu" else 8, to_s, to_l, 29500))


def steps_made(run_dir: Path) -> tuple[int, int]:
    """(the last step in metrics.jsonl, the learner's --max-steps) of a finished run."""
    records = [json.loads(x) for x in (run_dir / "metrics.jsonl").read_text().splitlines() if x.strip()]
    last = max((r["step"] for r in records if not r.get("final") and "step" in r), default=0)
    return last, json.loads((run_dir / "config_learner.json").read_text())["max_steps"]


@pytest.mark.slow
@pytest.mark.parametrize("cmd", [c for c in ALL if run_here(c)], ids=str)
def test_a_cpu_command_runs_as_written(cmd, workdir):
    """Exit 0, and a launcher run trains to its last step: within the timeout, which is far above what
    each took here (docs/configuration.md lists them), so only a command that stopped working or
    became many times slower fails."""
    script, args = script_and_args(cmd)
    if script == "run_distributed.py":
        data, sync = free_ports(2)
        run_dir = workdir / "runs" / f"{Path(cmd.page).stem}-{cmd.line}"
        small = [] if "--model" in args or "model" in yaml_keys(args) else ["--model", "tiny-random"]
        argv = [str(ROOT / script), *args, *small, "--data-port", str(data), "--sync-port", str(sync),
                "--run-dir", str(run_dir)]
    else:
        argv = [*script.split(), *args]
    env = dict(os.environ, CUDA_VISIBLE_DEVICES="", PYTHONUNBUFFERED="1",
               PYTHONPATH=os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]))
    start = time.monotonic()
    r = subprocess.run([sys.executable, *argv], cwd=workdir, env=env, capture_output=True, text=True, timeout=480)
    took = time.monotonic() - start
    assert r.returncode == 0, f"{cmd}\n{r.stdout[-3000:]}\n{r.stderr[-3000:]}"
    if script == "run_distributed.py":
        last, max_steps = steps_made(run_dir)
        assert last == max_steps, (cmd, last, max_steps)
        if not {"num_generations", "train_batch_size", "max_new_tokens"} & (
                {a[2:].replace("-", "_") for a in args} | yaml_keys(args)):
            # nobody sized it: the launcher did, for CPU, and said so (grpo.launch.cpusize)
            assert "[launcher] on CPU: --num-generations 4 --train-batch-size 8 --max-new-tokens 64" in r.stdout, r.stdout
            learner = json.loads((run_dir / "config_learner.json").read_text())
            assert (learner["num_generations"], learner["train_batch_size"], learner["max_new_tokens"]) == (4, 8, 64)
    print(f"{cmd}: {took:.0f} s")
