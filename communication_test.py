"""Check both ZeroMQ channels between two processes on this host (no GPU, no model)."""
import sys

from grpo.wire.selftest import main

if __name__ == "__main__":
    sys.exit(main())
