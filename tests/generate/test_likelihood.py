"""The Monte-Carlo ELBO scorers against exact enumeration.

The models here read their input (which continuation tokens are visible, and the token to the
left), so the masking-count distribution and the ``L / l`` weights change the expectation: an
estimator that masked the whole continuation with weight 1 has a different mean, and the
tests tell it apart. Every masking pattern of a short continuation is enumerated with its exact
probability; the estimate must be the mean of its draws' exact terms, draw the patterns with
those probabilities, and lie within a few standard errors (from the exact variance) of the
enumerated bound.
"""

from __future__ import annotations

import itertools
import math

import pytest
import torch

from dlmkit import families
from dlmkit.decoding.likelihood import block_elbo, elbo, masked_elbo
from dlmkit.decoding.runner import Runner
from dlmkit.diffusion import SCDDLoss, corrupt_scdd

from .helpers import MASK, Rigged, V

PROMPT, CONT = [1, 2, 3], [7, 8, 9, 10]
SAMPLES = 4000


def _read(logits, pos, visible, left):
    """Add the input-dependent parts in place: position ``p``'s token ``p + 4`` (the clean
    continuation's) gains with the number of ``visible`` continuation tokens it sees, and a
    visible ``left`` neighbour pushes the token ``3 * left mod 50``; the MASK logit grows with
    the hidden count (only scorers that normalise over MASK see it)."""
    logits.scatter_add_(-1, (pos + 4).unsqueeze(-1), 1.0 + 0.7 * visible.unsqueeze(-1).float())
    shown = left != MASK
    push = torch.where(shown, 1.5, 0.0).unsqueeze(-1)
    logits.scatter_add_(-1, ((3 * left) % 50).unsqueeze(-1), push)
    logits[..., MASK] += 0.4 * (4 - visible.float())


def reading(ids, pos):
    """A one-stream denoiser over ``[prompt | continuation]`` that reads its input."""
    logits = torch.zeros(*ids.shape, V)
    cont = ids[:, len(PROMPT):]
    visible = (cont != MASK).sum(1, keepdim=True).expand_as(ids)
    left = torch.cat([torch.zeros_like(ids[:, :1]), ids[:, :-1]], 1)
    _read(logits, pos, visible, left)
    return logits


def pattern_term(logits_fn, masked, *, exclude_mask=False):
    """``(L / l) * sum over the masked tokens of log p(x_i | x_t)`` for one pattern (float64),
    by the model's definition, independently of the estimator."""
    seq = torch.tensor(PROMPT + CONT)
    x = seq.clone()
    p = len(PROMPT)
    x[p:][torch.tensor(masked)] = MASK
    logits = logits_fn(x.unsqueeze(0), torch.arange(len(seq)).unsqueeze(0))[0].double()
    if exclude_mask:
        logits[:, MASK] = float("-inf")
    logp = torch.log_softmax(logits, -1)
    count = sum(masked)
    return len(CONT) / count * sum(float(logp[p + i, seq[p + i]])
                                   for i, m in enumerate(masked) if m)


def enumerate_masked(logits_fn, *, exclude_mask=False):
    """``{pattern: (probability, term)}`` over every non-empty masking pattern: ``l`` uniform
    on ``1..L``, then one of the ``C(L, l)`` subsets of that size uniformly."""
    n = len(CONT)
    table = {}
    for masked in itertools.product((False, True), repeat=n):
        count = sum(masked)
        if count:
            table[masked] = (1.0 / n / math.comb(n, count),
                             pattern_term(logits_fn, list(masked), exclude_mask=exclude_mask))
    return table


def moments(table):
    mean = sum(p * t for p, t in table.values())
    return mean, sum(p * (t - mean) ** 2 for p, t in table.values())


def check_against_enumeration(score, drawn, table):
    """The three exact checks of the module docstring; ``drawn``: the patterns, in order."""
    assert len(drawn) == SAMPLES
    # Every draw is scored with its pattern's exact term, and the score is their mean.
    assert score == pytest.approx(sum(table[d][1] for d in drawn) / SAMPLES, rel=1e-5)
    # Patterns come with their probabilities (binomial counts within 5 standard deviations).
    for pattern, (prob, _) in table.items():
        count = sum(d == pattern for d in drawn)
        assert abs(count - SAMPLES * prob) <= 5 * math.sqrt(SAMPLES * prob * (1 - prob)), \
            (pattern, count, SAMPLES * prob)
    mean, var = moments(table)
    error = math.sqrt(var / SAMPLES)
    assert abs(score - mean) < 5 * error
    # Masking everything with weight 1 has another mean: the checks above can fail.
    everything = table[max(table, key=sum)][1]
    assert abs(everything - mean) > 20 * error


