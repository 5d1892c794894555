"""The estimators against exact expectations enumerated on a tiny vocabulary and length: the
denoiser is the exact conditional of a known joint (tests/rl/_joint.py), so the masked and
block ELBOs must average to log p exactly, and the one-step estimate to its mean-field closed
form (which is not log p)."""

from __future__ import annotations

import math
from itertools import product

import pytest
import torch

from dlmkit.rl.estimators import Estimator, Noise

from ._joint import MASK, JointModel, V, conditional, log_prob, random_joint, subsets

PROMPT, CONT = [1], [2, 0, 1]
SEQ = PROMPT + CONT
P, N = len(PROMPT), len(CONT)


def estimator(likelihood, kind, **kw):
    return Estimator(likelihood, kind, mask_id=MASK, vocab_size=V + 1, family="test", **kw)


def expectation(est, model, outcomes) -> float:
    """sum over noise outcomes ``(probability, Noise)`` of the estimate."""
    total = 0.0
    for prob, noise in outcomes:
        total += prob * float(est.score(model, [(PROMPT, CONT)], [noise])[0].detach())
    return total


def masked_outcomes(spans):
    """Every masking of the completion: per span ``[lo, hi)`` of ``n_b`` tokens, ``l_b ~
    U{1..n_b}`` then a uniform ``l_b``-subset; weight ``n_b / l_b`` on the masked tokens."""
    per_span = []
    for lo, hi in spans:
        size = hi - lo
        choices = []
        for bits in subsets(size):
            count = sum(bits)
            choices.append((1 / size / math.comb(size, count), lo, bits, size / count))
        per_span.append(choices)
    for combo in product(*per_span):
        masked = torch.zeros(1, N, dtype=torch.bool)
        weight = torch.zeros(1, N, dtype=torch.float64)
        prob = 1.0
        for p, lo, bits, w in combo:
            prob *= p
            for j, bit in enumerate(bits):
                masked[0, lo + j] = bit
                weight[0, lo + j] = w if bit else 0.0
        yield prob, Noise(masked, weight, torch.zeros(1, P, dtype=torch.bool))


@pytest.mark.parametrize("shift", [False, True])
def test_masked_elbo_expectation_is_log_p_for_exact_conditionals(shift):
    joint = random_joint(len(SEQ))
    model = JointModel(joint, "masked", shift=shift)
    est = estimator("masked_elbo", "elbo", logit_shift=shift)
    exact = log_prob(joint, SEQ, P)
    assert expectation(est, model, masked_outcomes([(0, N)])) == pytest.approx(exact, abs=1e-5)


def test_masked_elbo_draws_average_to_the_expectation():
    joint = random_joint(len(SEQ))
    model = JointModel(joint, "masked")
    est = estimator("masked_elbo", "elbo", samples=3000)
    noise = est.draw(P, N, torch.Generator().manual_seed(0))
    # every draw is an outcome of the enumerated distribution, with its weight n / l
    count = noise.masked.sum(1)
    assert bool((count >= 1).all())
    expected_weight = (N / count.double()).unsqueeze(1) * noise.masked
    assert torch.equal(noise.weight, expected_weight)
    assert torch.bincount(count, minlength=N + 1)[1:].double().div(3000).sub(1 / N).abs().max() \
        < 0.03  # l uniform on 1..n
    mc = float(est.score(model, [(PROMPT, CONT)], [noise])[0].detach())
    assert mc == pytest.approx(log_prob(joint, SEQ, P), abs=0.1)


@pytest.mark.parametrize("shift", [False, True])
def test_block_elbo_expectation_is_log_p_for_exact_conditionals(shift):
    joint = random_joint(len(SEQ), seed=1)
    model = JointModel(joint, "block", block_size=2, shift=shift)
    est = estimator("block_elbo", "elbo", block_size=2, logit_shift=shift)
    # blocks from position 0: [x0 x1 | x2 x3]: completion spans [0, 1) and [1, 3)
    assert est._blocks(P, N) == [(0, 1), (1, 3)]
    exact = log_prob(joint, SEQ, P)
    got = expectation(est, model, masked_outcomes(est._blocks(P, N)))
    assert got == pytest.approx(exact, abs=1e-5)


