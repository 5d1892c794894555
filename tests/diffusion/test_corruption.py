"""Corruption processes: support, exactness, marginals, reproducibility, errors."""

from __future__ import annotations

import math

import pytest
import torch

from dlmkit.diffusion import (
    corrupt_all_masked,
    corrupt_blockwise,
    corrupt_mix,
    corrupt_scdd,
    corrupt_uniform,
    corrupt_uniform_random,
    timesteps,
)
from tests.diffusion.reference import rng_untouched

V, MASK = 11, 10

CORRUPTIONS = {
    "uniform": lambda i, m, g: corrupt_uniform(i, m, MASK, eps=0.05, generator=g),
    "blockwise_row": lambda i, m, g: corrupt_blockwise(i, m, MASK, generator=g),
    "blockwise_block": lambda i, m, g: corrupt_blockwise(i, m, MASK, block_size=4, generator=g),
    "uniform_random_row": lambda i, m, g: corrupt_uniform_random(i, m, V, generator=g),
    "uniform_random_block": lambda i, m, g: corrupt_uniform_random(i, m, V, block_size=4,
                                                                   generator=g),
    "mix": lambda i, m, g: corrupt_mix(i, m, MASK, V, mask_prob=0.3, uniform_prob=0.4,
                                       generator=g),
    "scdd": lambda i, m, g: corrupt_scdd(i, m, MASK, V, num_timesteps=8, max_ratio=0.3,
                                         generator=g),
}
STOCHASTIC = list(CORRUPTIONS)


def batch(b=6, length=13, seed=0):
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(0, MASK, (b, length), generator=g)
    loss_mask = torch.zeros(b, length)
    for r in range(b):  # prompt of r tokens, then a response, then padding
        loss_mask[r, r: length - (r % 3)] = 1.0
    return ids, loss_mask


def gen(seed):
    return torch.Generator().manual_seed(seed)


@pytest.mark.parametrize("name", STOCHASTIC)
def test_noise_only_on_supervised_positions(name):
    ids, lm = batch()
    for seed in range(20):
        noisy, noise, p = CORRUPTIONS[name](ids, lm, gen(seed))
        assert noisy.dtype == ids.dtype and noise.dtype == torch.bool
        assert p.dtype == torch.float32 and p.shape == ids.shape
        assert not (noise & (lm == 0)).any()
        assert torch.equal(noisy[lm == 0], ids[lm == 0])
        assert torch.equal(noisy[~noise], ids[~noise]) or name.startswith("uniform_random")
        changed = noisy != ids
        assert not (changed & ~noise).any()


def test_all_masked():
    ids, lm = batch()
    noisy, noise, p = corrupt_all_masked(ids, lm, MASK)
    assert torch.equal(noise, lm != 0)
    assert (noisy[noise] == MASK).all() and torch.equal(noisy[~noise], ids[~noise])
    assert torch.equal(p, torch.ones_like(p))


@pytest.mark.parametrize("name", STOCHASTIC)
def test_generator_reproducible_and_global_rng_untouched(name):
    ids, lm = batch()
    first = CORRUPTIONS[name](ids, lm, gen(3))
    rng_untouched(lambda: CORRUPTIONS[name](ids, lm, gen(3)))
    again = CORRUPTIONS[name](ids, lm, gen(3))
    other = CORRUPTIONS[name](ids, lm, gen(4))
    for a, b in zip(first, again):
        assert torch.equal(a, b)
    assert not all(torch.equal(a, b) for a, b in zip(first, other))


