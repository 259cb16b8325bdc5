"""The sampler role: the loop (wait for weights, run the workflow, send, report), the weights
client (the sync port: requests, the first answer, applying versions, method fallbacks), the
rollout workflow (prompts in, scored groups out, generated with grpo.generate), and the heartbeat
and backpressure of its data socket."""