def test_causal_score_is_exact_log_p():
    joint = random_joint(len(SEQ), seed=2)
    model = JointModel(joint, "causal")
    est = estimator("causal", "elbo")
    noise = est.draw(P, N, torch.Generator().manual_seed(0))
    got = float(est.score(model, [(PROMPT, CONT)], [noise])[0].detach())
    assert got == pytest.approx(log_prob(joint, SEQ, P), abs=1e-5)


def mean_field(joint, q: float) -> float:
    """E over prompt masks M (each token masked w.p. q) of sum_i log p(x_i | unmasked prompt)."""
    total = 0.0
    for bits in product([False, True], repeat=P):
        prob = math.prod(q if b else 1 - q for b in bits)
        seen = {j: SEQ[j] for j in range(P) if not bits[j]}
        total += prob * sum(float(torch.log(conditional(joint, i, seen)[SEQ[i]]))
                            for i in range(P, P + N))
    return total


def test_one_step_expectation_is_the_mean_field_score_not_log_p():
    joint = random_joint(len(SEQ), seed=3)
    q = 0.3
    model = JointModel(joint, "masked")
    est = estimator("masked_elbo", "one_step", prompt_mask_prob=q)
    outcomes = []
    for bits in product([False, True], repeat=P):
        prob = math.prod(q if b else 1 - q for b in bits)
        outcomes.append((prob, Noise(torch.ones(1, N, dtype=torch.bool),
                                     torch.ones(1, N, dtype=torch.float64),
                                     torch.tensor([bits]))))
    got = expectation(est, model, outcomes)
    assert got == pytest.approx(mean_field(joint, q), abs=1e-5)
    assert abs(got - log_prob(joint, SEQ, P)) > 0.05  # biased for log p on correlated tokens
    # draws mask each prompt token with probability q
    draws = Estimator("masked_elbo", "one_step", mask_id=MASK, vocab_size=V + 1, samples=4000,
                      prompt_mask_prob=q).draw(P, N, torch.Generator().manual_seed(1))
    assert float(draws.prompt_masked.double().mean()) == pytest.approx(q, abs=0.03)
    assert bool(draws.masked.all())


def test_shared_noise_gives_ratio_one_and_scores_batch_independently():
    joint = random_joint(len(SEQ), seed=4)
    model = JointModel(joint, "masked")
    est = estimator("masked_elbo", "elbo", samples=2)
    items = [(PROMPT, CONT), ([0], [1, 1]), (PROMPT, [0, 2, 2])]
    noises = [est.draw(len(p), len(c), torch.Generator().manual_seed(i))
              for i, (p, c) in enumerate(items)]
    together = est.score(model, items, noises)
    alone = torch.cat([est.score(model, [it], [nz]) for it, nz in zip(items, noises)])
    assert torch.equal(together, alone)
    again = est.score(model, items, noises)
    assert torch.equal(torch.exp(together - again), torch.ones(3, dtype=torch.float64))


def test_unsupported_families_and_estimators_are_named():
    with pytest.raises(ValueError, match="family 'dflash' has no sequence log-likelihood"):
        Estimator(None, "elbo", mask_id=MASK, vocab_size=V + 1, family="dflash")
    with pytest.raises(ValueError, match="'one_step' is for masked-diffusion families"):
        Estimator("causal", "one_step", mask_id=MASK, vocab_size=V + 1, family="hybrid")
    with pytest.raises(ValueError, match="block_size must be the trained block"):
        Estimator("block_elbo", "elbo", mask_id=MASK, vocab_size=V + 1, family="bd3lm")