@pytest.mark.parametrize("name", STOCHASTIC)
def test_per_row_generators_independent_of_grouping_and_padding(name):
    """Row b with generator list [g_b] equals that sample alone, even padded longer."""
    ids, lm = batch()
    gens = [gen(100 + r) for r in range(ids.shape[0])]
    together = CORRUPTIONS[name](ids, lm, gens)
    for r in range(ids.shape[0]):
        pad = 3  # same sample in a batch padded to a longer length
        ids_r = torch.cat([ids[r: r + 1], torch.zeros(1, pad, dtype=ids.dtype)], 1)
        lm_r = torch.cat([lm[r: r + 1], torch.zeros(1, pad)], 1)
        alone = CORRUPTIONS[name](ids_r, lm_r, [gen(100 + r)])
        length = ids.shape[1]
        sup = lm[r] != 0
        assert torch.equal(alone[0][0, :length], together[0][r])
        assert torch.equal(alone[1][0, :length], together[1][r])
        assert torch.equal(alone[2][0, :length][sup], together[2][r][sup])


def test_uniform_marginals():
    """P(noise | p) = p with p = (1 - eps) t + eps, t ~ U[0, 1): checked by Monte Carlo."""
    b, length, eps = 4000, 16, 0.05
    ids = torch.zeros(b, length, dtype=torch.long)
    lm = torch.ones(b, length)
    _, noise, p = corrupt_uniform(ids, lm, MASK, eps=eps, generator=gen(0))
    assert (p >= eps).all() and (p < 1).all()
    assert torch.equal(p, p[:, :1].expand_as(p))
    n = noise.numel()
    # noise - p has mean 0 and variance <= 1/4 per entry: 5 sigma on the mean.
    assert abs((noise.double() - p.double()).mean().item()) < 5 * 0.5 / math.sqrt(n)
    assert abs(p.double().mean().item() - (1 + eps) / 2) < 5 * 0.3 / math.sqrt(b)


def test_uniform_random_marginals_and_replacements():
    b, length, vocab = 3000, 16, 7
    ids = torch.full((b, length), 3, dtype=torch.long)
    lm = torch.ones(b, length)
    noisy, noise, t = corrupt_uniform_random(ids, lm, vocab, eps=0.1, generator=gen(1))
    assert abs((noise.double() - t.double()).mean().item()) < 5 * 0.5 / math.sqrt(noise.numel())
    counts = torch.bincount(noisy[noise], minlength=vocab).double()
    expected = counts.sum() / vocab  # self-transition included: uniform over all V
    assert ((counts - expected).abs() < 5 * expected.sqrt()).all()
    # per-block levels differ between blocks of one row
    _, _, tb = corrupt_uniform_random(ids[:2], lm[:2], vocab, block_size=4, generator=gen(2))
    assert tb[0, 0] != tb[0, 4] and torch.equal(tb[0, :4], tb[0, :1].expand(4))


def test_mix_channels_and_replacements():
    b, length = 3000, 12
    ids = torch.randint(0, MASK, (b, length), generator=gen(5))
    ids[:, 0] = MASK  # a clean token equal to MASK is never transitioned
    lm = torch.ones(b, length)
    mp, up = 0.25, 0.45
    noisy, noise, p = corrupt_mix(ids, lm, MASK, V, mask_prob=mp, uniform_prob=up,
                                  generator=gen(6))
    body = slice(1, None)
    absorbed = (noisy[:, body] == MASK)
    replaced = noise[:, body] & ~absorbed
    n = absorbed.numel()
    assert abs(absorbed.double().mean().item() - mp) < 5 * math.sqrt(mp * (1 - mp) / n)
    assert abs(replaced.double().mean().item() - up) < 5 * math.sqrt(up * (1 - up) / n)
    assert not (noisy[:, body][replaced] == ids[:, body][replaced]).any()
    assert torch.equal(noisy[:, 0], ids[:, 0]) and not noise[:, 0].any()
    # uniform over the V - 2 tokens other than MASK and the clean token
    for clean in (0, 4, 9):
        sel = replaced & (ids[:, body] == clean)
        counts = torch.bincount(noisy[:, body][sel], minlength=V).double()
        assert counts[clean] == 0 and counts[MASK] == 0
        others = torch.cat([counts[:clean], counts[clean + 1: MASK]])
        exp = others.sum() / (V - 2)
        assert ((others - exp).abs() < 5 * exp.sqrt()).all()
    assert torch.allclose(p, torch.full_like(p, mp + up))
    # every clean token MASK: ids stay in range
    all_mask = torch.full((4, 5), MASK)
    out, nm, _ = corrupt_mix(all_mask, torch.ones(4, 5), MASK, V, mask_prob=0.0,
                             uniform_prob=1.0, generator=gen(0))
    assert torch.equal(out, all_mask) and not nm.any()


