"""weights_checksum: the fingerprint the 4-GPU run compares across ZeRO-2 ranks."""
import copy

import torch

from grpo.model.load import weights_checksum


def _model(dtype):
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.Linear(16, 4)).to(dtype)


def test_equal_weights_equal_checksum_and_one_bit_changes_it():
    for dtype in (torch.float32, torch.bfloat16):
        a = _model(dtype)
        b = copy.deepcopy(a)
        assert weights_checksum(a) == weights_checksum(b)
        with torch.no_grad():
            bits = b[1].weight.view(-1).view(torch.int16 if dtype == torch.bfloat16 else torch.int32)
            bits[5] ^= 1   # the lowest mantissa bit of one element
        assert weights_checksum(a) != weights_checksum(b)


def test_swapping_two_elements_changes_it():
    a = _model(torch.float32)
    b = copy.deepcopy(a)
    with torch.no_grad():
        w = b[0].weight.view(-1)
        w[0], w[1] = w[1].clone(), w[0].clone()
    assert weights_checksum(a) != weights_checksum(b)


def test_position_weighted_sum_hand_worked():
    """Weights k % 65521 + 1 by position k, summed in wrapping int64, whatever the bits' width."""
    from grpo.model.load import _position_weighted_sum

    assert _position_weighted_sum(torch.tensor([1, 2, 3], dtype=torch.int32)) == 1 + 4 + 9
    # past one period the weights start again at 1: 1 + ... + 65521, then 1 + 2
    assert _position_weighted_sum(torch.ones(65523, dtype=torch.int16)) == 65521 * 65522 // 2 + 3
    assert _position_weighted_sum(torch.ones(65521 * 2, dtype=torch.uint8)) == 65521 * 65522
    # 2**62 * 1 + 2**62 * 2 = 3 * 2**62 wraps to -2**62 in int64, as a per-element product sum does
    assert _position_weighted_sum(torch.tensor([2**62, 2**62], dtype=torch.int64)) == -2**62
    assert _position_weighted_sum(torch.zeros(0, dtype=torch.int32)) == 0
