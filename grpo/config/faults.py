"""The faults and security section: backpressure, heartbeats, timeouts, limits on what a peer may send, encryption."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from grpo.config.bounds import at_least, positive

OnFull = Literal["block", "drop"]


@dataclass
class FaultsSection:
    """Encryption of both channels."""

    section = "faults and security"

    curve_keys: str = ""
    """Folder of ZeroMQ CURVE keys (make them with: python -m grpo.wire.curve DIR): encrypt both channels and admit only samplers holding the client key (empty: plain TCP)."""


@dataclass
class SamplerFaultsSection:
    """A sampler's backpressure and heartbeat."""

    section = "faults and security"

    send_hwm: int = at_least(1, 16)
    """High-water mark of the data socket in groups: beyond it a send blocks (backpressure) instead of growing memory."""
    on_full: OnFull = "block"
    """At the high-water mark: 'block' (wait, up to --send-timeout-s) or 'drop' (drop the group at once); dropped groups are counted."""
    send_timeout_s: float = at_least(0, 600.0, "0: no limit")
    """With --on-full block: the longest one group waits at the high-water mark before it is dropped and counted (0: no limit)."""
    heartbeat_interval_s: float = at_least(0, 2.0, "0: off")
    """Send a status (heartbeat) to the learner this often, from a thread of its own (0: off)."""


@dataclass
class LearnerFaultsSection:
    """What the learner accepts, and how long it waits."""

    section = "faults and security"

    bind_host: str = ""
    """Address rank 0 binds its two ports on (empty: --host, itself 127.0.0.1 by default); e.g. 0.0.0.0 when samplers reach the learner by name. Anything but loopback is logged as a warning (use --curve-keys across hosts)."""
    heartbeat_timeout_s: float = positive(30.0)
    """A sampler silent this long is counted as gone (logged) and not waited for; it is welcomed back when it speaks again."""
    buffer_size: int = at_least(1, 1024)
    """Received groups waiting to be trained, at most (a FIFO): beyond it the oldest is dropped and counted as buffer_full."""
    max_samplers: int = at_least(1, 256)
    """Sampler ids must be below this; messages naming others are dropped, so no peer can grow the learner's tables."""
    max_prompt_tokens: int = at_least(1, 4096)
    """Groups whose prompt is longer (or whose completions exceed --max-new-tokens) are dropped as too_long before training."""
    max_message_mb: int = at_least(1, 64)
    """Largest data message accepted, in MiB; larger ones are dropped by ZeroMQ before allocation."""
    data_timeout_s: float = positive(60.0)
    """Log 'no data for N s' at this interval while waiting for groups."""
    shutdown_timeout_s: float = at_least(0, 120.0)
    """At the end, how long to wait for every sampler's final status so every group is accounted for."""
    dist_timeout_s: float = positive(3600.0)
    """Timeout of the learner's process-group collectives (waiting for data counts against it)."""
