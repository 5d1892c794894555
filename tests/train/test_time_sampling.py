"""Stratified time sampling through the recipe: the levels of a step's global batch fall one in
each stratum, and every sample's noise is the same under any rank / micro-batch split."""

from __future__ import annotations

from dataclasses import replace

import pytest
import torch

from dlmkit.data import GlobalBatchSampler
from dlmkit.train.recipe import build_components, prepare_micro_batches

from .helpers import config
from .test_recipe import CPU

G = 8


def per_sample_noise(c, cfg, *, world_size: int, micro: int, step: int = 1) -> dict:
    """``sample index -> (p_mask row, noise row)`` over all ranks of ``step``."""
    out = {}
    for rank in range(world_size):
        sampler = GlobalBatchSampler(len(c.train_set), G, rank=rank, world_size=world_size,
                                     micro_batch_size=micro, seed=cfg["seed"])
        for indices, p in zip(sampler.micro_batches(step),
                              prepare_micro_batches(step, replace(c.step_context(cfg, CPU),
                                                                  sampler=sampler))):
            for row, index in enumerate(indices):
                n = len(c.train_set[index]["input_ids"])
                out[index] = (p["p_mask"][row, :n].clone(), p["noise_mask"][row, :n].clone())
    return out


@pytest.mark.parametrize("name", ["mdlm", "bd3lm"])
def test_levels_are_split_invariant_and_one_per_stratum(name):
    cfg = config("train.global_batch_size=8", strategy=name)
    c = build_components(cfg, CPU)
    ref = per_sample_noise(c, cfg, world_size=1, micro=8)
    assert len(ref) == G
    for world_size, micro in ((1, 2), (2, 4), (2, 1), (4, 2)):
        other = per_sample_noise(c, cfg, world_size=world_size, micro=micro)
        assert other.keys() == ref.keys()
        for index, (p, noise) in ref.items():
            assert torch.equal(other[index][0], p) and torch.equal(other[index][1], noise), \
                (name, world_size, micro, index)
    # Each sample's level (its row's, or its first block's for bd3lm: block 0 of every row is
    # rotated by the same 0 * PHI) falls in its own stratum of the global batch.
    t_min, t_max = c.strategy.config["t_min"], c.strategy.config["t_max"]
    first = torch.stack([p[0].double() for p, _ in ref.values()])
    level = ((first - t_min) / (t_max - t_min)).clamp(0, 1 - 1e-9)
    assert sorted((level * G).floor().long().tolist()) == list(range(G))


def test_scdd_times_are_split_invariant_and_one_per_stratum():
    """SCDD with ``time_sampling: stratified``: one diffusion time per row on the grid above
    ``t_min``, one per stratum of the global batch, the same under any split. T = 1000 and
    t_min = 0.201 leave 800 grid points (201/T ... 1000/T), 100 to each of the 8 strata."""
    cfg = config("train.global_batch_size=8", "strategy.time_sampling=stratified",
                 "strategy.t_min=0.201", strategy="scdd")
    c = build_components(cfg, CPU)
    ref = per_sample_noise(c, cfg, world_size=1, micro=8)
    for world_size, micro in ((1, 2), (2, 4), (4, 2)):
        other = per_sample_noise(c, cfg, world_size=world_size, micro=micro)
        for index, (t, noise) in ref.items():
            assert torch.equal(other[index][0], t) and torch.equal(other[index][1], noise)
    grid = torch.stack([(t[0].double() * 1000).round() for t, _ in ref.values()])
    assert bool((grid >= 201).all())
    assert sorted(((grid - 201) // 100).long().tolist()) == list(range(G))


def test_scdd_time_options_are_checked():
    for option, message in (("strategy.t_min=1.0", r"strategy.t_min must be a number in \[0, 1\)"),
                            ("strategy.time_sampling=sobol", "time_sampling must be one of")):
        with pytest.raises(ValueError, match=message):
            build_components(config(option, strategy="scdd"), CPU)
