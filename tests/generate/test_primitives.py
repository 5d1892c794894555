import pytest
import torch

from dlmkit.decoding.commit import split_steps
from dlmkit.decoding.primitives import (
    confidence,
    sample_tokens,
    scheduled_count,
    select_transfers,
)


@pytest.mark.parametrize("masks,steps", [(10, 4), (7, 7), (3, 5), (32, 8), (1, 1)])
def test_schedule_reproduces_llada_linear_split(masks, steps):
    remaining, counts = torch.tensor([masks]), []
    for left in range(steps, 0, -1):
        k = scheduled_count(remaining, left)
        counts.append(int(k))
        remaining = remaining - k
    assert counts == [masks // steps + (i < masks % steps) for i in range(steps)]
    assert int(remaining) == 0


def test_split_steps():
    assert split_steps(10, 4) == [3, 3, 2, 2] and sum(split_steps(7, 7)) == 7


def test_select_topk_and_threshold():
    scores = torch.tensor([[0.1, 0.9, 0.5, 0.95, 0.2]])
    cand = torch.tensor([[True, True, True, False, True]])
    top1 = select_transfers(scores, cand, torch.tensor([1]))
    assert top1.tolist() == [[False, True, False, False, False]]
    # threshold above every score still commits one; never a non-candidate
    one = select_transfers(scores, cand, torch.tensor([0]), threshold=0.99)
    assert one.sum() == 1 and bool(one[0, 1])
    many = select_transfers(scores, cand, torch.tensor([1]), threshold=0.4)
    assert many.tolist() == [[False, True, True, False, False]]
    # the schedule's count is a floor even with a threshold
    floor = select_transfers(scores, cand, torch.tensor([3]), threshold=0.99)
    assert floor.sum() == 3 and not bool(floor[0, 3])
    none = select_transfers(scores, torch.zeros_like(cand), torch.tensor([2]), threshold=0.5)
    assert not none.any()


def test_factor_rule_and_at_least_one_per_step():
    # Fast-dLLM's factor rule: the longest run of ranks r with (r + 1)(1 - c_r) < factor.
    scores = torch.tensor([[0.97, 0.5, 0.9, 0.85, 0.99, 0.3]])
    cand = torch.ones_like(scores, dtype=torch.bool)
    # sorted: .99 (2*.01=.02) .97 (3*.03=.09) .9 (4*.1=.4) .85 (5*.15=.75) .5 (6*.5=3) .3
    for factor, n in [(0.01, 1), (0.05, 1), (0.1, 2), (0.5, 3), (1.0, 4), (3.5, 5), (10, 6)]:
        got = select_transfers(scores, cand, torch.tensor([1]), factor=factor)
        best = scores[0].argsort(descending=True)[:n]
        assert got.sum() == n and bool(got[0, best].all()), factor
    # a run stops at the first rank that fails, and never counts non-candidates
    holes = torch.tensor([[True, False, True, True, True, False]])
    got = select_transfers(scores, holes, torch.tensor([1]), factor=0.5)
    assert got.tolist() == [[True, False, True, False, True, False]]
    # the schedule is a floor; a count of 0 still commits one (no rule can stall a step)
    assert select_transfers(scores, cand, torch.tensor([4]), factor=0.01).sum() == 4
    assert select_transfers(scores, cand, torch.tensor([0])).sum() == 1
    assert select_transfers(scores, cand, torch.tensor([0]), factor=0.01).sum() == 1


def test_commit_rule_options_are_checked():
    from dlmkit.generate import sampler_config

    ok = sampler_config("bd3lm", block_size=4, factor=1.0, cache="prefix")
    assert ok.factor == 1.0 and ok.cache == "prefix"
    for options, message in [
        (dict(threshold=0.0), r"threshold must be a number in \(0, 1\], got 0.0"),
        (dict(threshold=1.01), r"threshold must be a number in \(0, 1\]"),
        (dict(factor=-1.0), "factor must be a finite number > 0"),
        (dict(factor=float("inf")), "factor must be a finite number > 0"),
        (dict(factor=1.0, remasking="random"), "factor needs a model confidence"),
        (dict(cache="dual"), r"cache must be one of \('none', 'prefix'\) for the bd3lm"),
        (dict(cache="exact"), r"cache must be one of"),
    ]:
        with pytest.raises(ValueError, match=message):
            sampler_config("bd3lm", block_size=4, **options)
    with pytest.raises(ValueError, match=r"cache must be one of \('none', 'prefix', 'dual'\)"):
        sampler_config("mdlm", cache="full")
    with pytest.raises(ValueError, match=r"does not use option\(s\) \['cache'\]"):
        sampler_config("scdd", cache="prefix")
    with pytest.raises(ValueError, match=r"revise must be True or False, got 'yes'"):
        sampler_config("scdd", revise="yes")
    with pytest.raises(ValueError, match=r"does not use option\(s\) \['revise'\]"):
        sampler_config("mdlm", revise=True)
    with pytest.raises(ValueError, match=r"must divide max_new_tokens=12 .*\[1, 2, 3, 4, 6, 12\]"):
        sampler_config("mdlm", max_new_tokens=12, block_size=5)


def test_confidence_in_unit_interval_and_gumbel_seeded():
    logits = torch.randn(3, 5, 11)
    tokens = logits.argmax(-1)
    for rule in ("low_confidence", "margin", "entropy", "random"):
        c = confidence(logits, tokens, rule, torch.Generator().manual_seed(0))
        assert c.shape == tokens.shape and bool(((c >= 0) & (c <= 1)).all())
    one_hot = torch.full((1, 1, 4), -1e9)
    one_hot[..., 2] = 0
    assert confidence(one_hot, torch.tensor([[2]]), "entropy", None).item() == pytest.approx(1)
    a = sample_tokens(logits, 1.0, torch.Generator().manual_seed(3))
    b = sample_tokens(logits, 1.0, torch.Generator().manual_seed(3))
    assert torch.equal(a, b)
    assert torch.equal(sample_tokens(logits, 0.0, None), tokens)
    # Gumbel-max samples follow softmax(logits / T)
    probs = torch.softmax(torch.tensor([0.0, 1.0, 2.0]), -1)
    draws = sample_tokens(torch.tensor([0.0, 1.0, 2.0]).expand(20000, 3), 1.0,
                          torch.Generator().manual_seed(0))
    freq = torch.bincount(draws, minlength=3).float() / 20000
    assert torch.allclose(freq, probs, atol=0.02)


def test_entropy_confidence_is_finite_when_the_mask_logit_is_excluded():
    from dlmkit.decoding.commit import propose
    from dlmkit.generate import sampler_config

    cfg = sampler_config("mdlm", max_new_tokens=4, remasking="entropy")
    _, scores = propose(torch.randn(1, 4, 10), cfg, 3, torch.Generator())
    assert bool(torch.isfinite(scores).all()) and bool(((scores > 0) & (scores <= 1)).all())
    # A confident proposal (all mass on one token once MASK is excluded) scores ~1, so a
    # threshold fires on it instead of NaN scores committing left to right, one per step.
    sure = torch.zeros(1, 4, 10)  # rows 1 and 3: uniform over the 9 non-mask tokens
    sure[..., 3] = 50.0  # the MASK logit, excluded by propose
    sure[0, ::2, 5] = 40.0
    _, scores = propose(sure, cfg, 3, torch.Generator())
    chosen = select_transfers(scores, torch.ones(1, 4, dtype=torch.bool), torch.tensor([1]),
                              threshold=0.9)
    assert chosen.tolist() == [[True, False, True, False]]
