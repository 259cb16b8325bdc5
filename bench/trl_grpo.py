"""TRL's GRPOTrainer on this repo's GSM8K prompts and correctness reward: the trl rows of bench/benchmark.py.

bench/benchmark.py launches it as plain DDP through torchrun, one process per GPU, each generating
its share of the batch with Hugging Face `generate` (with --use-vllm: vLLM in TRL's colocate mode)
and training on it:
  python -m torch.distributed.run --standalone --nproc_per_node 2 bench/trl_grpo.py \
      --dataset .data/gsm8k --out runs/trl/steps.json [--seconds 150 --train-batch-size 64 ...]
CPU smoke check (a tiny random model, gloo):  add --device cpu --model tiny-random --max-steps 3
Needs trl and datasets; the GPU machine has neither and no network, so carry the wheels and
  python3 -m pip install -q --no-index --no-deps --target /tmp/site_trl .whl_trl/*.whl
  export PYTHONPATH=/tmp/site_trl:$PYTHONPATH
(.whl_trl/: trl 1.16.0, datasets 5.2.0, dill 0.4.1, multiprocess 0.70.19; the rest is on that machine).

Kept equal to our trainer: the model folder (grpo.model.zoo.resolve_model), the prompt text
(grpo.data.problem_prompt, tokenised without special tokens like our sampler), the reward
(grpo.reward_funcs.correctness_reward, already TRL's calling convention), G, completions per
optimizer step over all ranks, max new tokens, temperature (pure sampling: top_p 1, top_k 0),
learning rate, beta, loss type 'grpo', clip 0.2, AdamW betas (0.9, 0.99), grad clip 1, constant LR.
Every optimizer step generates fresh completions: gradient_accumulation_steps = steps_per_generation
(1 unless --micro-batch splits a device's share), num_iterations = 1, so one step = one generation of
the whole global batch, as in ours.
Rank 0 writes --out: one record per step (its end, seconds since training began, synchronised
with the GPU), completions and completion tokens of the step, mean reward; benchmark.py turns them into rates.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

import torch
import torch.distributed as dist
from transformers import TrainerCallback

sys.path.insert(0, str(Path(__file__).resolve().parent))
from benchutil import versions  # noqa: E402  (also puts the repo root on sys.path)

from grpo.data.prompts import problem_prompt  # noqa: E402
from grpo.data.rewards import correctness_reward  # noqa: E402
from grpo.data.sources import load_problems  # noqa: E402
from grpo.learner.checkpoint import parse_save_schedule  # noqa: E402
from grpo.model.zoo import resolve_model  # noqa: E402
from grpo.obs.rundir import provenance  # noqa: E402


def parse(argv=None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(allow_abbrev=False, description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="smollm2", help="as our --model: smollm2, tiny-random, or a path/hub id")
    ap.add_argument("--dataset", required=True)
    ap.add_argument("--dataset-limit", type=int, default=0, help="first N train problems only (0: all)")
    ap.add_argument("--num-generations", type=int, default=8)
    ap.add_argument("--train-batch-size", type=int, default=64, help="completions per optimizer step, all ranks")
    ap.add_argument("--max-new-tokens", type=int, default=256)
    ap.add_argument("--learning-rate", type=float, default=1e-6)
    ap.add_argument("--beta", type=float, default=0.0)
    ap.add_argument("--loss-type", default="grpo", choices=["grpo", "dapo", "dr_grpo", "bnpo"],
                    help="TRL's loss_type; ours has the same names (grpo.loss.reduce_loss)")
    ap.add_argument("--temperature", type=float, default=1.0)
    ap.add_argument("--seconds", type=float, default=150.0,
                    help="stop after the step that ends past this (seconds of training, or since --launch-time)")
    ap.add_argument("--launch-time", type=float, default=0.0,
                    help="Unix time the command was launched (bench/benchmark.py): --seconds and "
                         "--save-every-s then count from it, not from the start of training")
    ap.add_argument("--save-every-s", type=float, default=0.0,
                    help="save the policy (bf16, as ours samples) to --save-dir/step_N/ every this many seconds of "
                         "wall time and after the last step, with weights.json {step, wall_time, seconds}; 0: off")
    ap.add_argument("--save-schedule", default="",
                    help="instead of --save-every-s: saves on a schedule of periods 'PxN,...,P', every P seconds N "
                         "times, ..., then every P (the learner's --save-weights-schedule), e.g. '15x8,30'")
    ap.add_argument("--save-dir", default="", help="where --save-every-s or --save-schedule writes")
    ap.add_argument("--max-steps", type=int, default=100000)
    ap.add_argument("--dtype", default="bfloat16", choices=["bfloat16", "float32"],
                    help="weights; bfloat16: TRL's fastest plain setting (no per-matmul cast in generate); "
                         "float32: TRL's default, bf16 autocast over fp32 weights")
    ap.add_argument("--micro-batch", type=int, default=0,
                    help="completions per device in one forward/backward (0: the whole per-device share); the "
                         "share is then trained in gradient_accumulation_steps of this size, still one "
                         "generation and one optimizer step")
    ap.add_argument("--gradient-checkpointing", action="store_true",
                    help="TRL's default for GRPOConfig; off unless given (a 135M model does not need it)")
    ap.add_argument("--use-vllm", action="store_true",
                    help="generate with vLLM in TRL's colocate mode (vllm_mode='colocate': an engine inside "
                         "each training process, weights copied into it every step) instead of Hugging Face generate")
    ap.add_argument("--vllm-gpu-memory-utilization", type=float, default=0.3,
                    help="--use-vllm: the share of the GPU vLLM may take (TRL's default)")
    ap.add_argument("--device", default="auto", choices=["auto", "cuda", "cpu"])
    ap.add_argument("--seed", type=int, default=42)
    ap.add_argument("--out", required=True, help="JSON file for the per-step records (rank 0)")
    args = ap.parse_args(argv)
    try:
        # [(period, times)] (grpo.learner.checkpoint.parse_save_schedule); None: no saves
        args.schedule = (parse_save_schedule(args.save_schedule) if args.save_schedule
                         else [(args.save_every_s, None)] if args.save_every_s > 0 else None)
    except ValueError as e:
        ap.error(str(e))
    return args


def build_dataset(tok, spec: str, limit: int, seed: int):
    """The train problems as TRL rows, and our correctness reward in TRL's calling convention. The rows
    carry the problem's index, not its reasoning-gym entry (a nested dict of task-specific fields
    that Arrow would force into one schema); the reward looks the entry up, as our sampler passes it."""
    from datasets import Dataset

    problems = load_problems(spec, "train", limit=limit or None, seed=seed)
    # The exact text our sampler feeds the model (chat template applied, '####' instruction);
    # TRL tokenises a plain-string prompt as is, so we check it adds no special tokens either.
    rows = [{"prompt": problem_prompt(tok, p), "answer": p.answer, "idx": i} for i, p in enumerate(problems)]
    probe = rows[0]["prompt"]
    if tok(probe)["input_ids"] != tok(probe, add_special_tokens=False)["input_ids"]:
        raise SystemExit("trl_grpo: the tokenizer adds special tokens to a prompt; TRL's prompts would differ from ours")

    def correctness(prompts, completions, answer, idx, **kwargs):
        cols = [problems[i].columns for i in idx]
        return correctness_reward(prompts, completions, answer, rg_task=[c.get("rg_task") for c in cols],
                                  rg_entry=[c.get("rg_entry") for c in cols])

    return Dataset.from_list(rows), correctness


class TimedSaves(TrainerCallback):
    """--save-every-s / --save-schedule: the policy at each mark of `schedule` ([(period s, times or
    None)], seconds of wall time since `t0`) and after the last step, by our
    learner's own saver (grpo/learner/checkpoint.py TimedWeights: the same marks, the same layout),
    cast to bf16 (the dtype our samplers and the evaluator decode in) so both systems' files are alike."""

    def __init__(self, schedule: list[tuple[float, int | None]], dest: Path, t0: float, tok):
        from grpo.learner.checkpoint import TimedWeights

        self.saver, self.tok = TimedWeights(dest, schedule[0][0], t0, schedule), tok

    def on_step_end(self, args, state, control, model=None, **kw):
        if state.is_world_process_zero and self.saver.due(time.time(), last=control.should_training_stop):
            self.saver.save(model, self.tok, state.global_step, torch.bfloat16)

    def on_train_end(self, args, state, control, model=None, **kw):
        if state.is_world_process_zero:
            self.saver.save(model, self.tok, state.global_step, torch.bfloat16)


