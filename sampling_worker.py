"""Sampler: generate, score, compute behaviour/reference log-probs, send groups (see README)."""
import sys

from grpo.workers import sampler_main

if __name__ == "__main__":
    sys.exit(sampler_main())
