"""The generation layer every role uses (the sampler's rollouts, every greedy evaluation, the
benchmarks): backend rules and the Hugging Face fallback (backend), the engine's attention, layer
plan and masks (attention), its static caches and per-shape buffers (cache), the one sampling step
(sampling), graph capture (capture), and the engine itself: fixed batches (engine) and the
in-flight ring with its weights versions per token (stream); greedy decoding for the held-out
evaluation (greedy: grpo.evaluate scores what it decodes)."""
