"""Launcher: the learner group and one sampler per sampling GPU, supervised (see README)."""
import sys

from grpo.launch.main import main

if __name__ == "__main__":
    sys.exit(main())
