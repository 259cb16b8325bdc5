"""--verify-weight-sync: evidence, end to end, that samplers run exactly the weights published.

The learner fingerprints (grpo.model.load.weights_checksum, cut to 48 bits so it travels exactly
as a float in the status message's stats map) every version it publishes, in the dtype it
publishes; each sampler fingerprints its own policy right after applying a version and
reports (version, fingerprint) in its status messages. The learner compares each pair once
and reports checked / matched / mismatched versions per sampler in its summary. With
`shared` this also proves that the optimizer updated the very storages the sampler maps.
Costs one pass over the weights per version on each side: for tests and benchmarks.
"""
from __future__ import annotations

import collections
import logging

import torch

from grpo.model.load import weights_checksum

log = logging.getLogger(__name__)
MASK48 = (1 << 48) - 1


def fingerprint(model: torch.nn.Module, dtype: torch.dtype) -> float:
    return float(int(weights_checksum(model, dtype), 16) & MASK48)


class PublishedFingerprints:
    """The learner's side: fingerprints of recent published versions and the comparison books."""

    def __init__(self, keep: int = 512):
        self.keep = keep
        self.by_version: collections.OrderedDict[int, float] = collections.OrderedDict()
        # The version each sampler last reported: its heartbeats repeat it until it applies
        # another, so one entry per sampler (not one per pair ever seen) keeps each check single.
        self.last: dict[int, int] = {}
        self.books: dict[int, collections.Counter] = collections.defaultdict(collections.Counter)
        self.mismatched: dict[int, list[int]] = collections.defaultdict(list)

    def record(self, version: int, model: torch.nn.Module, dtype: torch.dtype) -> None:
        self.by_version[version] = fingerprint(model, dtype)
        while len(self.by_version) > self.keep:
            self.by_version.popitem(last=False)

    def check(self, sampler_id: int, stats: dict) -> None:
        version = int(stats.get("verified_version", -1))
        if version < 0 or self.last.get(sampler_id) == version:
            return
        self.last[sampler_id] = version
        want = self.by_version.get(version)
        if want is None:
            self.books[sampler_id]["unknown_version"] += 1   # older than we keep, or a made-up one
        elif want == stats.get("verified_checksum"):
            self.books[sampler_id]["matched"] += 1
        else:
            self.books[sampler_id]["mismatched"] += 1
            self.mismatched[sampler_id].append(version)
            log.warning("sampler %d runs different weights than version %d published (fingerprints differ)",
                        sampler_id, version)

    def report(self) -> dict:
        per = {str(i): {**c, "mismatched_versions": self.mismatched.get(i, [])[:20]} for i, c in self.books.items()}
        matched = sum(c["matched"] for c in self.books.values())
        bad = sum(c["mismatched"] for c in self.books.values())
        return {"versions_checked": matched + bad, "matched": matched, "mismatched": bad,
                "all_matched": matched > 0 and bad == 0, "per_sampler": per}
