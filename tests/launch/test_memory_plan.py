"""The memory plan (grpo.rules.memory): hand-worked numbers, the refusal line, and the launcher
computing it only for CUDA runs."""
import json
from dataclasses import replace

import pytest

from grpo.launch import main as launch_main
from grpo import config
from grpo.launch import probe
from grpo.rules import memory
from grpo.rules.memory import GiB, RunShape, Shape

# A made-up 1,000,000-parameter model: 2 layers, hidden 64, KV 2 heads x 16 = 32, vocab 1000.
SHAPE = Shape(params=1_000_000, layers=2, hidden=64, kv_dim=32, q_dim=64, intermediate=256, vocab=1000)


def items(p, name):
    return dict(p[name])


def test_learner_zero2_numbers_two_ranks():
    # ZeRO-2 over N = 2 ranks, 1e6 trained parameters (DeepSpeed's 2 + 2 + 12 bytes per parameter):
    #   weights (bf16)              2 x 1e6       = 2,000,000 bytes on every rank
    #   gradients (bf16, split)     2 x 1e6 / 2   = 1,000,000
    #   optimizer state (fp32 master, m, v = 12 bytes, split) 12 x 1e6 / 2 = 6,000,000
    #   ipc publication, rank 0 only: 2 slots x 1e6 x 2 bytes = 4,000,000
    p = memory.plan(SHAPE, RunShape(ranks=2, ipc=True, micro_batch=1, prompt_tokens=10, new_tokens=6))
    l0, l1 = items(p, "learner0"), items(p, "learner1")
    assert l0["weights"] == l1["weights"] == 2_000_000
    assert l0["gradients"] == l1["gradients"] == 1_000_000
    assert l0["optimizer state"] == l1["optimizer state"] == 6_000_000
    assert l0["ipc publication"] == 4_000_000 and "ipc publication" not in l1
    assert l0["CUDA context"] == GiB // 2
    # activations, the rough rule: layers 2 x micro 1 x seq 16 x hidden 64 x k 77 = 157,696
    assert l0["activations"] == 2 * 1 * 16 * 64 * 77 == 157_696
    # the logits chunk: 2 x (micro 1 x 16 tokens x vocab 1000) x 4 bytes = 128,000
    assert l0["logits chunk"] == 128_000
    # the allocator's reserve, a rough rule: under full fine-tuning 0.25 x the rank's other items (the
    # CUDA context left out) with expandable segments, the default; 0.45 x without.
    # Rank 1: 2,000,000 + 6,000,000 + 1,000,000 + 157,696 + 128,000 = 9,285,696; rank 0 adds the slots.
    assert l1["allocator reserve"] == int(0.25 * 9_285_696) == 2_321_424
    assert l0["allocator reserve"] == int(0.25 * 13_285_696) == 3_321_424
    torch_default = memory.plan(SHAPE, RunShape(ranks=2, ipc=True, micro_batch=1, prompt_tokens=10, new_tokens=6,
                                                expandable=False))
    assert items(torch_default, "learner1")["allocator reserve"] == int(0.45 * 9_285_696) == 4_178_563
    # one rank holds everything: 2 + 2 + 12 = 16 bytes per parameter
    one = items(memory.plan(SHAPE, RunShape(ranks=1, ipc=False)), "learner0")
    assert one["weights"] + one["gradients"] + one["optimizer state"] == 16_000_000


def test_autocast_holds_float32_weights_and_bf16_copies():
    """--precision autocast (SHAPE: 1e6 parameters): float32 weights (4e6) and gradients (4e6 / N),
    ZeRO's 12 bytes of state (its master clone of the fp32 partition, momentum, variance) / N, and
    autocast's bf16 copy of the weights (2e6). One rank: 4 + 4 + 12 + 2 = 22 bytes a parameter;
    plain AdamW (--no-deepspeed) has no master clone: 4 + 4 + 8 + 2 = 18."""
    l0 = items(memory.plan(SHAPE, RunShape(ranks=2, ipc=True, precision="autocast")), "learner0")
    assert (l0["weights"], l0["gradients"], l0["optimizer state"], l0["autocast copies"]) == \
        (4_000_000, 2_000_000, 6_000_000, 2_000_000)
    assert l0["ipc publication"] == 4_000_000                 # the samplers still get bf16
    one = items(memory.plan(SHAPE, RunShape(ranks=1, ipc=False, precision="autocast")), "learner0")
    assert one["weights"] + one["gradients"] + one["optimizer state"] + one["autocast copies"] == 22_000_000
    plain = items(memory.plan(SHAPE, RunShape(ranks=1, ipc=False, precision="autocast", deepspeed=False)),
                  "learner0")
    assert plain["weights"] + plain["gradients"] + plain["optimizer state"] + plain["autocast copies"] == 18_000_000
    # bf16 (the LoRA default): no copies
    assert "autocast copies" not in items(memory.plan(SHAPE, RunShape(ranks=1)), "learner0")


def test_run_shape_resolves_the_learners_precision(tmp_path):
    from grpo.config import LearnerConfig, SamplerConfig, from_flat

    ds = tmp_path / "ds.json"
    ds.write_text(json.dumps({"train_micro_batch_size_per_gpu": 8}))
    shape = lambda **kw: probe.run_shape(from_flat(LearnerConfig, **kw), SamplerConfig(), 1, 1, str(ds))  # noqa: E731
    assert (shape().precision, shape().deepspeed) == ("autocast", True)
    assert shape(lora_r=16).precision == "bf16"              # LoRA: the frozen base stays bf16
    assert shape(precision="bf16").precision == "bf16"
    assert (shape(no_deepspeed=True).precision, shape(no_deepspeed=True).deepspeed) == ("autocast", False)
    assert (shape().entropy, shape(entropy_coef=0.01).entropy) == (False, True)


