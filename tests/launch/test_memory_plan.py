"""The memory plan (grpo.launch.memory): hand-worked numbers, the refusal line, and the launcher
computing it only for CUDA runs."""
import json

import pytest

from grpo.launch import main as launch_main
from grpo.launch import memory
from grpo.launch.memory import GiB, RunShape, Shape

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
    # the allocator's reserve, a rough rule: 1.4 x the activations under full fine-tuning
    assert l0["allocator reserve"] == l1["allocator reserve"] == int(1.4 * 157_696) == 220_774
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
    from grpo.config import LearnerConfig, SamplerConfig

    ds = tmp_path / "ds.json"
    ds.write_text(json.dumps({"train_micro_batch_size_per_gpu": 8}))
    shape = lambda **kw: memory.run_shape(LearnerConfig(**kw), SamplerConfig(), 1, 1, str(ds))  # noqa: E731
    assert (shape().precision, shape().deepspeed) == ("autocast", True)
    assert shape(lora_r=16).precision == "bf16"              # LoRA: the frozen base stays bf16
    assert shape(precision="bf16").precision == "bf16"
    assert (shape(no_deepspeed=True).precision, shape(no_deepspeed=True).deepspeed) == ("autocast", False)


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
    assert l0["allocator reserve"] == int(0.2 * l0["activations"])   # LoRA's measured reserve is smaller


def test_sampler_kv_cache_and_reference_model():
    # KV cache: 2 (K, V) x layers 2 x rows 3 x seq (5 + 7 = 12) x kv_dim 32 x 2 bytes = 9,216
    assert memory.kv_cache(SHAPE, rows=3, seq=12) == 2 * 2 * 3 * 12 * 32 * 2 == 9216
    s = items(memory.plan(SHAPE, RunShape(rows=3, prompt_tokens=5, new_tokens=7, beta=0.04)), "sampler0")
    assert s["KV cache"] == 9216 and s["weights"] == 2_000_000 and s["reference model"] == 2_000_000
    # ipc/nccl stage a whole version beside the live weights: one more copy, 2 x 1e6 bytes
    assert s["weight staging"] == 2_000_000
    # the allocator's reserve: 1.5 x (KV cache + log-prob pass); the pass here is batch min(64, 3) = 3 x 12
    # tokens x (2 x 64 + 2 x 256) x 2 bytes = 46,080 plus the logits 2 x 36,000 x 4 = 288,000
    assert s["log-prob pass"] == 46_080 + 288_000
    assert s["allocator reserve"] == int(1.5 * (9216 + 334_080)) == 514_944
    s0 = items(memory.plan(SHAPE, RunShape(beta=0.0, shared=True)), "sampler0")
    assert "reference model" not in s0 and s0["weights"] == 0 and "weight staging" not in s0
    tcp = items(memory.plan(SHAPE, RunShape(ipc=False, staging=False)), "sampler0")
    assert "weight staging" not in tcp
    # log-prob pass: batch 2 x seq 12 x (2 x 64 + 2 x 256) x 2 bytes = 30,720, plus the float32 logits
    # chunk and its log_softmax: here the whole 2 x 12 x 1000 logits (below 2^27): 2 x 24,000 x 4 = 192,000
    assert memory.logprob_pass(SHAPE, 2, 12) == 30_720 + 192_000


def test_rows_from_the_flags():
    from grpo.config import LearnerConfig, SamplerConfig

    l = LearnerConfig()
    assert memory.run_shape(l, SamplerConfig(num_generations=8), 1, 1, "/nonexistent").rows == 64 * 8
    assert memory.run_shape(l, SamplerConfig(prompts_per_round=4, num_generations=8), 1, 1, "").rows == 32
    assert memory.run_shape(l, SamplerConfig(in_flight_rows=100), 1, 1, "").rows == 100


def test_micro_batch_from_the_deepspeed_config(tmp_path):
    path = tmp_path / "ds.json"
    path.write_text(json.dumps({"train_micro_batch_size_per_gpu": 32}))
    assert memory.micro_batch_size(str(path), 16, 2) == 8       # capped by a rank's share, 16 / 2
    assert memory.micro_batch_size(str(path), 256, 2) == 32
    path.write_text(json.dumps({"train_micro_batch_size_per_gpu": "auto"}))
    assert memory.micro_batch_size(str(path), 16, 3) == 6        # ceil(16 / 3)


def test_shape_from_a_real_config_counts_smollm2():
    cfg = {"hidden_size": 576, "num_hidden_layers": 30, "vocab_size": 49152, "num_attention_heads": 9,
           "head_dim": 64, "num_key_value_heads": 3, "intermediate_size": 1536, "tie_word_embeddings": True}
    s = memory.shape_from_config(cfg)
    assert s.params == 134_515_008          # SmolLM2-135M's published count
    assert s.kv_dim == 192 and s.q_dim == 576


def test_qwen25_shapes_give_the_published_parameter_counts():
    """The random:qwen2.5-* shapes are the real models': their sizes as the model cards give them."""
    from grpo.model import QWEN25_SHAPES

    published = {"0.5b": 494_032_768, "1.5b": 1_543_714_304, "3b": 3_085_938_688, "7b": 7_615_616_512}
    got = {k: memory.shape_from_config({**v, "model_type": "qwen2"}).params for k, v in QWEN25_SHAPES.items()}
    assert got == published


def test_built_folders_match_the_model_builders():
    from grpo import model

    assert memory.BUILT_FOLDERS == {k: v[0] for k, v in model._BUILDERS.items()}


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
    assert memory.gpu_total_bytes() == {}


def test_cpu_run_computes_no_plan(monkeypatch, capsys):
    calls = []
    monkeypatch.setattr(memory, "plan", lambda *a, **k: calls.append(a) or {})
    monkeypatch.setattr(memory, "read_shape", lambda *a: calls.append(a) or (None, "x"))
    monkeypatch.setattr(launch_main, "check_port", lambda *a: (_ for _ in ()).throw(launch_main.LaunchError("stop")))
    assert launch_main.main(["--device", "cpu", "--model", "tiny-random"]) == 2
    assert calls == []
    assert "memory plan" not in capsys.readouterr().err


def test_cuda_run_logs_the_plan_and_refuses_what_does_not_fit(monkeypatch, capsys, config_folder):
    folder = config_folder
    monkeypatch.setattr(launch_main, "cuda_device_count", lambda: 2)
    monkeypatch.setattr(launch_main, "check_sampler_flags", lambda flags: None)
    monkeypatch.setattr(memory, "gpu_total_bytes", lambda: {0: GiB // 4, 1: 80 * GiB})
    rc = launch_main.main(["--model", str(folder), "--sampling-gpus", "0", "--training-gpus", "1"])
    err = capsys.readouterr().err
    assert rc == 2
    assert "memory plan: learner0" in err and "memory plan: sampler0" in err
    assert "does not fit GPU 0" in err and "CUDA context" in err
    # --no-memory-check: the same plan is a warning, and the launch goes on to its next check
    # (stopped here by a port check that fails on purpose, before anything starts)

    def busy(host, port, flag):
        raise launch_main.LaunchError(f"port check reached for {flag}")

    monkeypatch.setattr(launch_main, "check_port", busy)
    rc = launch_main.main(["--model", str(folder), "--sampling-gpus", "0", "--training-gpus", "1",
                           "--no-memory-check"])
    err = capsys.readouterr().err
    assert rc == 2 and "warning: the memory plan does not fit GPU 0" in err and "port check reached" in err
