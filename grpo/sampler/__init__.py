"""The sampler role: the loop (generate with grpo.generate, score, log-probs, send whole groups),
and the heartbeat and backpressure of its data socket."""
