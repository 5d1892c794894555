"""Stratified time sampling: one level per stratum of the global batch, unbiased, and a
lower-variance ``1/p``-weighted loss than i.i.d. levels."""

from __future__ import annotations

import math

import pytest
import torch

from dlmkit.data.seeds import sample_generators
from dlmkit.diffusion import corrupt_uniform
from dlmkit.diffusion.timesteps import PHI, strata, stratified

MASK = 99
G, L = 64, 12


def levels(stratum, *, step=0, eps=1e-3, t_max=1.0, block_size=None):
    """The level in [0, 1) of every row (or position) of a G-row batch."""
    ids = torch.zeros(G, L, dtype=torch.long)
    _, _, p = corrupt_uniform(ids, torch.ones(G, L), MASK, eps=eps, t_max=t_max,
                              block_size=block_size, stratum=stratum, num_strata=G,
                              generator=sample_generators(0, step, range(G)))
    return ((p.double() - eps) / (t_max - eps)).clamp(0, 1 - 1e-12)


def slots():
    return torch.arange(G)[:, None].expand(G, L)


def one_per_stratum(level: torch.Tensor) -> bool:
    return sorted((level * G).floor().long().tolist()) == list(range(G))


def test_row_levels_fall_one_in_each_stratum():
    assert one_per_stratum(levels(strata(slots(), G))[:, 0])
    # The check discriminates: i.i.d. levels of the same draws leave strata empty.
    assert not one_per_stratum(levels(None)[:, 0])


def test_block_levels_fall_one_in_each_rotated_stratum():
    block = 4
    blocks = torch.arange(L)[None, :].expand(G, L) // block
    lv = levels(strata(slots(), G, blocks), block_size=block)
    for j in range(L // block):
        column = lv[:, j * block]
        assert one_per_stratum(torch.remainder(column - j * PHI, 1.0)), j
        assert (lv[:, j * block:(j + 1) * block] == column[:, None]).all()  # one per block


def test_clipped_range_and_same_draws_as_iid():
    """t_max clips p to [eps, t_max); without strata the levels are the i.i.d. ones (the
    draw layout is unchanged, so the iid mode reproduces the old noise exactly)."""
    ids = torch.zeros(G, L, dtype=torch.long)
    gens = lambda: sample_generators(0, 5, range(G))  # noqa: E731
    _, _, p = corrupt_uniform(ids, torch.ones(G, L), MASK, eps=0.2, t_max=0.8, generator=gens())
    assert (p >= 0.2).all() and (p < 0.8).all()
    _, _, a = corrupt_uniform(ids, torch.ones(G, L), MASK, eps=1e-3, generator=gens())
    _, _, b = corrupt_uniform(ids, torch.ones(G, L), MASK, eps=1e-3, stratum=None,
                              num_strata=G, generator=gens())
    assert torch.equal(a, b)


def test_stratified_levels_are_uniform_over_the_batch():
    """Unbiased: the batch's levels average to 1/2 and their mean of 1/(eps + t) equals the
    integral, within the stratification error (far below i.i.d. noise)."""
    eps = 1e-3
    lv = levels(strata(slots(), G))[:, 0]
    assert abs(lv.mean().item() - 0.5) < 1.0 / G
    exact = math.log((1 + eps) / eps)  # integral of 1/(eps + t) over [0, 1)
    inv = (1.0 / (eps + (1 - eps) * lv)).mean().item()
    assert abs(inv - exact) / exact < 0.5  # i.i.d. levels often miss by far more


def loss_estimates(*, stratified_levels: bool, eps: float = 1e-3, token_loss=None,
                   steps: int = 200) -> torch.Tensor:
    """The MDLM estimate ``sum(noise * loss(p) / p) / n`` of a batch, over ``steps`` steps
    (the same per-sample draws whatever the options)."""
    ids = torch.zeros(G, L, dtype=torch.long)
    out = []
    for step in range(steps):
        s = strata(slots(), G) if stratified_levels else None
        _, noise, p = corrupt_uniform(ids, torch.ones(G, L), MASK, eps=eps, stratum=s,
                                      num_strata=G, generator=sample_generators(0, step, range(G)))
        value = torch.ones_like(p) if token_loss is None else token_loss(p)
        out.append((noise * value / p).sum() / noise.numel())
    return torch.stack(out).double()


def test_stratified_levels_lower_the_variance_of_a_level_dependent_loss():
    """A token's loss grows with the masked fraction (less context), so the batch estimate
    varies with the levels drawn; stratified levels remove most of that variance (i.i.d.
    levels, same draws, fail this by far)."""
    iid = loss_estimates(stratified_levels=False, token_loss=lambda p: 4.0 * p)
    strat = loss_estimates(stratified_levels=True, token_loss=lambda p: 4.0 * p)
    assert abs(strat.mean().item() - 2.0) < 0.05 and abs(iid.mean().item() - 2.0) < 0.1
    assert strat.var().item() < 0.3 * iid.var().item(), (strat.var(), iid.var())


def test_clipping_t_min_bounds_the_one_over_p_weights():
    """The 1/p weight's own (Bernoulli) noise grows like log(1/t_min): a clipped range cuts
    it (stratification cannot: given its level, each token's estimate is already unbiased)."""
    wide = loss_estimates(stratified_levels=True, eps=1e-3)
    clipped = loss_estimates(stratified_levels=True, eps=0.1)
    assert clipped.var().item() < 0.5 * wide.var().item(), (clipped.var(), wide.var())


def test_strata_checks_its_inputs():
    with pytest.raises(ValueError, match="num_slots"):
        strata(slots(), 0)
    with pytest.raises(ValueError, match="< num_slots"):
        strata(slots(), G - 1)
    with pytest.raises(ValueError, match="block_index"):
        strata(slots(), G, torch.zeros(G, L + 1, dtype=torch.long))
    with pytest.raises(ValueError, match="stratum"):
        stratified(torch.rand(G, L, dtype=torch.float64), torch.zeros(G, 1), G)
    with pytest.raises(ValueError, match="t_max"):
        corrupt_uniform(torch.zeros(2, 3, dtype=torch.long), torch.ones(2, 3), MASK, eps=0.5,
                        t_max=0.4, generator=torch.Generator())