def test_the_allocator_reserve_alone_warns_instead_of_refusing():
    p = {"learner0": [("weights", 3 * GiB), ("activations", 2 * GiB), ("allocator reserve", 4 * GiB)]}
    # counted 5 GiB, with the reserve 9 GiB, on an 8 GiB GPU: started, with one line
    assert memory.check_fits(p, {0: 8 * GiB}, {"learner0": 0}) is None
    warn = memory.check_tight(p, {0: 8 * GiB}, {"learner0": 0})
    assert "\n" not in warn and "may not fit GPU 0" in warn and "9.00 GiB" in warn and "allocator reserve" in warn
    assert memory.check_tight(p, {0: 9 * GiB}, {"learner0": 0}) is None
    # counted bytes over the GPU: refused, the reserve left out of the sum and the biggest item
    msg = memory.check_fits(p, {0: 4 * GiB}, {"learner0": 0})
    assert "does not fit GPU 0" in msg and "5.00 GiB" in msg and "learner0's weights" in msg


@pytest.mark.parametrize("ranks,state,grads", [
    (1, 12_000_000, 2_000_000),    # 12 x 1e6 and 2 x 1e6: one rank holds it all
    (3, 4_000_000, 666_666),       # 12e6 / 3; 2e6 / 3 = 666,666.7, floored
    (4, 3_000_000, 500_000),
    (16, 750_000, 125_000),        # two nodes of 8
])
def test_zero2_splits_state_and_gradients_over_any_rank_count(ranks, state, grads):
    p = memory.plan(SHAPE, RunShape(ranks=ranks, ipc=True))
    assert len([n for n in p if n.startswith("learner")]) == ranks
    assert {(items(p, f"learner{r}")["optimizer state"], items(p, f"learner{r}")["gradients"])
            for r in range(ranks)} == {(state, grads)}
    # weights are whole on every rank; the ipc slots only on rank 0
    assert {items(p, f"learner{r}")["weights"] for r in range(ranks)} == {2_000_000}
    assert [r for r in range(ranks) if "ipc publication" in items(p, f"learner{r}")] == [0]


def test_lora_trains_adapters_but_publishes_full_weights():
    # r = 1, all-linear: per layer r x (in + out) for q (64+64), k (64+32), v (64+32), o (64+64),
    # gate (64+256), up (64+256), down (256+64) = 128+96+96+128+320+320+320 = 1408; 2 layers: 2816
    assert memory.lora_params(SHAPE, 1) == 2816
    l0 = items(memory.plan(SHAPE, RunShape(lora_r=1, ipc=True)), "learner0")
    assert l0["optimizer state"] == 12 * 2816 and l0["gradients"] == 2 * 2816
    assert l0["weights"] == 2 * (1_000_000 + 2816)
    assert l0["ipc publication"] == 4_000_000           # merged full weights, two slots
    # LoRA's measured reserve is smaller: 0.05 x the other items (0.29 without expandable segments)
    assert l0["allocator reserve"] == int(0.05 * sum(b for k, b in l0.items()
                                                      if k not in ("allocator reserve", "CUDA context")))


def test_sampler_kv_cache_and_reference_model():
    # KV cache: 2 (K, V) x layers 2 x rows 3 x seq (5 + 7 = 12) x kv_dim 32 x 2 bytes = 9,216
    assert memory.kv_cache(SHAPE, rows=3, seq=12) == 2 * 2 * 3 * 12 * 32 * 2 == 9216
    s = items(memory.plan(SHAPE, RunShape(rows=3, prompt_tokens=5, new_tokens=7, beta=0.04)), "sampler0")
    assert s["KV cache"] == 9216 and s["weights"] == 2_000_000 and s["reference model"] == 2_000_000
    # ipc/nccl stage a whole version beside the live weights: one more copy, 2 x 1e6 bytes
    assert s["weight staging"] == 2_000_000
    # the allocator's reserve: 0.7 x (KV cache + log-prob pass) with expandable segments, 1.5 x without;
    # the pass here is batch min(64, 3) = 3 x 12 tokens x (2 x 64 + 2 x 256) x 2 bytes = 46,080 plus
    # the logits 2 x 36,000 x 4 = 288,000
    assert s["log-prob pass"] == 46_080 + 288_000
    assert s["allocator reserve"] == int(0.7 * (9216 + 334_080)) == 240_307
    without = items(memory.plan(SHAPE, RunShape(rows=3, prompt_tokens=5, new_tokens=7, expandable=False)), "sampler0")
    assert without["allocator reserve"] == int(1.5 * (9216 + 334_080)) == 514_944
    # over shared weights the sampler still loads its own copy (round 0 runs on it before the learner's
    # storages are mapped), stages nothing, and keeps a smaller reserve: 0.3 x (1.0 x without)
    s0 = items(memory.plan(SHAPE, RunShape(rows=3, prompt_tokens=5, new_tokens=7, beta=0.0, shared=True,
                                           staging=False)), "sampler0")
    assert "reference model" not in s0 and s0["weights"] == 2_000_000 and "weight staging" not in s0
    assert s0["allocator reserve"] == int(0.3 * (9216 + 334_080)) == 102_988
    s1 = items(memory.plan(SHAPE, RunShape(rows=3, prompt_tokens=5, new_tokens=7, shared=True, staging=False,
                                           expandable=False)), "sampler0")
    assert s1["allocator reserve"] == 9216 + 334_080
    tcp = items(memory.plan(SHAPE, RunShape(ipc=False, staging=False)), "sampler0")
    assert "weight staging" not in tcp
    # log-prob pass: batch 2 x seq 12 x (2 x 64 + 2 x 256) x 2 bytes = 30,720, plus the float32 logits
    # chunk and its log_softmax: here the whole 2 x 12 x 1000 logits (below 2^27): 2 x 24,000 x 4 = 192,000
    assert memory.logprob_pass(SHAPE, 2, 12) == 30_720 + 192_000


