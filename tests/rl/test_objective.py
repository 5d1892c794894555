"""Advantages, the clipped surrogate and the KL term against hand-computed values."""

from __future__ import annotations

import math

import pytest
import torch

from dlmkit.rl.objective import STD_EPS, clipped_surrogate, group_advantages, k3


def test_group_advantages_by_hand():
    rewards = torch.tensor([[1.0, 0.0, 0.0, 1.0], [2.0, 2.0, 2.0, 2.0], [3.0, 0.0, 0.0, 0.0]],
                           dtype=torch.float64)
    a = group_advantages(rewards)
    # group 0: mean 0.5, sample std sqrt(4 * 0.25 / 3) = 0.57735
    half = 0.5 / (math.sqrt(1 / 3) + STD_EPS)
    assert a[0].tolist() == pytest.approx([half, -half, -half, half], abs=1e-12)
    assert a[1].tolist() == [0.0, 0.0, 0.0, 0.0]  # no spread: no signal
    # group 2: mean 0.75, sample std sqrt((2.25^2 + 3 * 0.75^2) / 3) = 1.5
    assert a[2].tolist() == pytest.approx([2.25 / (1.5 + STD_EPS)] + [-0.75 / (1.5 + STD_EPS)] * 3,
                                          abs=1e-12)
    assert group_advantages(rewards, scale=False)[2].tolist() == [2.25, -0.75, -0.75, -0.75]
    with pytest.raises(ValueError, match=r"rewards must be \[prompts, G >= 2\]"):
        group_advantages(torch.ones(3, 1))


def test_clip_by_hand():
    lengths = torch.tensor([2.0, 1.0, 4.0, 1.0], dtype=torch.float64)
    ratios = torch.tensor([1.5, 0.7, 1.1, 0.7], dtype=torch.float64)
    logp = (lengths * ratios.log()).requires_grad_(True)
    old = torch.zeros(4, dtype=torch.float64)
    adv = torch.tensor([1.0, -1.0, 2.0, 1.0], dtype=torch.float64)
    surrogate, clipped = clipped_surrogate(logp, old, adv, lengths, 0.2)
    # r=1.5, A=1: min(1.5, 1.2); r=0.7, A=-1: min(-0.7, -0.8); r=1.1 inside the clip; r=0.7,
    # A=1: min(0.7, 0.8) keeps the unclipped term
    assert surrogate.tolist() == pytest.approx([1.2, -0.8, 2.2, 0.7], abs=1e-12)
    assert clipped.tolist() == [True, True, False, False]
    surrogate.sum().backward()
    # d/dlogp of r A with r = exp(logp / n): r A / n, zero where the clip holds
    assert logp.grad.tolist() == pytest.approx([0.0, 0.0, 1.1 * 2 / 4, 0.7 * 1 / 1], abs=1e-12)


def test_kl_value_and_gradient_by_hand():
    n = torch.tensor([3.0], dtype=torch.float64)
    logp = torch.zeros(1, dtype=torch.float64, requires_grad=True)
    ref = n * math.log(2.0)  # d = ln 2 per token
    value = k3(logp, ref, n)
    assert float(value.detach()) == pytest.approx(2 - math.log(2) - 1, abs=1e-12)
    value.sum().backward()
    # d/dlogp (e^d - d - 1), d = (ref - logp) / n: (1 - e^d) / n = -1/3: descending the loss
    # raises logp towards ref
    assert float(logp.grad) == pytest.approx(-1 / 3, abs=1e-12)
    same = k3(torch.tensor([1.5], dtype=torch.float64), torch.tensor([1.5],
                                                                    dtype=torch.float64), n)
    assert float(same) == 0.0