def test_masked_elbo_equals_the_enumerated_bound_of_a_model_that_reads_its_input():
    model = Rigged(reading)
    score = masked_elbo(Runner(model), PROMPT, CONT, mask_id=MASK, samples=SAMPLES,
                        generator=torch.Generator().manual_seed(1), batch_size=1000)
    rows = torch.cat([ids for ids, _ in model.calls])
    assert rows.shape == (SAMPLES, 7) and (rows[:, :3] == torch.tensor(PROMPT)).all()
    masked = rows[:, 3:] == MASK
    assert ((rows[:, 3:] == torch.tensor(CONT)) | masked).all()
    drawn = [tuple(m) for m in masked.tolist()]
    check_against_enumeration(score, drawn, enumerate_masked(reading))
    with pytest.raises(ValueError, match="samples must be an int >= 1, got 0"):
        masked_elbo(Runner(model), PROMPT, CONT, mask_id=MASK, samples=0,
                    generator=torch.Generator())


def test_scdd_scores_over_the_tokens_its_loss_and_decoder_use():
    """scdd's loss and decoder exclude the MASK logit (the loss's gradient there is exactly 0),
    so its score must not move when that logit does; the score is the enumerated bound with
    log-probs over the non-mask tokens."""
    scorer = families.get("scdd").likelihood

    def bumped(ids, pos):
        logits = reading(ids, pos)
        logits[..., MASK] += 5.0
        return logits

    def score(fn, name=scorer):
        model = Rigged(fn)
        value = elbo(name, Runner(model), PROMPT, CONT, mask_id=MASK, samples=SAMPLES,
                     generator=torch.Generator().manual_seed(2), batch_size=1000)
        return value, [tuple(m) for m in (torch.cat([i for i, _ in model.calls])[:, 3:]
                                          == MASK).tolist()]

    plain, drawn = score(reading)
    assert score(bumped)[0] == pytest.approx(plain, abs=1e-9)
    check_against_enumeration(plain, drawn, enumerate_masked(reading, exclude_mask=True))
    # Over the whole vocabulary (mdlm's scorer) the same bump moves the score: the check above
    # can fail.
    assert abs(score(bumped, "masked_elbo")[0] - score(reading, "masked_elbo")[0]) > 1.0

    # The loss does not move either (it never trains the MASK logit).
    seq = torch.tensor([PROMPT + CONT] * 8)
    loss_mask = torch.tensor([[0] * 3 + [1] * 4] * 8)
    noisy, _, t = corrupt_scdd(seq, loss_mask, MASK, V, num_timesteps=20,
                               generator=torch.Generator().manual_seed(3))
    pos = torch.arange(7).expand(8, -1)
    loss = SCDDLoss(MASK, num_timesteps=20, vocab_size=V)
    kw = {"target_ids": seq, "noisy_ids": noisy, "p_mask": t, "loss_mask": loss_mask}
    before = loss(logits=reading(noisy, pos), **kw).total
    after = loss(logits=bumped(noisy, pos), **kw).total
    assert float(after) == pytest.approx(float(before), rel=1e-6)


# ---- block_elbo ------------------------------------------------------------------------------

BLOCK_CONT = [7, 8, 9, 10, 11]  # blocks of 4: [1 2 3 7] [8 9 10 11]
BS = 4


def block_reading(ids, pos):
    """A block-diffusion denoiser over ``[x_t | x_0]`` reading only what the block-diffusion
    mask lets a noisy position see: its own block of ``x_t`` and the clean earlier blocks. The
    clean half's outputs are never scored (zeros)."""
    width = ids.shape[1] // 2
    noisy, clean = ids[:, :width], ids[:, width:]
    block = torch.arange(width) // BS
    same = block[:, None] == block[None, :]  # [S, S]: key in the query's block
    cont = torch.arange(width) >= len(PROMPT)
    visible = ((noisy[:, None, :] != MASK) & same & cont).sum(-1)  # [B, S]
    first = torch.arange(width) % BS == 0
    before = torch.cat([torch.zeros_like(ids[:, :1]), noisy[:, :-1]], 1)
    clean_before = torch.cat([torch.zeros_like(ids[:, :1]), clean[:, :-1]], 1)
    left = torch.where(first, clean_before, before)
    logits = torch.zeros(ids.shape[0], width, V)
    _read(logits, pos[:, :width], visible, left)
    return torch.cat([logits, torch.zeros_like(logits)], 1)