def test_rows_from_the_flags():
    from grpo.config import LearnerConfig, SamplerConfig, from_flat

    l = LearnerConfig()
    # the defaults (G=8, 16 rows a step, --max-staleness 2, no filter): rounds of at most 8 prompts
    # (grpo.rules.staleness: Staleness.largest_round_prompts), 64 rows, the smallest bucket
    assert probe.run_shape(l, from_flat(SamplerConfig, num_generations=8), 1, 1, "/nonexistent").rows == 64
    # under --filter-zero-signal up to 32 prompts, 256 rows
    assert probe.run_shape(l, from_flat(SamplerConfig, num_generations=8, filter_zero_signal=True), 1, 1,
                           "").rows == 256
    # the benchmark's: G=16, 128 rows a step, filter: 64 prompts (the cap), 1,024 rows
    assert probe.run_shape(from_flat(LearnerConfig, train_batch_size=128), from_flat(SamplerConfig, num_generations=16,
                            filter_zero_signal=True), 1, 1, "").rows == 1024
    # --prompts-per-round 4: 32 rows, padded to the 64-row bucket; without CUDA graphs exactly 32
    assert probe.run_shape(l, from_flat(SamplerConfig, prompts_per_round=4, num_generations=8), 1, 1, "").rows == 64
    assert probe.run_shape(l, from_flat(SamplerConfig, prompts_per_round=4, num_generations=8, cuda_graphs=False),
                            1, 1, "").rows == 32
    # 20 prompts x 8 = 160 rows: the 256 bucket; 200 x 8 = 1,600 decode in chunks of the largest, 1,024
    assert memory.decode_rows(8, prompts_per_round=20) == 256
    assert memory.decode_rows(8, prompts_per_round=200) == 1024
    assert probe.run_shape(l, from_flat(SamplerConfig, in_flight_rows=100), 1, 1, "").rows == 100


def test_micro_batch_from_the_deepspeed_config(tmp_path):
    path = tmp_path / "ds.json"
    path.write_text(json.dumps({"train_micro_batch_size_per_gpu": 32}))
    assert probe.micro_batch_size(str(path), 16, 2) == 8       # capped by a rank's share, 16 / 2
    assert probe.micro_batch_size(str(path), 256, 2) == 32
    path.write_text(json.dumps({"train_micro_batch_size_per_gpu": "auto"}))
    assert probe.micro_batch_size(str(path), 16, 3) == 6        # ceil(16 / 3)


def test_activations_follow_the_learners_token_budget(tmp_path):
    """The learner packs each micro-batch within a budget of padded tokens (the default), so the plan
    counts that budget's activations, or one row's where a row is longer; only fixed micro-batches
    (--micro-batch-tokens -1) hold their rows at the assumed length. SHAPE: 2 layers, hidden 64,
    k = 77 bytes, so a token costs 2 x 64 x 77 = 9,856 bytes of activations."""
    per_token = 2 * 64 * 77
    act = lambda **kw: items(memory.plan(SHAPE, RunShape(ranks=1, ipc=False, prompt_tokens=10, new_tokens=6,  # noqa: E731
                                                         micro_batch=4, **kw)), "learner0")["activations"]
    assert act(micro_tokens=0) == 4 * 16 * per_token          # fixed rows: 4 x (10 + 6)
    assert act(micro_tokens=100) == 100 * per_token           # the budget bounds every micro-batch
    assert act(micro_tokens=8) == 16 * per_token              # a 16-token row travels alone, past a budget of 8
    from grpo.config import LearnerConfig, SamplerConfig, from_flat

    ds = tmp_path / "ds.json"
    ds.write_text(json.dumps({"train_micro_batch_size_per_gpu": 32}))
    shape = lambda **kw: probe.run_shape(from_flat(LearnerConfig, **{"train_batch_size": 128, **kw}), SamplerConfig(),
                                         1, 1,  # noqa: E731
                                          str(ds))
    # the learner's default budget: 32 rows x (a 128-token prompt + 256 new tokens), not 32 x (512 + 256)
    assert shape().micro_tokens == 32 * (128 + 256) == 12_288
    assert shape(micro_batch_tokens=5000).micro_tokens == 5000
    assert shape(micro_batch_tokens=-1).micro_tokens == 0
    assert shape(max_prompt_tokens=64, max_new_tokens=100).micro_tokens == 32 * (64 + 100)


def test_shape_from_a_real_config_counts_smollm2():
    cfg = {"hidden_size": 576, "num_hidden_layers": 30, "vocab_size": 49152, "num_attention_heads": 9,
           "head_dim": 64, "num_key_value_heads": 3, "intermediate_size": 1536, "tie_word_embeddings": True}
    s = memory.shape_from_config(cfg)
    assert s.params == 134_515_008          # SmolLM2-135M's published count
    assert s.kv_dim == 192 and s.q_dim == 576


def test_qwen25_shapes_give_the_published_parameter_counts():
    """The random:qwen2.5-* shapes are the real models': their sizes as the model cards give them."""
    from grpo.model.zoo import QWEN25_SHAPES

    published = {"0.5b": 494_032_768, "1.5b": 1_543_714_304, "3b": 3_085_938_688, "7b": 7_615_616_512}
    got = {k: memory.shape_from_config({**v, "model_type": "qwen2"}).params for k, v in QWEN25_SHAPES.items()}
    assert got == published


def test_built_folders_match_the_model_builders():
    from grpo.model import zoo

    assert probe.BUILT_FOLDERS == {k: v[0] for k, v in zoo._BUILDERS.items()}
    # the names whose folder is converted from the GGUF: the plan reads their header before that
    assert probe.FROM_GGUF == {k for k, v in zoo._BUILDERS.items() if v[1] is zoo._convert_smollm2}


def test_share_gpus_add_up_and_the_refusal_names_the_biggest_item():
    p = {"learner0": [("weights", 3 * GiB), ("optimizer state", 5 * GiB)],
         "sampler0": [("weights", 3 * GiB), ("KV cache", 6 * GiB)]}
    # apart: 8 and 9 GiB, each fits a 10 GiB GPU
    assert memory.check_fits(p, {0: 10 * GiB, 1: 10 * GiB}, {"learner0": 1, "sampler0": 0}) is None
    # shared (--share-gpus): 17 GiB on GPU 0
    msg = memory.check_fits(p, {0: 10 * GiB}, {"learner0": 0, "sampler0": 0})
    assert "\n" not in msg
    assert "GPU 0" in msg and "17.00 GiB" in msg and "10.00 GiB" in msg
    assert "sampler0's KV cache" in msg and "--max-prompts-per-round" in msg and "--max-new-tokens" in msg
    # no driver / unknown size: no check
    assert memory.check_fits(p, {}, {"learner0": 0, "sampler0": 0}) is None


