"""The learner role: its setup (build, then wire), the loop (receive, train, publish), the training
step (figures reduced by name), intake and accounting of groups, sampler liveness, the global
batch, the optimizer engine (DeepSpeed ZeRO-2 or plain PyTorch), fused kernels (Liger's), checkpoints
and LoRA."""
