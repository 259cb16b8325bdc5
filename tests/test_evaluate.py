"""Greedy pass@1 evaluation: batched scoring equals one-at-a-time scoring; the command's output."""
import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from netutil import one_thread  # noqa: F401 - module-wide fixture (autouse)
from scripted import ScriptedEngine

from grpo.data.formats import Problem
from grpo.data.gsm8k import extract_gsm8k_answer
from grpo.data.prompts import build_prompt, problem_prompt
from grpo.evaluate import eval_problems, greedy_accuracy
from grpo.model.load import load_causal_lm, load_tokenizer
from grpo.model.zoo import resolve_model

ROOT = Path(__file__).resolve().parents[1]
GSM8K = ROOT.parent / "shared" / "data" / "gsm8k"


@pytest.fixture(scope="module")
def smollm2():
    """The real model (its greedy text has numbers to score) in fp32, and its tokenizer: loaded once
    for the tests that decode with it (none changes its weights)."""
    path = resolve_model("smollm2")
    return load_causal_lm(path, torch.device("cpu"), torch.float32).eval(), load_tokenizer(path)


def _greedy_one(model, tok, question, max_new):
    ids = tok(build_prompt(tok, question, None), add_special_tokens=False, return_tensors="pt")["input_ids"]
    out = model.generate(input_ids=ids, attention_mask=torch.ones_like(ids), do_sample=False, max_new_tokens=max_new,
                         pad_token_id=tok.pad_token_id, eos_token_id=tok.eos_token_id)
    row = out[0, ids.shape[1]:].tolist()
    if tok.eos_token_id in row:
        row = row[:row.index(tok.eos_token_id)]
    return tok.decode(row, skip_special_tokens=True), len(row)


def test_batched_left_padded_eval_scores_like_one_at_a_time(smollm2):
    torch.manual_seed(0)
    model, tok = smollm2
    # Three problems in batches of two: a full left-padded batch and a ragged last one. Ten greedy
    # tokens are enough for the first problem's text to carry a number (the one "solved" problem).
    base = eval_problems(str(GSM8K), 3)
    assert [p.question for p in base] == [p.question for p in eval_problems(str(GSM8K), 3)]  # a fixed subset
    problems, expect_correct, lengths = [], 0, []
    for i, p in enumerate(base):
        text, n = _greedy_one(model, tok, p.question, 10)
        lengths.append(n)
        got = extract_gsm8k_answer(text)
        # Make every other problem "solved" by the model's own greedy answer, when it gave one:
        # the batched evaluation must find exactly those.
        if got is not None and i % 2 == 0:
            problems.append(Problem(p.question, f"#### {got}"))
            expect_correct += 1
        else:
            problems.append(Problem(p.question, "#### 123456789"))
    assert expect_correct >= 1   # else this test could not tell right from wrong scoring
    res = greedy_accuracy(model, tok, problems, 10, batch_size=2, device=torch.device("cpu"))
    assert res["n"] == 3 and res["correct"] == expect_correct
    assert abs(res["accuracy"] - expect_correct / 3) < 1e-12
    assert abs(res["mean_completion_len"] - sum(lengths) / 3) < 1e-12
    # The sampler's rollout engine (CPU here, no graphs) scores exactly the same way.
    from grpo.generate.engine import RolloutEngine

    eng = RolloutEngine(model, tok.eos_token_id, tok.pad_token_id, cuda_graphs=False)
    res2 = greedy_accuracy(model, tok, problems, 10, batch_size=2, device=torch.device("cpu"), engine=eng)
    assert (res2["correct"], res2["mean_completion_len"], res2["truncated_frac"]) == \
        (res["correct"], res["mean_completion_len"], res["truncated_frac"])


