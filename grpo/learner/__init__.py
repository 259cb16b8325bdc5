"""The learner role: the loop (receive, train, publish), intake and accounting of groups, sampler
liveness, the global batch, the optimizer engine (DeepSpeed ZeRO-2 or plain PyTorch),
checkpoints and LoRA."""
