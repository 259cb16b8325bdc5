"""The sampler role: the loop (generate, score, log-probs, send whole groups), the rollout engine,
and the heartbeat and backpressure of its data socket."""