class Clock(TrainerCallback):
    """Records each step's end; stops every rank together once `seconds` of training have passed."""

    def __init__(self, seconds: float, batch: int, cuda: bool, launch_time: float = 0.0):
        self.seconds, self.batch, self.cuda, self.launch_time = seconds, batch, cuda, launch_time
        self.t0 = 0.0
        self.steps: list[dict] = []
        self.logs: dict[int, dict] = {}

    def on_train_begin(self, args, state, control, **kw):
        if self.cuda:
            torch.cuda.synchronize()
        self.t0 = time.perf_counter()

    def on_step_end(self, args, state, control, **kw):
        if self.cuda:  # the step's kernels are only queued; count the step when they are done
            torch.cuda.synchronize()
        t = time.perf_counter() - self.t0
        # wall_time: the step's end on the Unix clock, so its time from the launch is known
        # (benchmark.py's first_step_s); time_s counts from the start of training.
        self.steps.append({"step": state.global_step, "time_s": t, "wall_time": time.time(), "completions": self.batch})
        elapsed = time.time() - self.launch_time if self.launch_time else t
        # Each rank reads its own clock; rank 0 decides for all, or one rank could stop while
        # the others wait for it in the next all-reduce.
        if _agree(elapsed >= self.seconds, self.cuda):
            control.should_training_stop = True

    def on_log(self, args, state, control, logs=None, **kw):
        if logs and "completions/mean_length" in logs:  # logging_steps=1: one record per step
            self.logs[state.global_step] = dict(logs)


