"""Learner: a DeepSpeed ZeRO-2 group (or one PyTorch process) training on sampled groups (see README)."""
import sys

from grpo.workers import learner_main

if __name__ == "__main__":
    sys.exit(learner_main())
