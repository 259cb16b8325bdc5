"""The sampler role: setup (builds its parts in start-up order), the loop (wait for weights, run
the workflow, send, report), the weights client (the sync port: requests, the first answer,
applying versions, method fallbacks), the rollout workflow (prompts in, scored groups out,
generated with grpo.generate), the counters every status carries, and the heartbeat and
backpressure of its data socket."""