@pytest.mark.parametrize("likelihood,block", [("masked_elbo", None), ("block_elbo", 2)])
def test_extra_forwards_leave_the_score_and_its_gradient_unchanged(likelihood, block):
    """``score(..., forwards=n)`` (FSDP2: every rank makes as many forwards as the rank with
    the most) makes exactly ``n`` forwards, with the value and gradient of the plain score."""
    from tests.generate.helpers import TOK, tiny_model

    est = Estimator(likelihood, "elbo", mask_id=TOK.mask_token_id, vocab_size=TOK.vocab_size,
                    block_size=block)
    items = [([5, 6, 7], [8, 9]), ([5, 6, 7], [10, 11, 12, 13]), ([5, 6], [8, 9])]
    noises = [est.draw(len(p), len(c), torch.Generator().manual_seed(i))
              for i, (p, c) in enumerate(items)]
    assert est.forwards(items, noises) == 3  # three row lengths (prompt + completion)
    model = tiny_model()
    calls = []
    model.register_forward_pre_hook(lambda *_: calls.append(1))
    results = []
    for forwards in (0, 5):
        calls.clear()
        model.zero_grad()
        total = est.score(model, items, noises, forwards)
        total.sum().backward()
        results.append((total.detach(), [p.grad.clone() for p in model.parameters()]))
        assert len(calls) == max(3, forwards)
    (plain, plain_grads), (padded, padded_grads) = results
    assert torch.equal(plain, padded)
    assert all(torch.equal(a, b) for a, b in zip(plain_grads, padded_grads))


@pytest.mark.parametrize("scorer,block,shift,prompt", [
    ("masked_elbo", None, False, [5, 6]), ("masked_elbo", None, True, [5, 6]),
    ("masked_elbo_nonmask", None, False, [5, 6]),
    ("block_elbo", 2, False, [5, 6, 7]), ("block_elbo", 2, True, [5, 6, 7]),
    ("block_elbo", 3, True, [5, 6])])
def test_the_rl_estimator_and_the_likelihood_scorer_estimate_the_same_elbo(scorer, block,
                                                                            shift, prompt):
    """Two implementations of each layout: rl's differentiable estimator (its noise given) and
    dlmkit.decoding.likelihood's scorer (its noise drawn inside). On a real tiny model the
    estimator's exact expectation (every masking enumerated, with its probability) and
    variance bound the scorer's Monte-Carlo mean: a layout that read another row, another
    stream or another weight in one of them would differ by far more than 5 standard errors."""
    from dlmkit.decoding.likelihood import elbo
    from dlmkit.decoding.runner import Runner
    from tests.generate.helpers import TOK, tiny_model

    cont = [8, 9, 10]
    n, p = len(cont), len(prompt)
    est = Estimator(scorer, "elbo", mask_id=TOK.mask_token_id, vocab_size=TOK.vocab_size,
                    block_size=block, logit_shift=shift)
    model = tiny_model(1)
    values, probs = [], []
    spans = est._blocks(p, n)
    per_span = [[(1 / (hi - lo) / math.comb(hi - lo, sum(bits)), lo, bits,
                  (hi - lo) / sum(bits)) for bits in subsets(hi - lo)] for lo, hi in spans]
    with torch.no_grad():
        for combo in product(*per_span):
            masked = torch.zeros(1, n, dtype=torch.bool)
            weight = torch.zeros(1, n, dtype=torch.float64)
            for _, lo, bits, w in combo:
                for j, bit in enumerate(bits):
                    masked[0, lo + j], weight[0, lo + j] = bit, (w if bit else 0.0)
            noise = Noise(masked, weight, torch.zeros(1, p, dtype=torch.bool))
            values.append(float(est.score(model, [(prompt, cont)], [noise])[0]))
            probs.append(math.prod(c[0] for c in combo))
        assert sum(probs) == pytest.approx(1.0)
        mean = sum(q * v for q, v in zip(probs, values))
        var = sum(q * (v - mean) ** 2 for q, v in zip(probs, values))
        samples = 3000
        got = elbo(scorer, Runner(model, vocab_size=TOK.vocab_size), prompt, cont,
                   mask_id=TOK.mask_token_id, samples=samples,
                   generator=torch.Generator().manual_seed(0), block_size=block,
                   logit_shift=shift, batch_size=256)
    assert var > 0  # the maskings differ: the comparison has something to tell apart
    assert abs(got - mean) <= 5 * math.sqrt(var / samples) + 1e-9, (got, mean, var)