def test_eval_scores_rg_answers_by_the_tasks_own_scorer():
    """Held-out accuracy on rg: tasks whose answers are not numbers is training's correctness
    (reasoning-gym's score_answer), not the GSM8K final-number parser: completions right by the
    task's scorer and wrong by the parser count, and the reverse do not."""
    import reasoning_gym

    from grpo.data.gsm8k import gsm8k_correct
    from grpo.data.prompts import problem_prompt

    tok = load_tokenizer(resolve_model("smollm2"))
    words = eval_problems("rg:spell_backward", 3)        # answers are words
    lists = eval_problems("rg:number_sorting", 3)        # answers are lists of numbers
    cases = [(p, f"I reversed it.\n#### {p.answer}") for p in words]   # right; the parser finds no number
    cases += [(p, f"Sorted:\n#### {p.answer}") for p in lists[:2]]    # right; the parser reads the first number
    last = extract_gsm8k_answer(lists[2].answer)
    cases += [(lists[2], f"#### {last}")]                               # wrong; the parser says right (last number)

    def task_score(p, text):
        return reasoning_gym.get_score_answer_fn(p.columns["rg_task"])(text.split("#### ")[-1], p.columns["rg_entry"])

    expected = [float(task_score(p, t) == 1.0) for p, t in cases]
    assert expected == [1.0] * 5 + [0.0]
    # Every case is one the number parser gets wrong: the old scoring (gsm8k_reward) would fail here.
    assert all(float(gsm8k_correct(t, p.answer)) != e for (p, t), e in zip(cases, expected))
    problems = [p for p, _ in cases]
    script = {tuple(tok(problem_prompt(tok, p), add_special_tokens=False)["input_ids"]): t for p, t in cases}
    res = greedy_accuracy(torch.nn.Module(), tok, problems, 32, batch_size=4, device=torch.device("cpu"),
                          engine=ScriptedEngine(tok, script))
    assert (res["correct"], res["n"]) == (5, 6) and abs(res["accuracy"] - 5 / 6) < 1e-12
    assert res["has_answer"] == 1.0   # every completion marks an answer after '####'


def test_eval_reports_the_answers_a_policy_gives_and_what_one_constant_answer_scores():
    """top_answers: the most common final answers (the reward's own reading of the text) and their
    share of all completions; constant_answer_baseline: one answer for every problem, scored by
    the correctness rule. Hand-worked: 6 problems, references 1, 1, 2, 1, 3, 7."""
    from grpo.evaluate import constant_answer_baseline, top_answers

    tok = load_tokenizer(resolve_model("smollm2"))
    problems = [Problem(f"How many? ({i})", a) for i, a in enumerate(["1", "1", "2", "1", "3", "7"])]
    texts = ["It is 1.\n#### 1", "#### 1", "I count 2, so #### 1", "no idea", "#### 3 letters", "#### 7"]
    # answers read: 1, 1, 1, None, 3, 7 -> '1' 3/6, then '3' and '7' 1/6 each in order of first sight
    assert top_answers(["1", "1", "1", None, "3", "7"]) == [["1", 0.5], ["3", 1 / 6], ["7", 1 / 6]]
    assert top_answers([None, None]) == [] and top_answers([]) == []
    script = {tuple(tok(problem_prompt(tok, p), add_special_tokens=False)["input_ids"]): t
              for p, t in zip(problems, texts)}
    res = greedy_accuracy(torch.nn.Module(), tok, problems, 16, batch_size=4, device=torch.device("cpu"),
                          engine=ScriptedEngine(tok, script))
    assert res["top_answers"] == [["1", 0.5], ["3", 1 / 6], ["7", 1 / 6]]
    assert res["correct"] == 4   # problems 0, 1, 4, 5
    assert constant_answer_baseline(problems) == {"answer": "1", "accuracy": 0.5}
    assert constant_answer_baseline([]) == {"answer": None, "accuracy": 0.0}
    # The benchmark's letter_counting subset: answering '1' to every problem scores 0.354, above
    # the 2x-baseline target (0.316): a policy can reach the goal without counting.
    assert constant_answer_baseline(eval_problems("rg:letter_counting", 500)) == {"answer": "1", "accuracy": 0.354}


def test_eval_prompts_are_the_samplers_training_prompts():
    """For the same problems, evaluation feeds the decoder exactly the prompts a sampler's round
    trains on (grpo.sampler.workflow.encode_prompts): GSM8K style, verbatim ('plain') and chat messages."""
    from grpo.data.prompts import PromptStream
    from grpo.sampler.workflow import encode_prompts

    tok = load_tokenizer(resolve_model("smollm2"))
    problems = [Problem("What is 2+2?", "#### 4"),
                Problem("Answer with one word: the capital of France?", "Paris", style="plain"),
                Problem("2*3?", "6", messages=[{"role": "system", "content": "Be brief."},
                                               {"role": "user", "content": "2*3?"}], style="plain"),
                *eval_problems("rg:spell_backward", 1)]
    round_problems = PromptStream(problems, seed=0).next_batch(len(problems))   # a round's, as the workflow takes them
    _, train_ids = encode_prompts(tok, round_problems)
    assert sorted(p.question for p in round_problems) == sorted(p.question for p in problems)
    engine = ScriptedEngine(tok, {tuple(ids): "#### 0" for ids in train_ids})
    greedy_accuracy(torch.nn.Module(), tok, problems, 8, batch_size=4, device=torch.device("cpu"), engine=engine)
    assert sorted(engine.prompts) == sorted(train_ids)


