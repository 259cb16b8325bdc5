"""The GPU workers' caching-allocator setting (not a flag: an environment variable they set)."""
from __future__ import annotations

# The caching allocator's mode. Every GPU process of a run uses expandable segments unless the
# user set PYTORCH_CUDA_ALLOC_CONF (or torch's newer PYTORCH_ALLOC_CONF) themselves (the memory it
# saves: docs/configuration.md). Segments that grow in place leave fewer freed blocks too small for the next request, which is what
# the token budget's micro-batches of varying shape make. The workers apply it before torch loads
# (grpo.workers); the memory plan's reserve (grpo.rules.memory) and the start-up log (grpo.obs.gpu)
# read it. Here, in the lowest layer: torch-free, and below every module that needs it.
ALLOC_ENV = "PYTORCH_CUDA_ALLOC_CONF"
ALLOC_ENVS = ("PYTORCH_ALLOC_CONF", ALLOC_ENV)   # torch reads either; the user's wins over ours
ALLOC_DEFAULT = "expandable_segments:True"


def allocator_conf(environ) -> tuple[str, bool]:
    """(the allocator settings a worker runs with, whether they are the user's): the user's
    PYTORCH_ALLOC_CONF or PYTORCH_CUDA_ALLOC_CONF where set (even to ""), else ALLOC_DEFAULT."""
    for name in ALLOC_ENVS:
        if name in environ:
            return environ[name], True
    return ALLOC_DEFAULT, False


def expandable_segments(conf: str) -> bool:
    """Whether allocator settings ("key:value,key:value", torch's syntax) turn expandable segments
    on; the last expandable_segments option wins, as in torch's parser, and it is off by default."""
    on = False
    for option in conf.split(","):
        key, _, value = option.partition(":")
        if key.strip() == "expandable_segments":
            on = value.strip().lower() in ("true", "1")
    return on


def use_allocator_default(environ) -> tuple[str, bool]:
    """Before torch loads in a GPU worker: set PYTORCH_CUDA_ALLOC_CONF to ALLOC_DEFAULT unless the
    user set allocator settings; returns allocator_conf's answer."""
    conf, users = allocator_conf(environ)
    if not users:
        environ[ALLOC_ENV] = conf
    return conf, users