def enumerate_blocks():
    """``{pattern: (probability, term)}``: per block with ``n_b`` continuation tokens,
    ``l_b`` uniform on ``1..n_b`` and a uniform subset of that size, independently;
    term ``sum_b (n_b / l_b) * sum over its masked tokens of log p``."""
    p, n = len(PROMPT), len(BLOCK_CONT)
    seq = torch.tensor(PROMPT + BLOCK_CONT)
    blocks = [[i for i in range(n) if (p + i) // BS == b] for b in sorted({(p + i) // BS
                                                                          for i in range(n)})]
    table = {}
    for masked in itertools.product((False, True), repeat=n):
        counts = [sum(masked[i] for i in members) for members in blocks]
        if 0 in counts:
            continue
        prob = math.prod(1.0 / len(m) / math.comb(len(m), c) for m, c in zip(blocks, counts))
        x = seq.clone()
        x[p:][torch.tensor(masked)] = MASK
        logits = block_reading(torch.cat([x, seq]).unsqueeze(0),
                               torch.arange(p + n).repeat(2).unsqueeze(0))[0, :p + n]
        logp = torch.log_softmax(logits.double(), -1)
        term = sum(len(m) / c * sum(float(logp[p + i, seq[p + i]]) for i in m if masked[i])
                   for m, c in zip(blocks, counts))
        table[masked] = (prob, term)
    return table


def test_block_elbo_equals_the_enumerated_bound_of_a_model_that_reads_its_input():
    model = Rigged(block_reading)
    score = block_elbo(Runner(model), PROMPT, BLOCK_CONT, mask_id=MASK, block_size=BS,
                       samples=SAMPLES, generator=torch.Generator().manual_seed(1),
                       batch_size=1000)
    ids = torch.cat([i for i, _ in model.calls])
    assert ids.shape == (SAMPLES, 16) and (ids[:, 8:] == torch.tensor(PROMPT + BLOCK_CONT)).all()
    assert (model.calls[0][1][0] == torch.arange(8).repeat(2)).all()  # [x_t | x_0] at [p | p]
    noisy = ids[:, :8]
    assert (noisy[:, :3] == torch.tensor(PROMPT)).all()
    masked = noisy[:, 3:] == MASK
    assert ((noisy[:, 3:] == torch.tensor(BLOCK_CONT)) | masked).all()
    check_against_enumeration(score, [tuple(m) for m in masked.tolist()], enumerate_blocks())
    with pytest.raises(ValueError, match="block_size must be an int >= 1"):
        block_elbo(Runner(model), PROMPT, BLOCK_CONT, mask_id=MASK, block_size=None,
                   samples=1, generator=torch.Generator())


def test_elbo_dispatch_names_the_scorers_and_block_size():
    runner = Runner(Rigged(reading))
    g = torch.Generator()
    with pytest.raises(ValueError, match=r"scorer must be one of \('masked_elbo', "
                                         r"'masked_elbo_nonmask', 'block_elbo'\).*'causal'"):
        elbo("causal", runner, PROMPT, CONT, mask_id=MASK, samples=1, generator=g)
    with pytest.raises(ValueError, match="scorer must be one of"):
        elbo("mdlm", runner, PROMPT, CONT, mask_id=MASK, samples=1, generator=g, block_size=4)
    with pytest.raises(ValueError, match="block_size is block_elbo's option; scorer "
                                         "'masked_elbo' takes none, got block_size=4"):
        elbo("masked_elbo", runner, PROMPT, CONT, mask_id=MASK, samples=1, generator=g,
             block_size=4)
    with pytest.raises(TypeError, match="exclude_mask must be True or False, got 1"):
        masked_elbo(runner, PROMPT, CONT, mask_id=MASK, samples=1, generator=g, exclude_mask=1)