def test_final_evaluation_decodes_like_the_samplers(smollm2):
    """The learner's final evaluation picks its decoder by --generation-backend, the rule sampler 0
    scores the baseline by: 'auto' on CPU is Hugging Face generate, 'fast' the rollout engine, and
    'vllm' (whose engine lives in the sampler) the rollout engine too; all score the same on the
    same weights (fp32 here)."""
    from grpo.config import LearnerConfig, from_flat
    from grpo.evaluate import evaluate_module

    model, tok = smollm2
    res = {}
    for backend in ("auto", "fast", "vllm"):
        cfg = from_flat(LearnerConfig, eval_dataset=str(GSM8K), eval_size=4, eval_batch_size=4, max_new_tokens=6,
                            generation_backend=backend)
        res[backend] = evaluate_module(model, tok, cfg, torch.device("cpu"))
    assert [res[b]["decoder"] for b in ("auto", "fast", "vllm")] == ["hf", "fast", "fast"]
    keys = ("correct", "n", "has_answer", "mean_completion_len", "truncated_frac", "completions_sha256")
    assert [res["auto"][k] for k in keys] == [res["fast"][k] for k in keys] == [res["vllm"][k] for k in keys]
    assert res["fast"]["n"] == 4 and res["fast"]["mean_completion_len"] > 0


def test_evaluate_command_writes_json(tmp_path):
    out = tmp_path / "r.json"
    # Both commands at once: each is mostly its interpreter's start, which they can share the cores for.
    procs = [subprocess.Popen([sys.executable, "-m", "grpo.evaluate", *args], cwd=ROOT, stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True)
             for args in (["--model", "tiny-random", "--dataset", str(GSM8K), "--eval-size", "3",
                           "--max-new-tokens", "4", "--device", "cpu", "--out", str(out), "--generation-backend",
                           "fast"],
                          ["--model", "/nonexistent/m", "--device", "cpu", "--dataset", str(GSM8K)])]
    try:
        (r_out, r_err), (_, bad_err) = [p.communicate(timeout=300) for p in procs]
    finally:
        for p in procs:
            p.kill()
    assert procs[0].returncode == 0, r_err
    res = json.loads(out.read_text())
    assert res["n"] == 3 and 0 <= res["correct"] <= 3 and res["split"] == "test" and res["decoder"] == "fast"
    assert "greedy pass@1" in r_out
    assert procs[1].returncode == 2 and "Traceback" not in bad_err and len(bad_err.strip().splitlines()) == 1


def test_evaluate_command_mistakes_known_without_torch_end_before_it_loads(tmp_path):
    """A flag it does not know and a --dataset that does not exist end `python -m grpo.evaluate`
    with its one line and exit code 2 before torch or transformers is imported (seconds of a
    refused start)."""
    code = ("import sys\nfrom grpo.evaluate import _main\n"
            "try:\n    _main(['--bogus'])\nexcept SystemExit as e:\n    rc = e.code\n"
            f"rc = rc, _main(['--dataset', {str(tmp_path / 'none')!r}, '--device', 'cpu'])\n"
            "print(rc, sorted(n for n in ('torch', 'transformers') if n in sys.modules))\n")
    r = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert r.stdout.strip() == "(2, 2) []", r.stdout + r.stderr
    err = [x for x in r.stderr.splitlines() if x.startswith("python -m grpo.evaluate: error:")]
    assert len(err) == 2 and "--bogus" in err[0] and "does not exist" in err[1], r.stderr


