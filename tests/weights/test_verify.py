"""--verify-weight-sync's books: fingerprints of published versions against what samplers report."""
import torch

from grpo.weights.verify import MASK48, PublishedFingerprints, fingerprint


def _model(seed: int) -> torch.nn.Module:
    torch.manual_seed(seed)
    return torch.nn.Sequential(torch.nn.Linear(4, 3), torch.nn.Linear(3, 2))


def test_matches_mismatches_and_unknown_versions_are_counted_once_each():
    learner, sampler = _model(0), _model(0)
    pub = PublishedFingerprints(keep=2)
    pub.record(1, learner, torch.bfloat16)
    with torch.no_grad():
        learner[0].weight.add_(0.5)
    pub.record(2, learner, torch.bfloat16)
    pub.record(3, learner, torch.bfloat16)          # keep=2: version 1 is forgotten
    assert list(pub.by_version) == [2, 3]
    same = fingerprint(learner, torch.bfloat16)
    stale = fingerprint(sampler, torch.bfloat16)    # the weights before the update
    assert same != stale and 0 <= same <= MASK48 and same == float(int(same))
    pub.check(0, {"verified_version": 2.0, "verified_checksum": same})
    pub.check(0, {"verified_version": 2.0, "verified_checksum": same})   # a heartbeat repeats it
    pub.check(1, {"verified_version": 3.0, "verified_checksum": stale})
    pub.check(1, {"verified_version": 1.0, "verified_checksum": stale})  # older than kept
    pub.check(2, {"verified_version": -1.0, "verified_checksum": 0.0})   # has applied nothing yet
    rep = pub.report()
    assert (rep["versions_checked"], rep["matched"], rep["mismatched"], rep["all_matched"]) == (2, 1, 1, False)
    assert rep["per_sampler"]["1"]["mismatched_versions"] == [3]
    assert rep["per_sampler"]["1"]["unknown_version"] == 1 and "2" not in rep["per_sampler"]


def test_fingerprint_is_taken_in_the_published_dtype():
    a = _model(1)
    b = _model(1)
    with torch.no_grad():
        b[1].bias.add_(1e-6)  # below bf16's resolution near these values, visible in fp32
    assert fingerprint(a, torch.float32) != fingerprint(b, torch.float32)
    assert fingerprint(a, torch.bfloat16) == fingerprint(b, torch.bfloat16)
