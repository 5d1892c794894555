"""Per-sample seeds: range, disjointness, step independence of validation, layout invariance."""

from __future__ import annotations

import pytest
import torch

from dlmkit.data.seeds import (
    sample_generators,
    sample_seed,
    validation_generators,
    validation_seed,
)
from dlmkit.diffusion import corrupt_blockwise, corrupt_uniform


def test_deterministic_and_in_range():
    assert sample_seed(42, 7, 3) == sample_seed(42, 7, 3)
    seeds = [sample_seed(s, st, i) for s in (0, 1) for st in (0, 5) for i in range(50)]
    assert all(0 <= x < 2**63 for x in seeds)
    assert len(set(seeds)) == len(seeds)  # seed, step and index all change the result
    assert max(seeds) > 2**62  # uses the high bits too


def test_indices_of_a_step_never_collide_and_bits_are_mixed():
    seeds = [sample_seed(0, 0, i) for i in range(20000)]
    assert len(set(seeds)) == len(seeds)
    # neighbouring indices differ in about half of the 63 bits
    flips = [bin(a ^ b).count("1") for a, b in zip(seeds, seeds[1:])]
    assert 28 < sum(flips) / len(flips) < 35


def test_validation_seed_ignores_the_step_and_differs_from_training():
    v = validation_seed(3, 11)
    assert v == validation_seed(3, 11)
    assert v not in {sample_seed(3, step, 11) for step in range(1000)}
    assert validation_seed(3, 11) != validation_seed(4, 11)
    g1 = validation_generators(3, [11])[0]
    g2 = validation_generators(3, [11])[0]
    assert torch.equal(torch.rand(4, generator=g1), torch.rand(4, generator=g2))


def layouts():
    """(world_size, accumulation, micro-batch size) splits of a global batch of 12."""
    return [(1, 1, 12), (2, 3, 2), (4, 1, 3), (3, 2, 2), (6, 2, 1)]


@pytest.mark.parametrize("corrupt", [
    lambda i, m, g: corrupt_uniform(i, m, 99, generator=g),
    lambda i, m, g: corrupt_blockwise(i, m, 99, block_size=4, generator=g),
])
def test_same_noise_for_a_sample_under_any_rank_and_micro_batch_layout(corrupt):
    step, seed, gbs = 5, 1234, 12
    g = torch.Generator().manual_seed(0)
    lengths = torch.randint(6, 15, (gbs,), generator=g)
    samples = [torch.randint(0, 90, (int(n),), generator=g) for n in lengths]
    results = []
    for world, accum, mbs in layouts():
        noise_of = {}
        for rank in range(world):
            for micro in range(accum):
                # rank r owns a contiguous slice of the step's global batch, split in order
                start = rank * (gbs // world) + micro * mbs
                idx = list(range(start, start + mbs))
                width = max(len(samples[i]) for i in idx)  # batches pad to their own max
                ids = torch.zeros(len(idx), width, dtype=torch.long)
                lm = torch.zeros(len(idx), width)
                for r, i in enumerate(idx):
                    ids[r, : len(samples[i])] = samples[i]
                    lm[r, 2: len(samples[i])] = 1.0
                _, noise, _ = corrupt(ids, lm, sample_generators(seed, step, idx))
                for r, i in enumerate(idx):
                    noise_of[i] = noise[r, : len(samples[i])]
        results.append(noise_of)
    for other in results[1:]:
        for i in range(gbs):
            assert torch.equal(results[0][i], other[i])
    assert any(results[0][i].any() for i in range(gbs))


@pytest.mark.parametrize("args", [(-1, 0, 0), (0, -1, 0), (0, 0, -1), (0, 2**62, 0),
                                  (1.5, 0, 0), (0, 0, 2**63)])
def test_bad_arguments(args):
    with pytest.raises(ValueError, match="seed|step|sample_index"):
        sample_seed(*args)
