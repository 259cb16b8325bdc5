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
    """CURVE keys folder (python -m grpo.wire.curve DIR) to encrypt (empty: off)."""


@dataclass
class SamplerFaultsSection:
    """A sampler's backpressure and heartbeat."""

    section = "faults and security"

    send_hwm: int = at_least(1, 16)
    """Data socket's high-water mark, in groups."""
    on_full: OnFull = "block"
    """Full socket: wait (up to --send-timeout-s) or drop."""
    send_timeout_s: float = at_least(0, 600.0, "0: no limit")
    """With --on-full block: longest wait at the high-water mark before a drop (0: no limit)."""
    heartbeat_interval_s: float = at_least(0, 2.0, "0: off")
    """Seconds between heartbeats (0: off)."""


@dataclass
class LearnerFaultsSection:
    """What the learner accepts, and how long it waits."""

    section = "faults and security"

    bind_host: str = ""
    """Address rank 0 binds (empty: --host), e.g. 0.0.0.0."""
    heartbeat_timeout_s: float = positive(30.0)
    """A sampler silent this long is counted as gone."""
    buffer_size: int = at_least(1, 1024)
    """Most groups queued; the oldest are dropped."""
    max_samplers: int = at_least(1, 256)
    """Sampler ids must be below this."""
    max_prompt_tokens: int = at_least(1, 4096)
    """Groups with longer prompts are dropped."""
    max_message_mb: int = at_least(1, 64)
    """Largest data message accepted, in MiB."""
    data_timeout_s: float = positive(60.0)
    """Log 'no data for N s' this often while waiting; groups a sampler has sent that have not come in that long count as lost."""
    shutdown_timeout_s: float = at_least(0, 120.0)
    """Wait for samplers' final status at the end."""
    dist_timeout_s: float = positive(3600.0)
    """Timeout of the learner's collectives."""
