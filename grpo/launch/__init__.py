"""run_distributed.py: the launch plan (pure), the supervisor, and the entry point."""