def test_scdd_time_grid_and_channels():
    T = 5
    b = 5000
    ids = torch.zeros(b, 6, dtype=torch.long)
    lm = torch.ones(b, 6)
    noisy, _, p = corrupt_scdd(ids, lm, MASK, V, num_timesteps=T, generator=gen(7))
    t = p[:, 0]
    counts = torch.stack([(t == (i + 1) / T).sum() for i in range(T)]).double()
    assert counts.sum() == b  # every t on the grid {1/T, ..., 1}
    assert ((counts - b / T).abs() < 5 * math.sqrt(b / T)).all()
    assert (noisy[t == 1.0] == MASK).all()  # t = 1: everything absorbed


def test_scdd_t_min_clips_the_grid_and_strata_spread_the_batch():
    """t_min keeps only the grid points i/T >= t_min, each equally likely; t_min = 0 is the
    full grid draw for draw; with strata the batch's times fall one per stratum."""
    T, b = 10, 6000
    ids = torch.zeros(b, 4, dtype=torch.long)
    lm = torch.ones(b, 4)
    _, _, full = corrupt_scdd(ids, lm, MASK, V, num_timesteps=T, generator=gen(3))
    _, _, zero = corrupt_scdd(ids, lm, MASK, V, num_timesteps=T, t_min=0.0, generator=gen(3))
    assert torch.equal(full, zero)
    _, _, p = corrupt_scdd(ids, lm, MASK, V, num_timesteps=T, t_min=0.3, generator=gen(3))
    t = p[:, 0]
    counts = torch.stack([(t == i / T).sum() for i in range(1, T + 1)]).double()
    assert counts[:2].sum() == 0 and counts.sum() == b  # 0.1, 0.2 gone; 0.3 (= t_min) kept
    assert ((counts[2:] - b / 8).abs() < 5 * math.sqrt(b / 8)).all()
    # 8 rows in 8 strata: their uniforms land one per eighth, so the 8 grid times of
    # {0.3, ..., 1.0} (8 points) are each drawn exactly once.
    g = 8
    stratum = torch.arange(g, dtype=torch.float64) / g
    _, _, p = corrupt_scdd(ids[:g], lm[:g], MASK, V, num_timesteps=T, t_min=0.3,
                           stratum=stratum, num_strata=g, generator=gen(5))
    assert sorted(p[:, 0].tolist()) == pytest.approx([i / T for i in range(3, T + 1)])
    with pytest.raises(ValueError, match=r"t_min must be a number in \[0, 1\), got 1.0"):
        corrupt_scdd(ids, lm, MASK, V, num_timesteps=T, t_min=1.0, generator=gen(0))