def _agree(flag: bool, cuda: bool) -> bool:
    if not (dist.is_available() and dist.is_initialized()):
        return flag
    t = torch.tensor([1.0 if flag else 0.0], device=torch.device("cuda", torch.cuda.current_device()) if cuda else "cpu")
    dist.broadcast(t, 0)
    return bool(t.item())


def main(argv=None) -> int:
    args = parse(argv)
    t_start = time.perf_counter()
    launch = args.launch_time or time.time()
    cuda = args.device == "cuda" or (args.device == "auto" and torch.cuda.is_available())
    world = int(os.environ.get("WORLD_SIZE", "1"))
    B, G = args.train_batch_size, args.num_generations
    if B % world or B % G:
        raise SystemExit(f"trl_grpo: --train-batch-size {B} must be a multiple of the {world} ranks and of G={G}")
    share = B // world
    micro = args.micro_batch or share
    if share % micro:
        raise SystemExit(f"trl_grpo: --micro-batch {micro} must divide the per-device share {share} (B/ranks)")
    accum = share // micro
    import trl
    from transformers import AutoTokenizer
    from trl import GRPOConfig, GRPOTrainer

    model_path = resolve_model(args.model)
    tok = AutoTokenizer.from_pretrained(model_path, padding_side="left")
    dataset, reward = build_dataset(tok, args.dataset, args.dataset_limit, args.seed)
    out_dir = Path(args.out).resolve().parent
    cfg = GRPOConfig(
        output_dir=str(out_dir / "trl_output"), report_to=[], logging_steps=1, save_strategy="no",
        disable_tqdm=True, seed=args.seed, use_cpu=not cuda, bf16=cuda,
        model_init_kwargs={"dtype": args.dtype if cuda else "float32"},
        gradient_checkpointing=args.gradient_checkpointing,
        # One generation of the whole global batch per optimizer step, trained in `accum` micro-batches:
        # steps_per_generation counts micro-steps, so it equals the accumulation.
        per_device_train_batch_size=micro, gradient_accumulation_steps=accum,
        steps_per_generation=accum, num_iterations=1, num_generations=G,
        max_completion_length=args.max_new_tokens, temperature=args.temperature, top_p=1.0, top_k=0,
        use_vllm=args.use_vllm, vllm_mode="colocate", vllm_gpu_memory_utilization=args.vllm_gpu_memory_utilization,
        learning_rate=args.learning_rate, lr_scheduler_type="constant", warmup_steps=0,
        adam_beta1=0.9, adam_beta2=0.99, weight_decay=0.0, max_grad_norm=1.0,
        beta=args.beta, epsilon=0.2, loss_type=args.loss_type, scale_rewards="group",
        max_steps=args.max_steps, log_completions=False, dataloader_num_workers=0,
        # Every parameter gets a gradient; left unset, DDP got find_unused_parameters=True (seen in the
        # CPU smoke run), an extra autograd traversal every step.
        ddp_find_unused_parameters=False,
    )
    clock = Clock(args.seconds, B, cuda, args.launch_time)
    callbacks = [clock]
    if args.schedule:   # after the clock: a step that ends the run is saved as the last one
        if not args.save_dir:
            raise SystemExit("trl_grpo: --save-every-s and --save-schedule need --save-dir")
        callbacks.append(TimedSaves(args.schedule, Path(args.save_dir), launch, tok))
    trainer = GRPOTrainer(model=model_path, reward_funcs=[reward], args=cfg,
                          train_dataset=dataset, processing_class=tok, callbacks=callbacks)
    setup_s = time.perf_counter() - t_start
    error = None
    try:
        trainer.train()
    except Exception as e:   # the steps so far still go to --out (with the error), then it re-raises
        error = f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"
        raise
    finally:
        _write_steps(args, clock, cfg, trl.__version__, world, model_path, len(dataset), setup_s, t_start, error)
    return 0


