"""Observability: the run directory, metrics.jsonl, tracking (TensorBoard, W&B), progress, GPU
stats and the run report."""