def unit_sums(values, block_size, length):
    if block_size is None:
        return values.sum(-1, keepdim=True)
    nb = -(-length // block_size)
    padded = torch.nn.functional.pad(values, (0, nb * block_size - length))
    return padded.reshape(values.shape[0], nb, block_size).sum(-1)


@pytest.mark.parametrize("block_size", [None, 4])
def test_blockwise_exact_k_and_late_bias(block_size):
    ids, lm = batch(b=6, length=13)
    sup = lm != 0
    for seed in range(30):
        _, noise, p = corrupt_blockwise(ids, lm, MASK, block_size=block_size, generator=gen(seed))
        p_sup = torch.where(sup, p.double(), 0.0)
        k = unit_sums(p_sup, block_size, 13)
        n_sup = unit_sums(sup.double(), block_size, 13)
        assert torch.allclose(k, k.round(), atol=1e-4)  # inclusion probabilities sum to k
        assert torch.equal(unit_sums(noise.double(), block_size, 13), k.round())
        assert ((k.round() >= 1) | (n_sup == 0)).all()  # every unit with supervision masks >= 1
        assert (p_sup[sup] > 0).all() and (p <= 1).all()
        units = [slice(0, 13)] if block_size is None else \
            [slice(i, i + block_size) for i in range(0, 13, block_size)]
        for r in range(6):
            for u in units:
                vals = p[r, u][sup[r, u]]
                assert (vals[1:] >= vals[:-1] - 1e-6).all()  # later never less likely


@pytest.mark.parametrize("block_size", [None, 4])
def test_blockwise_importance_weighted_sum_is_unbiased(block_size):
    """E[sum noise * c / p_mask] = sum_{supervised} c (Horvitz-Thompson), by Monte Carlo.

    The reference design's weight (the unit level m, read here from an unsupervised position)
    is measurably biased on the same draws, so this test can fail.
    """
    reps, length = 20000, 12
    lm = torch.zeros(reps, length)
    lm[:, 3:11] = 1.0  # prompt 0..2, response 3..10, padding 11
    ids = torch.zeros(reps, length, dtype=torch.long)
    c = torch.linspace(0.5, 3.0, length, dtype=torch.float64)  # any per-position values
    _, noise, p = corrupt_blockwise(ids, lm, MASK, block_size=block_size, eps=0.05,
                                    generator=gen(11))
    est = (noise.double() * c / p.double()).sum(-1)
    truth = c[3:11].sum().item()
    se = est.std().item() / math.sqrt(reps)
    assert abs(est.mean().item() - truth) < 4 * se
    assert abs((noise.double() - p.double())[:, 3:11].mean().item()) < 0.01
    if block_size is None:
        m = p[:, :1].double()  # unsupervised positions carry the level m
        naive = (noise.double() * c / m).sum(-1)
        assert abs(naive.mean().item() - truth) > 10 * se


@pytest.mark.parametrize("block_size", [None, 4])
def test_blockwise_level_is_clipped_to_t_max_and_stratified(block_size):
    """Each unit's level is ``m = eps + (t_max - eps) * frac(stratum + U / num_strata)`` with
    ``U`` the i.i.d. draw (read off the unsupervised positions, which carry ``m``); the
    defaults (``t_max`` 1, no strata) give exactly the draws they gave before."""
    b, length, eps = 8, 12, 0.2
    ids = torch.zeros(b, length, dtype=torch.long)
    lm = torch.ones(b, length)
    lm[:, 3::4] = 0  # one unsupervised position per block of 4 (three per row)
    first = 3 if block_size is None else slice(3, None, 4)

    def levels(**kw):
        _, noise, p = corrupt_blockwise(ids, lm, MASK, block_size=block_size, eps=eps,
                                        generator=gen(4), **kw)
        return noise, p[:, first].double().reshape(b, -1)

    noise, m = levels()
    explicit, m_explicit = levels(t_max=1.0, stratum=None, num_strata=1)
    assert torch.equal(noise, explicit) and torch.equal(m, m_explicit)
    u = (m - eps) / (1 - eps)  # the i.i.d. uniforms
    slot = torch.arange(b)[:, None].expand(b, length)
    blocks = None if block_size is None else torch.arange(length).expand(b, -1) // block_size
    stratum = timesteps.strata(slot, b, blocks)
    unit_stratum = stratum[:, :1] if block_size is None else stratum[:, ::block_size]
    noise_half, m_half = levels(t_max=0.5, stratum=stratum, num_strata=b)
    want = eps + (0.5 - eps) * torch.frac(unit_stratum + u / b)
    torch.testing.assert_close(m_half, want, rtol=0, atol=1e-6)
    assert (m_half < 0.5).all() and (m >= 0.5).any() and not torch.equal(noise_half, noise)
    # Per unit column j, the b levels fall one in each of the b strata of [eps, t_max)
    # (rotated by j * PHI, as timesteps.strata rotates a document's later blocks).
    rotation = torch.frac(torch.arange(m.shape[1], dtype=torch.float64) * timesteps.PHI)

    def strata_hit(levels):
        return ((levels - rotation) % 1.0 * b).floor().long().T.tolist()

    assert all(sorted(c) == list(range(b)) for c in strata_hit((m_half - eps) / (0.5 - eps)))
    assert not all(sorted(c) == list(range(b)) for c in strata_hit(u))  # i.i.d. levels do not


@pytest.mark.parametrize(
    "call, match",
    [
        (lambda i, m: corrupt_uniform(i, m, MASK, eps=0.0, generator=gen(0)), "eps"),
        (lambda i, m: corrupt_uniform(i, m, MASK, eps=1.0, generator=gen(0)), "eps"),
        (lambda i, m: corrupt_uniform(i, m[:, :3], MASK, generator=gen(0)), "loss_mask"),
        (lambda i, m: corrupt_uniform(i, m, MASK, generator=None), "generator"),
        (lambda i, m: corrupt_uniform(i, m, MASK, generator=[gen(0)]), "generator"),
        (lambda i, m: corrupt_uniform(i.float(), m, MASK, generator=gen(0)), "input_ids"),
        (lambda i, m: corrupt_uniform(i[0], m[0], MASK, generator=gen(0)), "input_ids"),
        (lambda i, m: corrupt_mix(i, m, MASK, 2, mask_prob=0.1, uniform_prob=0.1,
                                  generator=gen(0)), "vocab_size"),
        (lambda i, m: corrupt_mix(i, m, 11, V, mask_prob=0.1, uniform_prob=0.1,
                                  generator=gen(0)), "mask_token_id"),
        (lambda i, m: corrupt_mix(i, m, MASK, V, mask_prob=0.6, uniform_prob=0.5,
                                  generator=gen(0)), "mask_prob \\+ uniform_prob"),
        (lambda i, m: corrupt_mix(i, m, MASK, V, mask_prob=torch.ones(3), uniform_prob=0.0,
                                  generator=gen(0)), "mask_prob"),
        (lambda i, m: corrupt_scdd(i, m, MASK, V, num_timesteps=1, generator=gen(0)),
         "num_timesteps"),
        (lambda i, m: corrupt_scdd(i, m, MASK, V, max_ratio=1.0, generator=gen(0)),
         "max_ratio"),
        (lambda i, m: corrupt_blockwise(i, m, MASK, block_size=0, generator=gen(0)),
         "block_size"),
        (lambda i, m: corrupt_blockwise(i, m, MASK, half_life_ratio=0, generator=gen(0)),
         "half_life_ratio"),
        (lambda i, m: corrupt_blockwise(i, m, MASK, eps=0.2, t_max=0.1, generator=gen(0)),
         r"t_max must be a number in \(eps, 1\] = \(0.2, 1\], got 0.1"),
        (lambda i, m: corrupt_blockwise(i, m, MASK, stratum=torch.zeros(6), generator=gen(0)),
         r"stratum must have the shape of input_ids \(6, 13\), got \(6,\)"),
        (lambda i, m: corrupt_uniform_random(i, m, 1, generator=gen(0)), "vocab_size"),
        (lambda i, m: corrupt_all_masked(i, m, -1), "mask_token_id"),
    ],
)
def test_bad_input_raises_naming_the_argument(call, match):
    ids, lm = batch()
    with pytest.raises((ValueError, TypeError), match=match):
        call(ids, lm)