def _write_steps(args, clock, cfg, trl_version, world, model_path, problems, setup_s, t_start, error) -> None:
    B = args.train_batch_size
    rank = dist.get_rank() if dist.is_available() and dist.is_initialized() else 0
    if rank == 0:
        steps = []
        for s in clock.steps:
            log = clock.logs.get(s["step"], {})
            mean_len = log.get("completions/mean_length")
            steps.append({**s, "tokens": None if mean_len is None else mean_len * s["completions"],
                          "completion_len_mean": mean_len, "reward_mean": log.get("reward"),
                          "frac_reward_zero_std": log.get("frac_reward_zero_std"), "grad_norm": log.get("grad_norm"),
                          "entropy": log.get("entropy")})
        # the command line, the code's commit and the seed: what makes this run again
        doc = {**provenance(), "seed": args.seed, "trl": trl_version,
               "versions": {**versions(("vllm",) if args.use_vllm else ()), "trl": trl_version},
               "world_size": world, "per_device_batch": B // world, "model": model_path,
               "problems": problems, "setup_s": setup_s, "total_s": time.perf_counter() - t_start, "error": error,
               "config": {k: getattr(cfg, k) for k in (
                   "per_device_train_batch_size", "gradient_accumulation_steps", "steps_per_generation",
                   "generation_batch_size", "num_iterations", "num_generations", "max_completion_length",
                   "temperature", "top_p", "top_k", "learning_rate", "beta", "loss_type", "epsilon", "bf16",
                   "gradient_checkpointing", "use_vllm", "vllm_mode", "vllm_gpu_memory_utilization",
                   "vllm_importance_sampling_correction", "model_init_kwargs")},
               "steps": steps}
        Path(args.out).write_text(json.dumps(doc, indent=2, default=str) + "\n")
        print(f"trl_grpo: {len(steps)} steps in {steps[-1]['time_s'] if steps else 0:.1f} s of training; "
              f"wrote {args.out}" + (f" (training failed: {error})" if error else ""), flush=True)


if __name__ == "__main__":
    sys.exit(main())
