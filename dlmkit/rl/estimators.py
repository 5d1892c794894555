"""Sequence log-probability estimators for policy gradients on diffusion LMs.

A masked-diffusion model has no tractable ``log p(completion | prompt)``. Two estimators,
each a differentiable function of the model under a *noise* drawn once per completion and
step and then shared by every model that scores it (the current policy, the rollout policy,
the frozen reference), so the noise cancels from their differences:

``elbo`` -- the family's own evidence lower bound, as ``dlmkit.decoding.likelihood`` computes
it for scoring (but with gradients):

* ``masked`` (mdlm; scdd over the non-MASK tokens): draw ``l ~ U{1..n}`` and a uniformly random
  ``l``-subset ``S`` of the ``n`` completion tokens, mask ``S``, score ``(n / l) sum_{i in S}
  log p(x_i | x with S masked)``. Its expectation over the noise is the masked-diffusion ELBO
  (= the any-order autoregressive likelihood averaged over orders), ``<= log p``, with
  equality when the denominator's conditionals are those of one joint distribution.
* ``block`` (bd3lm): the same per block of ``block_size`` (blocks cut from position 0, as
  trained), each given the clean earlier blocks (``[x_t | x_0]``, one forward); the bound is
  the sum over blocks.
* ``causal`` (hybrid, idlm: their clean causal stream; ar): the exact ``log p``, no noise.

The ``elbo`` estimate is unbiased for the ELBO and its gradient, not for ``log p``: the policy
ratio ``exp(elbo_theta - elbo_old)`` it gives is exact only where the bound is tight. With the
noise shared, the ratio is exactly 1 at ``theta = old`` for every draw (an independent draw per
model would add the estimator's variance to every ratio).

``one_step`` -- diffu-GRPO's (d1): one forward with every completion token masked and each
prompt token masked with probability ``prompt_mask_prob``; the estimate is ``sum_i log
p(x_i | masked prompt, all-masked completion)`` (for ``block``: every completion block
all-masked, given the clean earlier blocks). Its expectation is a mean-field score -- each
token predicted from the (partly masked) prompt alone, ignoring the other completion tokens --
which is neither ``log p`` nor a bound on it; it is unbiased only for that mean-field
quantity, and equals ``log p`` only when the completion's tokens are independent given the
prompt. It costs one forward per completion whatever ``n``. The causal families have exact
scores and take ``elbo``.

Every row is scored at its own length (rows of one length share a forward), so no padding
enters a score.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass

import torch

from dlmkit.decoding.likelihood import layout_attention, score_rows

# a family's likelihood scorer -> (layout, log-probs over the non-MASK tokens only)
LAYOUTS = {"masked_elbo": ("masked", False), "masked_elbo_nonmask": ("masked", True),
           "block_elbo": ("block", False), "causal": ("causal", False)}


@dataclass
class Noise:
    """One completion's noise, ``K`` draws: ``masked [K, n]`` (completion tokens masked),
    ``weight [K, n]`` (float64: each masked token's weight), ``prompt_masked [K, p]``."""

    masked: torch.Tensor
    weight: torch.Tensor
    prompt_masked: torch.Tensor


class Estimator:
    """Scores completions with one of :data:`ESTIMATORS` for a family's layout.

    Args:
        likelihood: the family's ``likelihood`` scorer (:mod:`dlmkit.families`; a key of
            :data:`LAYOUTS`).
        estimator: ``elbo`` or ``one_step``.
        mask_id, vocab_size: the tokenizer's; logits are cut to ``vocab_size``.
        block_size: the trained block (``block`` layout only).
        logit_shift: the family was trained with ``strategy.logit_shift`` (the token at ``i``
            read from the output at ``i - 1``).
        samples: noise draws per completion (their mean is the estimate).
        prompt_mask_prob: ``one_step``'s prompt masking.
    """

    def __init__(self, likelihood: str | None, estimator: str, *, mask_id: int,
                 vocab_size: int, family: str = "?", block_size: int | None = None,
                 logit_shift: bool = False, samples: int = 1,
                 prompt_mask_prob: float = 0.15) -> None:
        if likelihood not in LAYOUTS:
            fit = ", ".join(sorted(LAYOUTS))
            raise ValueError(f"family {family!r} has no sequence log-likelihood estimator "
                             f"(its likelihood scorer is {likelihood!r}; rl needs one of "
                             f"{fit}: mdlm, scdd, bd3lm, hybrid, idlm, ar)")
        if estimator not in ESTIMATORS:
            raise ValueError(f"estimator must be one of {', '.join(ESTIMATORS)}, got "
                             f"{estimator!r}")
        self.layout, self.exclude_mask = LAYOUTS[likelihood]
        if estimator == "one_step" and self.layout == "causal":
            raise ValueError(f"objective.estimator 'one_step' is for masked-diffusion families "
                             f"(mdlm, scdd, bd3lm); {family} is scored exactly by its causal "
                             "stream: use objective.estimator 'elbo' (exact for it)")
        if self.layout == "block" and (not isinstance(block_size, int) or block_size < 1):
            raise ValueError(f"block_size must be the trained block (an int >= 1) for family "
                             f"{family!r}, got {block_size!r}")
        self.estimator, self.family = estimator, family
        self.mask_id, self.vocab_size = mask_id, vocab_size
        self.block_size, self.shift = block_size, int(bool(logit_shift))
        self.samples, self.prompt_mask_prob = samples, float(prompt_mask_prob)

    # -- noise ---------------------------------------------------------------------------
    def draw(self, prompt_len: int, n: int, generator: torch.Generator) -> Noise:
        """``samples`` draws of the noise for a completion of ``n`` tokens after a prompt of
        ``prompt_len``, every number from ``generator`` (CPU)."""
        k = self.samples
        if self.estimator == "one_step":
            prompt = torch.rand(k, prompt_len, generator=generator) < self.prompt_mask_prob
            return Noise(torch.ones(k, n, dtype=torch.bool),
                         torch.ones(k, n, dtype=torch.float64), prompt)
        none = torch.zeros(k, prompt_len, dtype=torch.bool)
        if self.layout == "causal":
            return Noise(torch.ones(k, n, dtype=torch.bool),
                         torch.ones(k, n, dtype=torch.float64), none)
        masked = torch.zeros(k, n, dtype=torch.bool)
        weight = torch.zeros(k, n, dtype=torch.float64)
        for lo, hi in self._blocks(prompt_len, n):
            size = hi - lo
            for row in range(k):
                count = int(torch.randint(1, size + 1, (1,), generator=generator))
                chosen = torch.rand(size, generator=generator).argsort()[:count]
                masked[row, lo + chosen] = True
                weight[row, lo:hi] = size / count
        return Noise(masked, weight * masked, none)

    def _blocks(self, prompt_len: int, n: int) -> list[tuple[int, int]]:
        """The completion's ``[lo, hi)`` spans that are masked independently: one span, or
        its pieces in each trained block (``block`` layout)."""
        if self.layout != "block":
            return [(0, n)]
        spans, lo = [], 0
        while lo < n:
            end = prompt_len + lo
            hi = min(n, lo + self.block_size - end % self.block_size)
            spans.append((lo, hi))
            lo = hi
        return spans

    # -- scores --------------------------------------------------------------------------
    def forwards(self, items: list[tuple[list[int], list[int]]], noises: list[Noise]) -> int:
        """How many model forwards :meth:`score` makes for ``items`` (one per row length)."""
        return len({len(row[1]) for row in self._rows(items, noises)})

    def score(self, model, items: list[tuple[list[int], list[int]]],
              noises: list[Noise], forwards: int = 0) -> torch.Tensor:
        """``[N]`` float64 estimates (differentiable in ``model``) of ``items`` = ``(prompt ids,
        completion ids)`` under ``noises`` (one per item, from :meth:`draw`). ``forwards``: make
        at least that many model forwards (FSDP2 all-gathers the weights in every forward, so
        all ranks must make the same number; the extra ones repeat a row and add 0 times its
        score, which leaves the value and the gradient unchanged)."""
        device = next(model.parameters()).device
        rows = self._rows(items, noises)
        groups = defaultdict(list)
        for row in rows:
            groups[len(row[1])].append(row)
        total = torch.zeros(len(items), dtype=torch.float64, device=device)
        for length, group in groups.items():
            total = self._add(model, total, group, length, noises, device)
        shortest = min(groups)
        for _ in range(forwards - len(groups)):
            total = self._add(model, total, groups[shortest][:1], shortest, noises, device,
                              weight=0.0)
        return total

    def _add(self, model, total, group, length, noises, device, weight: float = 1.0):
        """``total`` plus ``weight`` times the scores of ``group`` (rows of one ``length``)."""
        ids = torch.tensor([r[1] for r in group], device=device)
        logits = self._forward(model, ids, length)
        for b, (i, _, columns, target, w) in enumerate(group):
            picked = torch.log_softmax(logits[b, columns].float(), -1) \
                .gather(1, target.to(device).unsqueeze(1)).squeeze(1)
            value = (picked.double() * w.to(device)).sum() * weight
            total = total.index_add(0, torch.tensor([i], device=device),
                                    value.unsqueeze(0) / noises[i].masked.shape[0])
        return total

    def _rows(self, items, noises) -> list[tuple]:
        """``(item, input ids, scored columns, targets, weights)`` per noise draw of each item."""
        rows = []
        for i, ((prompt, ids), noise) in enumerate(zip(items, noises)):
            if (self.shift or self.layout == "causal") and not prompt:
                raise ValueError(f"item {i}: the prompt is empty, but this model reads each "
                                 "token from the output before it (causal stream or "
                                 "logit_shift): a prompt needs at least one token")
            if not ids:
                raise ValueError(f"item {i}: the completion is empty; nothing to score")
            for k in range(noise.masked.shape[0]):
                rows.append((i, *self._row(prompt, ids, noise, k)))
        return rows

    def _row(self, prompt: list[int], ids: list[int], noise: Noise, k: int):
        """Draw ``k`` of a completion as ``(input ids, logit rows, targets, weights)``."""
        p, n = len(prompt), len(ids)
        clean = torch.tensor(prompt + ids, dtype=torch.long)
        target = clean[p:]
        rows = score_rows(self.layout, p, n, block_size=self.block_size, shift=self.shift)
        if self.layout == "causal":
            return clean.tolist(), rows, target, noise.weight[k]
        noisy = clean.clone()
        noisy[:p] = torch.where(noise.prompt_masked[k], self.mask_id, noisy[:p])
        noisy[p:] = torch.where(noise.masked[k], self.mask_id, target)
        if self.layout == "masked":
            return noisy.tolist(), rows, target, noise.weight[k]
        context = clean.clone()  # the clean stream; d1's prompt masking applies to it too
        context[:p] = noisy[:p]
        return noisy.tolist() + context.tolist(), rows, target, noise.weight[k]

    def _forward(self, model, ids: torch.Tensor, length: int) -> torch.Tensor:
        from dlmkit.models import forward_logits

        device = ids.device
        tokens = length // 2 if self.layout == "block" else length  # [x_t | x_0]: two halves
        mask, positions = layout_attention(self.layout, tokens, block_size=self.block_size,
                                           device=device)
        logits = forward_logits(model, ids, mask, positions.expand(ids.shape[0], -1))
        logits = logits[..., :self.vocab_size]
        if self.exclude_mask:
            logits = logits.float().index_fill(-1, torch.tensor([self.mask_id], device=device),
                                               float("-inf"))
        return logits


ESTIMATORS = ("elbo", "one_step")


def estimator_for(strategy_cls, meta: dict, config: dict, tokenizer) -> Estimator:
    """The estimator ``config["objective"]`` asks for, for an export of ``strategy_cls`` whose
    ``dlmkit.json`` is ``meta`` (its trained block and ``logit_shift``)."""
    from dlmkit import families
    from dlmkit.decoding.options import trained_logit_shift

    o = config["objective"]
    options = meta.get("options") or {}
    scorer = families.get(strategy_cls.name).likelihood
    return Estimator(scorer, o["estimator"], mask_id=tokenizer.mask_token_id,
                     vocab_size=tokenizer.vocab_size, family=strategy_cls.name,
                     block_size=options.get("block_size", meta.get("block_size")),
                     logit_shift=trained_logit_shift(meta, {}),
                     samples=o["samples"], prompt_mask_prob=o["prompt_mask_prob"])
