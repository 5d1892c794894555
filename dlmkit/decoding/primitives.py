"""Sampling primitives shared by the diffusion samplers.

* :func:`sample_tokens` — temperature sampling as Gumbel-max in float64 (``argmax(logits / T +
  Gumbel)``; ``T = 0`` is argmax). float64 because in float32 the Gumbel tail is truncated
  (``-log(-log u)`` saturates near ``u = 1``), which biases low-temperature sampling.
* :func:`confidence` — how sure the model is of its proposal at each position, in ``[0, 1]``
  for every remasking rule, so a single ``threshold`` means the same kind of thing for all.
* :func:`scheduled_count` — LLaDA's linear schedule (``M`` masks over ``n`` steps: ``M // n``
  per step, one extra in the first ``M % n`` steps), computed from what is left.
* :func:`select_transfers` — which masked positions to commit this step: the ``k`` most
  confident (top-k, the fixed budget), and with a threshold or a factor rule every position
  the rule accepts, *at least* ``k`` and at least one (so a parallel rule can only speed a
  block up and never leaves masks behind when its steps run out).

All randomness comes from the ``generator`` passed in — one ``torch.Generator``, or one per
row (:mod:`dlmkit.diffusion.rng`: row ``b`` draws only from ``generator[b]``, which is what
makes a prompt's sample independent of its batch); nothing touches the global RNG.
"""

from __future__ import annotations

import torch

from dlmkit.diffusion import rng
from dlmkit.diffusion.rng import Generators

REMASKING = ("low_confidence", "random", "margin", "entropy")


def gumbel(shape, generator: Generators, device) -> torch.Tensor:
    """float64 standard Gumbel noise ``-log(-log U)``, ``U`` in the open interval (0, 1);
    with a list of per-row generators, row ``b`` of ``shape[0]`` draws from its own."""
    u = rng.uniform(generator, shape, device)
    tiny = torch.finfo(torch.float64).tiny
    return -torch.log(-torch.log(u.clamp(tiny, 1.0 - 1e-16)))


def sample_tokens(logits: torch.Tensor, temperature: float,
                  generator: Generators | None) -> torch.Tensor:
    """Token ids ``[...]`` from ``logits [..., V]``: argmax at ``temperature == 0``, else a
    sample of ``softmax(logits / temperature)`` by the Gumbel-max trick in float64."""
    if temperature == 0:
        return logits.argmax(-1)
    noisy = logits.double() / temperature + gumbel(logits.shape, generator, logits.device)
    return noisy.argmax(-1)


def confidence(logits: torch.Tensor, tokens: torch.Tensor, remasking: str,
               generator: Generators | None) -> torch.Tensor:
    """float32 ``[...]`` score in ``[0, 1]`` of ``tokens`` under ``logits [..., V]``.

    ``low_confidence``: ``p(token)``; ``margin``: ``p(top1) - p(top2)``; ``entropy``:
    ``exp(-H(p))`` (1 for a one-hot distribution; tokens with probability 0, such as the
    excluded MASK, contribute nothing); ``random``: ``U[0, 1)`` (random order).
    Probabilities are of the un-tempered logits: temperature changes what is proposed, not how
    sure the model is of it.
    """
    if remasking == "random":
        return rng.uniform(generator, tokens.shape, tokens.device).float()
    probs = torch.softmax(logits.float(), -1)
    if remasking == "low_confidence":
        return probs.gather(-1, tokens.unsqueeze(-1)).squeeze(-1)
    if remasking == "margin":
        top = probs.topk(2, dim=-1).values
        return top[..., 0] - top[..., 1]
    if remasking == "entropy":
        # entr(p) = -p log p with entr(0) = 0: an excluded token (logit -inf, so p = 0 and
        # log p = -inf) adds nothing, where p * log_softmax would give 0 * -inf = NaN.
        return torch.exp(-torch.special.entr(probs).sum(-1))
    raise ValueError(f"remasking must be one of {REMASKING}, got {remasking!r}")


def scheduled_count(remaining: torch.Tensor, steps_left: int) -> torch.Tensor:
    """Linear transfer schedule: commit ``ceil(remaining / steps_left)`` this step.

    Applied step after step to ``M`` masks over ``n`` steps this is LLaDA's schedule (``M // n``
    per step, one extra in the first ``M % n`` steps); computed from what is *left*, it also
    stays correct when a step commits more (threshold) or a row starts late, and it always
    empties the block by its last step.
    """
    return -(-remaining.long() // steps_left)


def select_transfers(scores: torch.Tensor, candidates: torch.Tensor, count: torch.Tensor,
                     threshold: float | None = None,
                     factor: float | None = None) -> torch.Tensor:
    """bool ``[B, W]``: the positions to commit this step, the most confident first.

    Every row that has candidates commits at least one (so no step is wasted and no rule can
    stall a block), and at least ``count``; the parallel rules can only add to that:

    * ``threshold`` (Fast-dLLM's threshold rule): also every candidate with score ``>=
      threshold``;
    * ``factor`` (Fast-dLLM's factor rule): the ``n`` most confident, ``n`` the longest run of
      ranks ``r = 1, 2, ...`` whose ``r``-th best score ``c_r`` has ``(r + 1) (1 - c_r) <
      factor`` -- the more tokens committed together, the surer each must be.

    Args:
        scores: ``[B, W]`` confidence of each position's proposal.
        candidates: bool ``[B, W]``, positions that may be committed (still masked, in the
            current block).
        count: int ``[B]``, the schedule's commit count for this step (clamped to the number
            of candidates): with neither rule, the fixed-budget top-``k`` commit.
    """
    available = candidates.sum(1)
    k = torch.maximum(torch.minimum(count.long(), available), (available > 0).long())
    masked = torch.where(candidates, scores.float(), torch.tensor(float("-inf"),
                                                                  device=scores.device))
    if threshold is not None:
        above = ((scores >= threshold) & candidates).sum(1)
        k = torch.maximum(k, above)
    if factor is not None:
        best = masked.sort(dim=1, descending=True).values
        ranks = torch.arange(1, best.shape[1] + 1, device=best.device, dtype=torch.float32)
        run = ((ranks + 1) * (1 - best) < factor).long().cumprod(1).sum(1)
        k = torch.maximum(k, torch.minimum(run, available))
    order = masked.argsort(dim=1, descending=True, stable=True)
    rank = torch.empty_like(order).scatter_(1, order, torch.arange(
        order.shape[1], device=order.device).expand_as(order))
    return (rank < k.unsqueeze(1)) & candidates
