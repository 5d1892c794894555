"""Log-likelihood of a continuation given a prompt, by what a family's export can answer.

A strategy's ``likelihood`` attribute names the scorer (:data:`SCORERS`):

* ``causal`` -- exact: the clean causal stream (``ar``, and the clean stream that ``hybrid``
  and ``idlm`` train with a shifted CE) predicts token ``i + 1`` at ``i``; the log-likelihood
  is the sum of the continuation tokens' log-probabilities, and the continuation is greedy
  when each is its position's argmax.
* ``masked_elbo`` -- a Monte-Carlo estimate of the masked-diffusion evidence lower bound
  (MDLM / LLaDA, one bidirectional stream over ``x_t``, unshifted logits). For a continuation
  of ``L`` tokens after a clean prompt, each sample draws ``l ~ U{1..L}``, masks ``l`` of the
  continuation tokens uniformly at random and scores ``(L / l) * sum over the masked tokens of
  log p(x_i | x_t)``; its expectation is the ELBO (``<= log p``), the mean over ``samples``
  draws is the estimate (LLaDA's low-variance form of the ``1/t``-weighted bound). Log-probs
  are over the whole vocabulary, as in mdlm's training loss.
* ``masked_elbo_nonmask`` -- the same estimate with log-probs over the tokens other than MASK
  (the MASK logit excluded), for a family whose denoiser is a distribution over those tokens
  only: scdd's loss (:class:`~dlmkit.diffusion.SCDDLoss`) excludes the MASK logit from its
  softmax and never trains it, and its decoder never proposes MASK, so a score that
  normalised over MASK would move with a logit the model never learned.
* ``block_elbo`` -- the same estimate per diffusion block (BD3-LM): the sequence is cut into
  blocks of ``block_size`` from position 0 as in training; in each block holding continuation
  tokens, ``l_b ~ U{1..n_b}`` of its ``n_b`` continuation tokens are masked and scored with
  weight ``n_b / l_b`` given the clean earlier blocks (``[x_t | x_0]`` under the
  block-diffusion mask, all blocks in one forward, like a training step); the bound is the sum
  over blocks.

``logit_shift`` (the ELBO scorers; a model trained with ``strategy.logit_shift``): each token's
log-prob is read from the output at the position before it, as in training (``block_elbo``: a
block's first token from the clean stream's last position of the block before); the prompt
must then hold at least one token.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from .runner import Runner, left_pad, positions


def causal_loglikelihood(runner: Runner, rows: Sequence[tuple[Sequence[int], Sequence[int]]],
                         *, pad_id: int) -> list[tuple[float, bool]]:
    """``[(log p(continuation | prompt), is_greedy)]`` for ``rows`` of ``(prompt ids,
    continuation ids)`` (a non-empty prompt each), in one left-padded batch."""
    from dlmkit.masks.causal import padded_causal

    ids, valid = left_pad([list(p) + list(c) for p, c in rows], pad_id, runner.device)
    logits = runner(ids, padded_causal(ids.shape[1], valid, device=ids.device), positions(valid))
    logp = torch.log_softmax(logits[:, :-1], -1)  # position i predicts i + 1
    out = []
    for row, (_, cont) in enumerate(rows):
        n = len(cont)
        target = ids[row, -n:]
        scores = logp[row, -n:]
        picked = scores.gather(1, target.unsqueeze(1)).squeeze(1)
        out.append((float(picked.double().sum()), bool((scores.argmax(-1) == target).all())))
    return out


LAYOUTS = ("causal", "masked", "block")


def score_rows(layout: str, p: int, n: int, *, block_size: int | None = None,
               shift: int = 0, device=None) -> torch.Tensor:
    """``[n]``: the row of the model's output that predicts each continuation token (columns
    ``p .. p + n - 1`` of a prompt of ``p`` tokens) in ``layout``:

    * ``causal``: the position before it;
    * ``masked`` (one stream over ``x_t``): itself, or with ``shift`` the position before it;
    * ``block`` (``[x_t | x_0]``, ``2 (p + n)`` rows): itself in the noisy stream, or with
      ``shift`` the noisy row before it, and for a block's first token the clean stream's row
      before it (the block before it is clean context there).

    The one definition the scorers here and the rl estimator (:mod:`dlmkit.rl.estimators`)
    read their log-probs by."""
    columns = torch.arange(p, p + n, device=device)
    if layout == "causal":
        return columns - 1
    if layout == "masked" or not shift:
        return columns - shift
    if layout != "block":
        raise ValueError(f"layout must be one of {LAYOUTS}, got {layout!r}")
    return torch.where(columns % block_size == 0, p + n + columns - 1, columns - 1)


def layout_attention(layout: str, length: int, *, block_size: int | None = None,
                     device=None):
    """``(mask, positions [L'])`` of one unpadded row of ``layout`` for a sequence of
    ``length`` tokens (``block``: the row is ``[x_t | x_0]``, ``2 * length`` tokens, both
    halves at positions ``0 .. length - 1``)."""
    positions = torch.arange(length, device=device)
    if layout == "causal":
        from dlmkit.masks.causal import padded_causal

        return padded_causal(length, None, device=device), positions
    if layout == "masked":
        from dlmkit.masks.bidirectional import bidirectional

        return bidirectional(length, None, device=device), positions
    if layout == "block":
        from dlmkit.masks import block_diffusion

        return block_diffusion(length, block_size, None, device=device), positions.repeat(2)
    raise ValueError(f"layout must be one of {LAYOUTS}, got {layout!r}")


def _check_shift(logit_shift, prompt: Sequence[int]) -> int:
    if not isinstance(logit_shift, bool):
        raise TypeError(f"logit_shift must be True or False, got {logit_shift!r}")
    if logit_shift and not len(prompt):
        raise ValueError("logit_shift: the model predicts each token from the one before it, so "
                         "the first continuation token needs a prompt of at least one token; "
                         "got an empty prompt")
    return int(logit_shift)


def masked_elbo(runner: Runner, prompt: Sequence[int], continuation: Sequence[int], *,
                mask_id: int, samples: int, generator: torch.Generator,
                batch_size: int = 32, exclude_mask: bool = False,
                logit_shift: bool = False) -> float:
    """The Monte-Carlo masked-diffusion ELBO of ``continuation`` after ``prompt`` (see the
    module docstring); ``samples`` draws, at most ``batch_size`` per forward.
    ``exclude_mask``: log-probs over the non-mask tokens (``masked_elbo_nonmask``)."""
    if isinstance(samples, bool) or not isinstance(samples, int) or samples < 1:
        raise ValueError(f"samples must be an int >= 1, got {samples!r}")
    if not isinstance(exclude_mask, bool):
        raise TypeError(f"exclude_mask must be True or False, got {exclude_mask!r}")
    shift = _check_shift(logit_shift, prompt)
    n, p = len(continuation), len(prompt)
    seq = torch.tensor(list(prompt) + list(continuation), device=runner.device)
    target = seq[p:]
    mask, pos = layout_attention("masked", p + n, device=runner.device)
    rows = score_rows("masked", p, n, shift=shift, device=runner.device)
    total = 0.0
    for at in range(0, samples, batch_size):
        count = min(batch_size, samples - at)
        drawn = torch.randint(1, n + 1, (count,), generator=generator, device=generator.device)
        order = torch.rand(count, n, generator=generator, device=generator.device).argsort(1)
        masked = (order < drawn.unsqueeze(1).to(order.device)).to(runner.device)
        x = seq.repeat(count, 1)
        x[:, p:] = torch.where(masked, mask_id, target)
        logits = runner(x, mask, pos.expand(count, -1))[:, rows]
        if exclude_mask:
            logits = logits.float().index_fill(-1, torch.tensor([mask_id], device=logits.device),
                                               float("-inf"))
        logp = torch.log_softmax(logits, -1).gather(2, target.expand(count, -1)
                                                          .unsqueeze(2)).squeeze(2)
        weight = n / drawn.to(runner.device).double()
        total += float(((logp.double() * masked).sum(1) * weight).sum())
    return total / samples


def block_elbo(runner: Runner, prompt: Sequence[int], continuation: Sequence[int], *,
               mask_id: int, block_size: int, samples: int, generator: torch.Generator,
               batch_size: int = 32, logit_shift: bool = False) -> float:
    """The Monte-Carlo block-diffusion ELBO of ``continuation`` after ``prompt`` (see the
    module docstring); ``samples`` draws, at most ``batch_size`` per forward."""
    if isinstance(samples, bool) or not isinstance(samples, int) or samples < 1:
        raise ValueError(f"samples must be an int >= 1, got {samples!r}")
    if isinstance(block_size, bool) or not isinstance(block_size, int) or block_size < 1:
        raise ValueError(f"block_size must be an int >= 1 (the trained block), got "
                         f"{block_size!r}")
    shift = _check_shift(logit_shift, prompt)
    n, p = len(continuation), len(prompt)
    seq = torch.tensor(list(prompt) + list(continuation), device=runner.device)
    target = seq[p:]
    block = (torch.arange(p, p + n, device=runner.device) // block_size)
    block = block - block[0]  # 0 .. number of blocks with continuation tokens - 1
    sizes = torch.bincount(block)  # n_b
    start = torch.cumsum(sizes, 0) - sizes
    layout, positions = layout_attention("block", p + n, block_size=block_size,
                                         device=runner.device)
    rows = score_rows("block", p, n, block_size=block_size, shift=shift, device=runner.device)
    total = 0.0
    for at in range(0, samples, batch_size):
        count = min(batch_size, samples - at)
        g = generator.device
        drawn = (torch.rand(count, len(sizes), generator=generator, device=g).to(runner.device)
                 * sizes).long() + 1  # l_b, uniform on 1..n_b
        keys = torch.rand(count, n, generator=generator, device=g).to(runner.device) + block
        rank = torch.empty(count, n, dtype=torch.long, device=runner.device)
        rank.scatter_(1, keys.argsort(1), torch.arange(n, device=runner.device).expand(count, -1))
        masked = (rank - start[block]) < drawn[:, block]  # the first l_b of each block's order
        noisy = seq.repeat(count, 1)
        noisy[:, p:] = torch.where(masked, mask_id, target)
        x = torch.cat([noisy, seq.repeat(count, 1)], 1)
        logits = runner(x, layout, positions.expand(count, -1))[:, rows]
        logp = torch.log_softmax(logits, -1).gather(2, target.expand(count, -1)
                                                   .unsqueeze(2)).squeeze(2)
        weight = (sizes / drawn.double())[:, block]  # n_b / l_b per position
        total += float((logp.double() * masked * weight).sum())
    return total / samples


def elbo(scorer: str, runner: Runner, prompt: Sequence[int], continuation: Sequence[int], *,
         mask_id: int, samples: int, generator: torch.Generator, batch_size: int = 32,
         block_size: int | None = None, logit_shift: bool = False) -> float:
    """The Monte-Carlo ELBO of ``continuation`` after ``prompt`` by the scorer a family names
    (one of :data:`SCORERS` but ``causal``); ``block_size`` is ``block_elbo``'s trained block
    (no other scorer takes one); ``logit_shift``: the model was trained with
    ``strategy.logit_shift``."""
    if scorer not in ELBO_SCORERS:
        raise ValueError(f"scorer must be one of {ELBO_SCORERS} (the Monte-Carlo ELBOs), got "
                         f"{scorer!r}")
    kwargs = {"mask_id": mask_id, "samples": samples, "generator": generator,
              "batch_size": batch_size, "logit_shift": logit_shift}
    if scorer == "block_elbo":
        return block_elbo(runner, prompt, continuation, block_size=block_size, **kwargs)
    if block_size is not None:
        raise ValueError(f"block_size is block_elbo's option; scorer {scorer!r} takes none, "
                         f"got block_size={block_size!r}")
    return masked_elbo(runner, prompt, continuation,
                       exclude_mask=scorer == "masked_elbo_nonmask", **kwargs)


ELBO_SCORERS = ("masked_elbo", "masked_elbo_nonmask", "block_elbo")
SCORERS = ("causal", *ELBO_SCORERS)