def test_final_evaluation_decodes_a_copy_in_the_samplers_dtype():
    """A learner holding weights in another dtype than its device's compute dtype (fp32 weights under
    autocast on CUDA; here bf16 weights on the CPU, whose compute dtype is fp32) is decoded from a
    copy in the compute dtype: exactly what a model loaded in that dtype from the same weights
    decodes, and the module itself is left as it was."""
    from grpo.config import LearnerConfig, from_flat
    from grpo.evaluate import evaluate_module
    from grpo.generate.greedy import decode_copy

    path = resolve_model("tiny-random")
    tok = load_tokenizer(path)
    module = load_causal_lm(path, torch.device("cpu"), torch.bfloat16)
    copy = decode_copy(module, torch.float32)
    assert decode_copy(copy, torch.float32) is None            # already in that dtype: no copy
    theirs, ours = dict(module.named_parameters()), dict(copy.named_parameters())
    assert theirs.keys() == ours.keys()
    for name, p in ours.items():
        assert p.dtype == torch.float32 and torch.equal(p, theirs[name].float()), name
    ids = torch.tensor([[1, 5, 9, 33, 2]])
    ref = load_causal_lm(path, torch.device("cpu"), torch.bfloat16).float()
    torch.testing.assert_close(copy(ids).logits, ref(ids).logits, rtol=0, atol=0)

    cfg = from_flat(LearnerConfig, eval_dataset=str(GSM8K), eval_size=3, eval_batch_size=3, max_new_tokens=6,
                        generation_backend="fast")
    got = evaluate_module(module, tok, cfg, torch.device("cpu"))
    want = evaluate_module(ref, tok, cfg, torch.device("cpu"))
    keys = ("correct", "n", "mean_completion_len", "truncated_frac")
    assert [got[k] for k in keys] == [want[k] for k in keys]
    assert next(module.parameters()).dtype == torch.bfloat16   # the learner's own weights untouched


def test_evaluate_command_refuses_vllm_it_cannot_run_in_one_line(tmp_path):
    """--generation-backend vllm where vLLM cannot run (here: not installed, or no CUDA): one line
    naming it, exit code 2, before any model loads, and no result file."""
    out = tmp_path / "r.json"
    r = subprocess.run([sys.executable, "-m", "grpo.evaluate", "--model", "tiny-random", "--dataset", str(GSM8K),
                        "--eval-size", "2", "--device", "cpu", "--generation-backend", "vllm", "--out", str(out)],
                       cwd=ROOT, capture_output=True, text=True, timeout=120)
    err = [x for x in r.stderr.splitlines() if x.strip()]
    assert r.returncode == 2 and len(err) == 1 and "--generation-backend vllm" in err[0], r.stderr
    assert err[0].startswith("python -m grpo.evaluate: error:") and not out.exists()


def test_vllm_decoder_takes_its_share_from_the_plan_and_decodes_as_our_engine(smollm2, monkeypatch):
    """vllm_decoder (the evaluate command's --generation-backend vllm) over the stand-in of vLLM's
    engine (tests/fakevllm.py): built on the model's folder with the memory rule's share for the
    command's rows and tokens on an 80 GiB GPU; its greedy batch through decode() gives the same
    texts, lengths and truncations as our engine's on the same fp32 weights."""
    from fakevllm import FakeLLM, make_params
    from types import SimpleNamespace

    import grpo.generate.greedy as greedy
    from grpo.generate.engine import RolloutEngine
    from grpo.generate.vllm_engine import VllmEngine
    from grpo.model.load import eos_ids
    from grpo.rules.memory import PROMPT_TOKENS, shape_from_config, vllm_gpu_fraction, vllm_items

    model, tok = smollm2
    built = {}

    def build(cls, path, policy, eos, dtype, share, seed, rows, cuda_graphs):
        built.update(path=path, share=share, rows=rows, eos=eos, dtype=dtype)
        return cls(FakeLLM(policy), make_params, eos, policy)

    monkeypatch.setattr(VllmEngine, "build", classmethod(build))
    monkeypatch.setattr(torch.cuda, "get_device_properties", lambda device: SimpleNamespace(total_memory=80 * 2**30))
    engine = greedy.vllm_decoder("/models/smol", model, tok, torch.device("cpu"), rows=4, max_new_tokens=6)
    want = vllm_gpu_fraction(vllm_items(shape_from_config(model.config.to_dict()), 4, PROMPT_TOKENS + 6, 4),
                             80 * 2**30)
    assert built == {"path": "/models/smol", "share": want, "rows": 4, "eos": eos_ids(tok, model),
                     "dtype": torch.float32} and 0 < want <= 0.02
    problems = [build_prompt(tok, q, None) for q in ("What is 2 + 3?", "Name a colour.", "Count to three.")]
    ids = [tok(p, add_special_tokens=False)["input_ids"] for p in problems]
    got = greedy.decode(model, tok, ids, 6, 4, torch.device("cpu"), engine)
    ours = greedy.decode(model, tok, ids, 6, 4, torch.device("cpu"),
                         RolloutEngine(model, eos_ids(tok, model), tok.pad_token_id, cuda_graphs=False))
    assert got == ours and len(got[0]) == 3