@pytest.mark.parametrize("item,flag", [("optimizer state", "--training-gpus"), ("optimizer state", "--lora-r"),
                                       ("reference model", "--beta 0"),
                                       ("activations", "train_micro_batch_size_per_gpu"),
                                       ("ipc publication", "--weight-sync")])
def test_each_item_names_its_flag(item, flag):
    msg = memory.check_fits({"learner0": [(item, 2 * GiB), ("weights", GiB)]}, {0: GiB}, {"learner0": 0})
    assert item in msg and flag in msg


def test_gpu_total_bytes_without_a_driver(monkeypatch):
    import ctypes

    def missing(name):
        raise OSError(name)

    monkeypatch.setattr(ctypes, "CDLL", missing)
    assert probe.gpu_total_bytes() == {}


def test_cpu_run_computes_no_plan(monkeypatch, capsys):
    calls = []
    monkeypatch.setattr(memory, "plan", lambda *a, **k: calls.append(a) or {})
    monkeypatch.setattr(probe, "read_shape", lambda *a: calls.append(a) or (None, "x"))
    monkeypatch.setattr(launch_main, "check_ports", lambda *a: (_ for _ in ()).throw(launch_main.LaunchError("stop")))
    assert launch_main.main(["--device", "cpu", "--model", "tiny-random"]) == 2
    assert calls == []
    assert "memory plan" not in capsys.readouterr().err


