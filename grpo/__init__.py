"""GRPO as a ZeroMQ actor/learner system: samplers generate, a DeepSpeed group learns."""

__version__ = "0.1.0"
