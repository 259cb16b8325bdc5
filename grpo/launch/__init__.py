"""run_distributed.py: the launch plan (pure), what the memory plan is read from (probe), the supervisor, and the
entry point. The rules it applies (the split, the memory plan, staleness) are grpo.rules'."""