def test_cuda_run_logs_the_plan_and_refuses_what_does_not_fit(monkeypatch, capsys, config_folder):
    folder = config_folder
    monkeypatch.setattr(launch_main, "cuda_device_count", lambda: 2)
    monkeypatch.setattr(launch_main, "sampler_problem", lambda cfg: None)
    monkeypatch.setattr(probe, "gpu_total_bytes", lambda: {0: GiB // 4, 1: 80 * GiB})
    rc = launch_main.main(["--model", str(folder), "--sampling-gpus", "0", "--training-gpus", "1"])
    err = capsys.readouterr().err
    assert rc == 2
    assert "memory plan: learner0" in err and "memory plan: sampler0" in err
    assert "does not fit GPU 0" in err and "CUDA context" in err
    # --no-memory-check: the same plan is a warning, and the launch goes on to its next check
    # (stopped here by a port check that fails on purpose, before anything starts)

    def busy(host, ports):
        raise launch_main.LaunchError(f"port check reached for {ports}")

    monkeypatch.setattr(launch_main, "check_ports", busy)
    rc = launch_main.main(["--model", str(folder), "--sampling-gpus", "0", "--training-gpus", "1",
                           "--no-memory-check"])
    err = capsys.readouterr().err
    assert rc == 2 and "warning: the memory plan does not fit GPU 0" in err and "port check reached" in err


def test_fp32_holds_float32_weights_without_autocast_copies():
    """--precision fp32 on CUDA (SHAPE: 1e6 parameters, one rank): float32 weights (4e6) and
    gradients (4e6), ZeRO's 12e6 of state, and no bf16 copies: 20 bytes a parameter."""
    one = items(memory.plan(SHAPE, RunShape(ranks=1, ipc=False, precision="fp32")), "learner0")
    assert (one["weights"], one["gradients"], one["optimizer state"]) == (4_000_000, 4_000_000, 12_000_000)
    assert "autocast copies" not in one


def test_bf16_plan_only_for_float32_weights_under_deepspeed():
    assert memory.bf16_plan(SHAPE, RunShape(precision="bf16")) is None
    # --no-deepspeed: grpo.config refuses --precision bf16 there, so it is never suggested
    assert memory.bf16_plan(SHAPE, RunShape(precision="autocast", deepspeed=False)) is None
    for precision in ("autocast", "fp32"):
        b = memory.bf16_plan(SHAPE, RunShape(precision=precision))
        assert b == memory.plan(SHAPE, RunShape(precision="bf16"))


def test_the_refusal_says_bf16_weights_would_fit():
    """A 1e9-parameter learner (autocast, one rank) beside its sampler on one GPU. Counted bytes
    (the allocator's reserve, an estimate, left out), worked by hand:
      learner0, autocast: weights 4 x 1e9 + optimizer state 12 x 1e9 + gradients 4 x 1e9
        + autocast copies 2 x 1e9 = 22,000,000,000
        + activations 2 layers x 1 x 16 tokens x 64 x 77 = 157,696
        + logits chunk 2 x (1 x 16 x 1000) x 4 = 128,000
        + CUDA context 536,870,912                                  = 22,537,156,608
      sampler0: weights 2 x 1e9 (beta 0: no reference; tcp: no staging)
        + KV cache 2 x 2 layers x 3 rows x 16 x 32 x 2 = 12,288
        + log-prob pass 3 x 16 x (2 x 64 + 2 x 256) x 2 = 61,440 + logits 2 x (3 x 16 x 1000) x 4 = 384,000
        + CUDA context 536,870,912                                  =  2,537,328,640
      together 25,074,485,248 bytes = 23.35 GiB: over a 20 GiB GPU (21,474,836,480).
      bf16: the learner's weights 2e9 and gradients 2e9, no copies: 16e9 instead of 22e9, so
      together 19,074,485,248 bytes = 17.76 GiB: it fits.
    The biggest item is the optimizer state, 12e9 bytes = 11.18 GiB."""
    s = Shape(params=1_000_000_000, layers=2, hidden=64, kv_dim=32, q_dim=64, intermediate=256, vocab=1000)
    r = RunShape(ranks=1, ipc=False, staging=False, beta=0.0, rows=3, micro_batch=1, prompt_tokens=10,
                 new_tokens=6, precision="autocast")
    p, b = memory.plan(s, r), memory.bf16_plan(s, r)
    shared = {"learner0": 0, "sampler0": 0}
    msg = memory.check_fits(p, {0: 20 * GiB}, shared, bf16=b)
    assert msg == ("the memory plan does not fit GPU 0: learner0 + sampler0 need about 23.35 GiB of its 20.00 GiB; "
                   "the biggest item is learner0's optimizer state (11.18 GiB): shrink it with more --training-gpus "
                   "(ZeRO-2 splits it over the ranks) or --lora-r 16; --precision bf16 (bf16 weights) would fit: "
                   "about 17.76 GiB")
    # 17 GiB (18,253,611,008 bytes) holds neither 23.35 nor 17.76 GiB: bf16 is not offered
    assert memory.check_fits(p, {0: 17 * GiB}, shared, bf16=b).endswith("or --lora-r 16")
    # without the bf16 plan (a bf16 run already, --no-deepspeed): the line as before
    assert memory.check_fits(p, {0: 20 * GiB}, shared).endswith("or --lora-r 16")
    assert memory.check_fits(p, {0: 24 * GiB}, shared, bf16=b) is None


def test_the_launcher_passes_the_bf16_plan_to_the_refusal(monkeypatch, capsys, config_folder):
    seen = []
    monkeypatch.setattr(launch_main, "cuda_device_count", lambda: 2)
    monkeypatch.setattr(launch_main, "sampler_problem", lambda cfg: None)
    monkeypatch.setattr(probe, "gpu_total_bytes", lambda: {0: 80 * GiB, 1: 80 * GiB})
    monkeypatch.setattr(memory, "check_fits", lambda p, gpus, placement, bf16=None: seen.append((p, bf16)) or "no")
    argv = ["--model", str(config_folder), "--sampling-gpus", "0", "--training-gpus", "1"]
    assert launch_main.main(argv) == 2
    # full fine-tuning defaults to autocast: float32 weights; the alternative holds them in bf16. The
    # first check is the refusal's (the ones after it tried smaller micro-batches, fitting_micro_tokens)
    p, bf16 = seen[0]
    assert all(b is None for _, b in seen[1:])
    params = memory.shape_from_config(json.loads((config_folder / "config.json").read_text())).params
    assert items(p, "learner0")["weights"] == 4 * params and items(bf16, "learner0")["weights"] == 2 * params
    seen.clear()
    assert launch_main.main(argv + ["--precision", "bf16"]) == 2
    assert seen[0][1] is None
    assert "error: no; or pass --no-memory-check" in capsys.readouterr().err


# ---------------------------------------------------------------- the default model before its conversion

def _gguf_or_skip():
    from grpo.model.gguf.header import ModelUnavailable, find_gguf

    try:
        return find_gguf()
    except ModelUnavailable as exc:
        pytest.skip(f"no SmolLM2 GGUF here: {exc}")


# the config.json keys shape_from_config reads
PLAN_KEYS = ("hidden_size", "num_hidden_layers", "vocab_size", "num_attention_heads", "head_dim",
             "num_key_value_heads", "intermediate_size", "tie_word_embeddings")


def test_the_gguf_header_gives_the_config_the_conversion_writes(tmp_path):
    from grpo.model.gguf.header import gguf_config
    from grpo.model import zoo

    header = gguf_config(_gguf_or_skip())
    zoo._convert_smollm2(tmp_path / "converted")
    written = json.loads((tmp_path / "converted" / "config.json").read_text())
    assert {k: header[k] for k in PLAN_KEYS} == {k: written[k] for k in PLAN_KEYS}
    # the keys the header leaves to LlamaConfig's defaults are the ones shape_from_config assumes
    assert (written["model_type"], written["attention_bias"]) == ("llama", False)
    assert memory.shape_from_config(header) == memory.shape_from_config(written)
    assert memory.shape_from_config(header).params == 134_515_008


def test_first_run_of_the_default_model_is_planned_from_its_gguf(monkeypatch, capsys, tmp_path):
    _gguf_or_skip()
    cache = tmp_path / "empty-cache"
    monkeypatch.setenv("GRPO_CACHE", str(cache))      # no converted folder: a fresh machine
    monkeypatch.setattr(launch_main, "cuda_device_count", lambda: 2)
    monkeypatch.setattr(launch_main, "sampler_problem", lambda cfg: None)
    monkeypatch.setattr(probe, "gpu_total_bytes", lambda: {0: 80 * GiB, 1: 80 * GiB})

    def stop(host, ports):
        raise launch_main.LaunchError("port check reached")

    monkeypatch.setattr(launch_main, "check_ports", stop)
    assert launch_main.main(["--model", "smollm2", "--sampling-gpus", "0", "--training-gpus", "1"]) == 2
    err = capsys.readouterr().err
    assert "skipped" not in err and "port check reached" in err
    # autocast: 134,515,008 parameters x 4 bytes = 538,060,032 bytes = 0.50 GiB of float32 weights
    assert "memory plan: learner0 " in err and "weights 0.50 GiB" in err and "memory plan: sampler0 " in err
    assert not cache.exists() or not list(cache.iterdir())   # nothing converted, nothing built


def test_without_a_gguf_the_plan_is_skipped_in_one_line(monkeypatch, tmp_path):
    monkeypatch.setenv("GRPO_CACHE", str(tmp_path))
    monkeypatch.setenv("GRPO_GGUF_PATH", str(tmp_path / "missing.gguf"))
    assert probe.read_shape("smollm2") == (
        None, "memory plan skipped: no config.json for --model smollm2 here yet (built or fetched at load)")
    # a file that is not a GGUF: one line naming it
    bad = tmp_path / "bad.gguf"
    bad.write_bytes(b"NOPE" + bytes(20))
    monkeypatch.setenv("GRPO_GGUF_PATH", str(bad))
    assert probe.read_shape("smollm2") == (
        None, f"memory plan skipped: cannot read the GGUF header of {bad}: {bad} is not a GGUF file")


def test_reading_the_gguf_header_imports_no_heavy_module(tmp_path):
    """The launcher's promise (grpo.launch.main): nothing heavy before the workers start. In a fresh
    interpreter, so that no other test's imports count."""
    import os
    import subprocess
    import sys
    from pathlib import Path

    _gguf_or_skip()
    code = ("import sys\n"
            "from grpo.launch import probe\n"
            "shape, note = probe.read_shape('smollm2')\n"
            "heavy = ('torch', 'transformers', 'numpy', 'gguf')\n"
            "print(shape.params, note == '', sorted(n for n in heavy if n in sys.modules))\n")
    out = subprocess.run([sys.executable, "-c", code], cwd=Path(__file__).resolve().parents[2],
                         env=dict(os.environ, GRPO_CACHE=str(tmp_path)), capture_output=True, text=True, timeout=60)
    assert out.stdout.split(maxsplit=2) == ["134515008", "True", "[]\n"], out.stderr


def test_entropy_bonus_doubles_the_learners_logits_chunk():
    """--entropy-coef: the chunk holds the softmax and its product with the logits besides the
    logits and their gradient, 4 x (1 x 16 x 1000) x 4 = 256,000 bytes instead of 128,000; nothing
    else changes but the allocator's reserve, 0.25 x the items it is a share of: 0.25 x 128,000 more."""
    s = Shape(params=1_000_000, layers=2, hidden=64, kv_dim=32, q_dim=64, intermediate=256, vocab=1000)
    r = RunShape(ranks=1, ipc=False, micro_batch=1, prompt_tokens=10, new_tokens=6)
    off, on = items(memory.plan(s, r), "learner0"), items(memory.plan(s, replace(r, entropy=True)), "learner0")
    assert (off["logits chunk"], on["logits chunk"]) == (128_000, 256_000)
    same = lambda d: {k: v for k, v in d.items() if k not in ("logits chunk", "allocator reserve")}  # noqa: E731
    assert same(on) == same(off)
    assert on["allocator reserve"] - off["allocator reserve"] == 32_000


@pytest.mark.parametrize("environ,conf,users,expandable", [
    ({}, "expandable_segments:True", False, True),                                  # ours, by default
    ({"PYTORCH_CUDA_ALLOC_CONF": "max_split_size_mb:128"}, "max_split_size_mb:128", True, False),
    ({"PYTORCH_CUDA_ALLOC_CONF": ""}, "", True, False),                             # set empty: torch's own
    ({"PYTORCH_ALLOC_CONF": "expandable_segments:False"}, "expandable_segments:False", True, False),
    ({"PYTORCH_CUDA_ALLOC_CONF": "expandable_segments:True, max_split_size_mb:64"},
     "expandable_segments:True, max_split_size_mb:64", True, True),
    ({"PYTORCH_CUDA_ALLOC_CONF": "expandable_segments:True,expandable_segments:False"},
     "expandable_segments:True,expandable_segments:False", True, False),           # the last one wins
])
def test_allocator_settings_the_users_or_expandable_segments(environ, conf, users, expandable):
    env = dict(environ)
    assert config.allocator_conf(env) == (conf, users)
    assert config.expandable_segments(conf) is expandable
    assert config.use_allocator_default(env) == (conf, users)
    # a worker sets ours only where the user set nothing, and never changes what the user set
    assert env == (environ if users else {"PYTORCH_CUDA_ALLOC_CONF": "expandable_segments:True"})


def test_run_shape_follows_the_allocator_the_workers_will_use(tmp_path, monkeypatch):
    from grpo.config import LearnerConfig, SamplerConfig

    ds = tmp_path / "ds.json"
    ds.write_text(json.dumps({"train_micro_batch_size_per_gpu": 8}))
    for name in config.ALLOC_ENVS:
        monkeypatch.delenv(name, raising=False)
    assert probe.run_shape(LearnerConfig(), SamplerConfig(), 1, 1, str(ds)).expandable is True
    monkeypatch.setenv("PYTORCH_CUDA_ALLOC_CONF", "max_split_size_mb:128")
    assert probe.run_shape(LearnerConfig(), SamplerConfig(), 1, 1, str(ds)).expandable is False


def test_workers_set_the_allocator_before_torch_loads():
    """The allocator reads its settings once, when torch's CUDA allocator starts: everything a
    worker imports before grpo.workers._allocator runs must leave torch unimported (a fresh process)."""
    import subprocess
    import sys

    code = ("import sys\n"
            "from grpo.config import LearnerConfig, SamplerConfig\n"
            "from grpo.flags import parse_config\n"
            "import grpo.workers, grpo.obs.rundir, grpo.obs.stages, grpo.launch.probe\n"
            "parse_config(SamplerConfig, ['--device', 'cuda'], 'x'); parse_config(LearnerConfig, [], 'x')\n"
            "print('torch' in sys.modules)\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "False"


# ---------------------------------------------------------------- a default micro-batch that does not fit

# Activations dominate: 10 layers of hidden 1000; seq = 10 + 6 = 16 tokens a row.
WIDE = Shape(params=1_000_000, layers=10, hidden=1000, kv_dim=32, q_dim=64, intermediate=256, vocab=1000)


def test_fitting_micro_tokens_halves_the_budget_until_the_counted_items_fit():
    """A learner sharing GPU 0 with its sampler, a budget of 64 tokens (4 rows of 16). Halving it
    saves, by hand, the activations 10 layers x 32 tokens x 1000 x 77 = 24,640,000 bytes and the
    logits chunk 2 x 32 x 1000 x 4 = 256,000: 24,896,000 bytes from 64 to 32 tokens, and half that,
    12,448,000, from 32 to 16."""
    r = RunShape(ranks=1, ipc=False, staging=False, rows=2, micro_batch=4, micro_tokens=64, prompt_tokens=10,
                 new_tokens=6, precision="autocast")
    shared = {"learner0": 0, "sampler0": 0}
    need = {t: memory._counted(memory.plan(WIDE, replace(r, micro_tokens=t)), shared, 0) for t in (64, 32, 16)}
    assert need[64] - need[32] == 24_896_000 and need[32] - need[16] == 12_448_000
    fit = lambda cap: memory.fitting_micro_tokens(WIDE, r, {0: cap}, shared)  # noqa: E731
    assert fit(need[64]) is None                 # it fits as it is: nothing to change
    assert fit(need[64] - 1) == 32               # over by a byte: half the budget
    assert fit(need[32]) == 32
    assert fit(need[32] - 1) == 16               # one row of 16 tokens: the floor
    assert fit(need[16] - 1) is None             # not even one row: the refusal stands
    assert memory.fitting_micro_tokens(WIDE, replace(r, micro_tokens=0), {0: need[64] - 1}, shared) is None


def test_with_the_reserve_the_budget_halves_until_the_whole_plan_fits():
    """On a GPU the learner shares with its sampler, a plan whose counted items fit but whose total
    with the allocator's reserve does not is halved too (with_reserve); without it nothing changes."""
    r = RunShape(ranks=1, ipc=False, staging=False, rows=2, micro_batch=4, micro_tokens=64, prompt_tokens=10,
                 new_tokens=6, precision="autocast")
    shared = {"learner0": 0, "sampler0": 0}
    total = {t: sum(b for items in memory.plan(WIDE, replace(r, micro_tokens=t)).values() for _, b in items)
             for t in (64, 32, 16)}
    counted = memory._counted(memory.plan(WIDE, r), shared, 0)
    assert counted < total[64] - 1               # at 64 tokens the counted items fit a GPU of total[64] - 1 bytes
    fit = lambda cap, w: memory.fitting_micro_tokens(WIDE, r, {0: cap}, shared, with_reserve=w)  # noqa: E731
    assert fit(total[64] - 1, False) is None     # counted items fit: the plain rule keeps 64
    assert fit(total[64] - 1, True) == 32        # with the reserve: half
    assert fit(total[32] - 1, True) == 16
    assert fit(total[64], True) is None          # the whole plan fits as it is


def test_the_launcher_gives_every_rank_the_halved_budget_and_says_so(monkeypatch, capsys, config_folder):
    """The default budget (the default --train-batch-size 16 on one rank: 16 rows of 128 + 1024
    tokens) on a GPU that holds only half of it: the learner gets --micro-batch-tokens 9216 and one
    line says why; a budget given by hand is kept and refused as before."""
    from grpo.launch.memfit import check_memory, memory_inputs
    from grpo.launch.plan import parse, place
    from grpo.launch.runplan import from_flags, with_placement

    def plan_for(extra):
        cfg, to_s, to_l = parse(["--model", str(config_folder), "--sampling-gpus", "0", "--training-gpus", "0",
                                 "--share-gpus", "--max-new-tokens", "1024", *extra])
        return with_placement(from_flags(cfg, to_s, to_l), place(cfg, 1))

    rp = plan_for([])
    shape, r = memory_inputs(rp, 1, 1)
    assert r.micro_tokens == 16 * (128 + 1024) == 18432
    shared = {"learner0": 0, "sampler0": 0}
    half = memory._counted(memory.plan(shape, replace(r, micro_tokens=9216)), shared, 0)
    monkeypatch.setattr(probe, "gpu_total_bytes", lambda: {0: half})
    done = check_memory(rp)
    assert done.learner.training.micro_batch_tokens == 9216 and done.sampler == rp.sampler
    err = capsys.readouterr().err
    assert "learner micro-batches of at most 9216 tokens, not the default 18432: at the default the plan does not " \
           "fit GPU 0: learner0 + sampler0 need about" in err and "(--micro-batch-tokens sets it)" in err
    assert "memory plan: learner0" in err and "error" not in err and err.count("does not fit GPU") == 1
    with pytest.raises(launch_main.LaunchError, match="does not fit GPU 0"):
        check_memory(plan_for(["--micro-batch-tokens", "18432"]))


def test_on_a_shared_gpu_the_reserve_counts_and_the_budget_halves(monkeypatch, capsys, config_folder):
    """Counted items that fit but a reserve that does not: on a GPU the learner shares with its sampler
    the default budget halves until the whole plan fits, said in one line; on GPUs of their own only
    the warning is said (there the reserve is an estimate of a cache no other process competes for)."""
    from grpo.launch.memfit import check_memory, memory_inputs
    from grpo.launch.plan import parse, place
    from grpo.launch.runplan import from_flags, with_placement

    def plan_for(*layout):
        cfg, to_s, to_l = parse(["--model", str(config_folder), *layout, "--max-new-tokens", "1024"])
        return with_placement(from_flags(cfg, to_s, to_l), place(cfg, 2))

    rp = plan_for("--sampling-gpus", "0", "--training-gpus", "0", "--share-gpus")
    shape, r = memory_inputs(rp, 1, 1)
    p = memory.plan(shape, r)
    whole = sum(b for items in p.values() for _, b in items)
    assert memory._counted(p, {"learner0": 0, "sampler0": 0}, 0) < whole - 1
    monkeypatch.setattr(probe, "gpu_total_bytes", lambda: {0: whole - 1, 1: whole - 1})
    done = check_memory(rp)
    want = memory.fitting_micro_tokens(shape, r, {0: whole - 1}, {"learner0": 0, "sampler0": 0}, with_reserve=True)
    assert want and done.learner.training.micro_batch_tokens == want < r.micro_tokens
    err = capsys.readouterr().err
    assert f"learner micro-batches of at most {want} tokens, not the default {r.micro_tokens}: at the default the " \
           f"plan may not fit GPU 0: learner0 + sampler0 need about" in err and "warning" not in err
    apart = plan_for("--sampling-gpus", "1", "--training-gpus", "0")
    learner_alone = sum(b for _, b in memory.plan(*memory_inputs(apart, 1, 1))["learner0"])
    monkeypatch.setattr(probe, "gpu_total_bytes", lambda: {0: learner_alone - 1, 1: whole})
    assert check_memory(apart).learner.training.micro_batch_tokens == 0
    err = capsys.readouterr().err
    assert "micro-batches of at most" not in err and "warning: the memory plan may not fit GPU 0: learner0 need" in err


def test_in_flight_rows_the_staleness_bound_cannot_fill_raise_a_default_bound_or_are_said(monkeypatch, capsys, tmp_path):
    """320 rows in flight, steps of 128 completions in groups of 16 (8 groups), --max-staleness 2
    (Staleness.pool_rows): one sampler keeps 2 x 8 = 16 groups, 256 rows, decoding, and 3 would keep
    all 320 (20 groups); two samplers keep 128 rows each and need 5. A default bound is raised to
    that and IN_FLIGHT_SPAN (2) more, 5, on every learner rank and said; with steps of 2 groups one
    sampler needs 10, and 12 is past AUTO_STALENESS_MAX (8); a bound given by hand (or set in a
    --config file) is kept: then the line only says which bound would fill the rows. Rounds (no rows
    in flight, or no swaps) are left alone."""
    from grpo.config import LearnerConfig, SamplerConfig
    from grpo.flags import parse_config
    from grpo.launch.inflight import in_flight_note, resolve_in_flight
    from grpo.launch.plan import parse, place
    from grpo.launch.runplan import from_flags, with_placement

    S = ["--num-generations", "16", "--in-flight-rows", "320", "--generation-backend", "fast"]
    L = ["--train-batch-size", "128"]

    def note(s, lr, samplers):
        return in_flight_note(parse_config(SamplerConfig, s, "s"), parse_config(LearnerConfig, lr, "l"), samplers)

    need, why = note(S, L, 2)
    assert need == 5 and why == (
        "at --max-staleness 2 the learner's budget lets each of the 2 samplers keep about 128 of its 320 "
        "--in-flight-rows decoding (--max-staleness x 8 groups a step / samplers, 16 rows a group; more where "
        "zero-signal groups are filtered)")
    assert note(S, L, 1)[0] == 3
    assert note(S, L + ["--max-staleness", "5"], 2) is None
    assert note(S + ["--no-swap-in-flight"], L, 2) is None
    assert note(S[:2], L, 2) is None                   # rounds: no rows in flight
    assert note([*S[:4], "--device", "cpu"], L, 2) is None   # auto on CPU: hf, no rows
    assert note([*S[:4], "--device", "auto"], L, 2)[0] == 5  # auto on CUDA: the engine

    said = {}   # the last call's stdout (the first round's line is there)

    def bound_after(*extra):
        """(the learner's --max-staleness once the launcher's choices are made, what it said on stderr)."""
        cfg, to_s, to_l = parse(["--device", "cpu", "--model", "tiny-random", *L, *S, *extra])
        rp = with_placement(from_flags(cfg, to_s, to_l), place(cfg, 0))
        done = resolve_in_flight(rp, rp.placement.samplers, rp.placement.cuda)
        captured = capsys.readouterr()
        said["out"] = captured.out
        return done.learner.training.max_staleness, captured.err

    bound, err = bound_after()
    assert bound == 5
    assert err.startswith("run_distributed.py: --max-staleness 5, not the default 2, so that every in-flight row is "
                          "kept decoding: at --max-staleness 2 the learner's budget lets the sampler keep about 256")
    assert "decoding (--max-staleness x 8 groups a step / samplers, 16 rows a group; more where zero-signal groups " \
           "are filtered); 3 fills them, and 2 more are for the versions a group's longest completion takes" in err
    # --screen-generations: a group's rest starts once its screen has ended, so twice the span: 3 + 4
    bound, err = bound_after("--screen-generations", "4")
    assert bound == 7 and "3 fills them, and 4 more are for the versions a group takes to generate its screen, " \
        "then its rest;" in err
    bound, err = bound_after("--max-staleness", "2")
    assert bound == 2 and "warning: at --max-staleness 2" in err
    assert "--max-staleness 3 would keep all of them decoding, with groups up to 3 versions old" in err
    config = tmp_path / "c.yaml"
    config.write_text("train_batch_size: 128\n")
    bound, err = bound_after("--config", str(config))   # a file that leaves the bound alone: chosen as typed
    assert bound == 5
    config.write_text("train_batch_size: 128\nmax_staleness: 2\n")
    bound, err = bound_after("--config", str(config))   # a file that sets it: kept, and said
    assert bound == 2 and "warning: at --max-staleness 2" in err
    bound, err = bound_after("--train-batch-size", "64")         # 4 groups a step: 5 fill, 7 set
    assert bound == 7
    bound, err = bound_after("--train-batch-size", "32")         # 2 groups a step: 10 fill, 12 past 8
    assert "--max-staleness 10 would keep all of them" in err
    # but round 0's 8 groups (fit_first_round) need (3 + 1) x 2: 3, raised for them and said
    assert bound == 3
    assert "[launcher] --max-staleness 3, not the default 2, so that the learner trains every group" in said["out"]

    def stop(host, ports):
        raise launch_main.LaunchError("port check reached")

    monkeypatch.setattr(launch_main, "check_ports", stop)
    assert launch_main.main(["--device", "cpu", "--model", "tiny-random", *L, *S]) == 2
    err = capsys.readouterr().err
    assert "run_distributed.py: --max-staleness 5, not the default 2" in err and "port check reached" in err


def test_a_short_names_fetched_gguf_gives_the_plan_its_shape(monkeypatch, tmp_path):
    """--model qwen2.5-coder-0.5b: the launcher plans from the fetched file's header (rows in flight
    are chosen from the shape; without it the run fell back to fixed rounds); not yet fetched: one line."""
    import shutil

    from grpo.model import fetch

    gguf = _gguf_or_skip()
    monkeypatch.setattr(fetch, "RECEIVE_DIR", tmp_path / "received")
    monkeypatch.setenv("GRPO_CACHE", str(tmp_path / "cache"))
    monkeypatch.setenv("GRPO_GGUF_DIR", str(tmp_path / "mine"))
    assert probe.read_shape("qwen2.5-coder-0.5b") == (None, "memory plan skipped: no config.json for --model "
                                                            "qwen2.5-coder-0.5b here yet (built or fetched at load)")
    spec = fetch.MODELS["qwen2.5-coder-0.5b"]
    (tmp_path / "mine").mkdir()
    mine = tmp_path / "mine" / spec["file"]
    shutil.copyfile(gguf, mine)                 # SmolLM2's header, padded to the size find() checks
    with open(mine, "r+b") as fh:
        fh.truncate(spec["bytes"])
    shape, note = probe.read_shape("qwen2.5-coder-0.5b")
    assert (shape.params, note) == (134_515_008, "")
