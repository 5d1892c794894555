"""The group-relative policy objective: advantages, the clipped surrogate, the KL term.

For the completions ``i`` of one optimizer step (all ranks), with ``s_i`` an estimator's
sequence log-probability (:mod:`.estimators`) and ``n_i`` the completion's length::

    A_i   = (R_i - mean_g R) / (std_g R + 1e-4)          (g: the G completions of i's prompt)
    r_i   = exp((s_i(theta) - s_i(old)) / n_i)           (a per-token, length-normalised ratio)
    L     = -1/N sum_i [min(r_i A_i, clip(r_i, 1 - eps, 1 + eps) A_i) - beta k3_i]
    k3_i  = exp(d_i) - d_i - 1,   d_i = (s_i(ref) - s_i(theta)) / n_i

``N`` is the number of completions of the step over all ranks (the global denominator), so
the gradient does not depend on the rank or micro-batch split. ``std_g`` is the sample
standard deviation (``G - 1`` in the denominator); with ``scale_rewards: false`` the rewards are
only centred (Dr. GRPO). The ratio is per sequence (clipped once per completion, as ESPO does
with its ELBO), not per token as in d1: the ELBO is a sequence-level quantity. k3 (Schulman's
estimator) is non-negative, unbiased for KL(theta || ref) when the completion is drawn from
theta, and its gradient pulls ``s(theta)`` towards ``s(ref)``.
"""

from __future__ import annotations

import torch

STD_EPS = 1e-4


def group_advantages(rewards: torch.Tensor, scale: bool = True) -> torch.Tensor:
    """``[P, G]`` rewards -> ``[P, G]`` advantages: centred on each prompt's mean, divided by
    its sample std (+ ``STD_EPS``) when ``scale``. A group with one reward for all gets zeros."""
    if rewards.dim() != 2 or rewards.shape[1] < 2:
        raise ValueError(f"rewards must be [prompts, G >= 2], got shape {tuple(rewards.shape)}")
    centred = rewards - rewards.mean(1, keepdim=True)
    if not scale:
        return centred
    return centred / (rewards.std(1, keepdim=True) + STD_EPS)


def clipped_surrogate(logp: torch.Tensor, old_logp: torch.Tensor, advantages: torch.Tensor,
                      lengths: torch.Tensor, epsilon: float) -> tuple[torch.Tensor, torch.Tensor]:
    """``(per-completion surrogate [N], clipped [N] bool)``: ``min(r A, clip(r) A)`` with
    ``r = exp((logp - old_logp) / lengths)``; ``clipped`` marks the completions whose gradient
    the clip removed."""
    ratio = torch.exp((logp - old_logp.detach()) / lengths)
    clipped_ratio = ratio.clamp(1 - epsilon, 1 + epsilon)
    plain, clipped = ratio * advantages, clipped_ratio * advantages
    return torch.minimum(plain, clipped), (clipped < plain).detach()


def k3(logp: torch.Tensor, ref_logp: torch.Tensor, lengths: torch.Tensor) -> torch.Tensor:
    """``[N]`` k3 estimates of KL(theta || ref) per token: ``exp(d) - d - 1``, ``d = (ref_logp -
    logp) / lengths``."""
    d = (ref_logp.detach() - logp) / lengths
    return torch.exp(d) - d - 1
