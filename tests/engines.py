"""Learner engines for tests in any folder: a TorchEngine or a one-rank DeepSpeed ZeRO-2 engine (gloo,
CPU) on a model folder, with the repo's deepspeed.json, and one training step on random ids."""
import os
from pathlib import Path

import torch

from grpo.learner.engine import DeepSpeedEngine, TorchEngine, init_process_group, load_ds_config, resolve_ds_config
from grpo.model.load import load_causal_lm

ROOT = Path(__file__).resolve().parents[1]
CPU = torch.device("cpu")


def _ds_config(lr=1e-2):
    cfg, _ = resolve_ds_config(load_ds_config(str(ROOT / "deepspeed.json")), world=1, train_batch_size=4,
                               group_size=4, learning_rate=lr, cuda=False)
    return cfg


def _engine(kind, path, ds_config=None):
    model = load_causal_lm(path, CPU, torch.float32)
    ds_config = ds_config or _ds_config()
    if kind == "torch":
        return TorchEngine(model, ds_config, CPU)
    from netutil import free_ports

    # The rendezvous variables only while the group and engine are made: left in os.environ, the
    # learners that later tests start would inherit this (bound) MASTER_PORT.
    saved = {k: os.environ.get(k) for k in ("MASTER_ADDR", "MASTER_PORT", "RANK", "WORLD_SIZE", "LOCAL_RANK")}
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(free_ports(1)[0]), RANK="0",
                      WORLD_SIZE="1", LOCAL_RANK="0")
    try:
        if not torch.distributed.is_initialized():
            init_process_group(torch.device("cpu"), 1800.0)   # gloo, as a CPU learner's
        return DeepSpeedEngine(model, ds_config)
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


def _train_step(engine, seed):
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(0, 1000, (2, 12), generator=g)
    for _ in range(engine.gas):
        out = engine.module(input_ids=ids, use_cache=False).logits
        engine.backward(out.float().logsumexp(-1).mean())
    engine.step()
