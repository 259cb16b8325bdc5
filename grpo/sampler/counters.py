"""The sampler's counters: what every status it sends carries (SamplerStatus.stats), typed.

One field per count, each written by one module of grpo.sampler (its comment names the owner,
and a test holds every write to it), always through add, put or raise_to, which take the lock.
The heartbeat thread reads them only through snapshot or read, under the same lock, so a status
never holds half of an update (a round's samples without its tokens). Only the main thread writes.

The wire's stats stay one flat map with the keys the learner, grpo.obs.report and bench/ read:
the fixed fields by their names, then the dict fields' keys as they are (stream_*, curriculum/*,
reward_failures/<reward>/<type>). groups_sent is the status's own field, not a stats key: the
groups offered to the data socket plus those filtered as zero-signal, so every status has sent >=
dropped by construction.
"""
from __future__ import annotations

import threading
from dataclasses import dataclass, field, fields

from grpo.generate.stream import STREAM_COUNTS


def _stream() -> dict[str, float]:
    return {f"stream_{k}": 0.0 for k in STREAM_COUNTS}


@dataclass(slots=True)
class SamplerCounters:
    samples: float = 0.0               # workflow: completions scored
    tokens: float = 0.0                # workflow: tokens generated
    gen_s: float = 0.0                 # workflow: seconds generating
    logprob_s: float = 0.0             # workflow: seconds in the old and reference log-prob passes
    reward_s: float = 0.0              # workflow: seconds scoring
    sync_s: float = 0.0                # weights_client: seconds asking for and waiting on weights
    weight_bytes: float = 0.0          # weights_client: bytes of the versions applied
    weight_syncs: float = 0.0          # weights_client: versions applied
    apply_s: float = 0.0               # weights_client: seconds applying them
    rounds: float = 0.0                # loop: rounds sent
    dropped_full: float = 0.0          # heartbeat: groups dropped at the HWM (--on-full drop; send_group)
    dropped_send_timeout: float = 0.0  # heartbeat: groups dropped after --send-timeout-s (send_group)
    dropped_zero_signal: float = 0.0   # workflow: groups filtered as zero-signal (--filter-zero-signal)
    peak_mem_gb: float = 0.0           # workflow: GiB allocated, the run's largest (all rounds)
    peak_reserved_gb: float = 0.0      # workflow: GiB reserved, the run's largest
    eval_version: float = -1.0         # loop: the version last evaluated (sampler 0, --eval-every)
    eval_accuracy: float = 0.0         # loop: its greedy pass@1
    eval_seconds: float = 0.0          # loop: its seconds
    verified_version: float = -1.0     # weights_client: the version last fingerprinted (--verify-weight-sync)
    verified_checksum: float = 0.0     # weights_client: its fingerprint
    budget_wait_s: float = 0.0         # loop: seconds waiting for the learner's queue to have room
    swaps: float = 0.0                 # weights_client: versions applied between decode steps (--swap-in-flight)
    reward_failures: float = 0.0       # workflow: completions a reward could not score (their failure value counted)
    prompts_deferred: float = 0.0      # workflow: --defer-zero-signal: train prompts passed over once
    zero_signal_solved: float = 0.0    # workflow: of dropped_zero_signal, groups every completion of which was correct
    zero_signal_unsolved: float = 0.0  # workflow: of dropped_zero_signal, groups none of whose completions was
    screened_out: float = 0.0          # workflow: --screen-generations: prompts dropped at their screen (all alike)
    screened_solved: float = 0.0       # workflow: of screened_out, screens every completion of which was correct
    screened_unsolved: float = 0.0     # workflow: of screened_out, screens none of whose completions was
    screen_samples: float = 0.0        # workflow: completions those screens cost (in samples too)
    stream: dict[str, float] = field(default_factory=_stream)   # workflow: stream_<k>, the engine's stream_counts
    curriculum: dict[str, float] = field(default_factory=dict)  # workflow: curriculum/<task>/{level,groups,rate}
    reward_kinds: dict[str, float] = field(default_factory=dict)  # workflow: reward_failures/<reward>/<type>
    groups_offered: int = 0            # heartbeat: groups offered to the data socket (those dropped there included; hand_group)
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False, compare=False)

    # ------------------------------------------------------------------ writes (the owner's, main thread)
    def add(self, **deltas: float) -> None:
        """Add to numeric fields, all at one instant for the readers."""
        with self._lock:
            for name, delta in deltas.items():
                setattr(self, name, getattr(self, _numeric(name)) + delta)

    def put(self, **values) -> None:
        """Set numeric fields; merge into dict fields (a key once reported stays, with its last value)."""
        with self._lock:
            for name, value in values.items():
                if name in DICT_FIELDS:
                    getattr(self, name).update(value)
                else:
                    setattr(self, _numeric(name), value)

    def raise_to(self, **values: float) -> None:
        """Numeric fields to the larger of their value and the one given (peaks)."""
        with self._lock:
            for name, value in values.items():
                setattr(self, name, max(getattr(self, _numeric(name)), value))

    # ------------------------------------------------------------------ reads
    @property
    def groups_sent(self) -> int:
        """Groups offered to the data socket or filtered as zero-signal (SamplerStatus.groups_sent)."""
        return self.groups_offered + int(self.dropped_zero_signal)

    def handed(self) -> int:
        """Groups this process has handed to its data socket (made, minus those it dropped itself)."""
        return self.groups_offered - int(self.dropped_full + self.dropped_send_timeout)

    def values(self) -> dict:
        """The stats map as it is (the values' own types), at one instant: the sampler's result."""
        with self._lock:
            return self._values()

    def snapshot(self) -> dict[str, float]:
        """The stats map of a status, at one instant (safe from the heartbeat thread)."""
        with self._lock:
            return {k: float(v) for k, v in self._values().items()}

    def read(self) -> tuple[int, dict[str, float]]:
        """(groups_sent, snapshot()) at one instant: what a status carries."""
        with self._lock:
            return self.groups_sent, {k: float(v) for k, v in self._values().items()}

    def _values(self) -> dict:
        out = {name: getattr(self, name) for name in FIXED_FIELDS}
        for name in DICT_FIELDS:
            out.update(getattr(self, name))
        return out


_ALL = [f.name for f in fields(SamplerCounters) if not f.name.startswith("_")]
DICT_FIELDS = ("stream", "curriculum", "reward_kinds")
"""Fields that hold several stats keys each (their keys are the wire's, as they are)."""
FIXED_FIELDS = tuple(n for n in _ALL if n not in DICT_FIELDS and n != "groups_offered")
"""Fields that are one stats key each, by their name."""


def _numeric(name: str) -> str:
    if name not in _ALL or name in DICT_FIELDS:
        raise AttributeError(f"SamplerCounters has no numeric field {name!r}")
    return name
