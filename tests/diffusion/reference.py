"""Slow, obviously-correct references for the diffusion tests (float64, Python loops)."""

from __future__ import annotations

import math

import torch


def ce(logits_row, target: int) -> float:
    """Cross-entropy of one row of logits by hand: log-sum-exp minus the target logit."""
    row = [float(v) for v in logits_row]
    top = max(row)
    return top + math.log(sum(math.exp(v - top) for v in row)) - row[target]


def scdd_step_kl(logits_row, x: int, z: int, mask: int, t: float, T: int, sched) -> float:
    """T * KL(q(z_s | z_t, x) || p(z_s | z_t)) from explicit transition matrices.

    ``sched(t)`` returns (gamma, rho). States are the V tokens; MASK absorbs.
    """
    V = len(logits_row)
    K = V - 1
    s = max(t - 1.0 / T, 0.0)
    g_s, r_s = sched(s)
    g_t, r_t = sched(t)
    nonmask = [v for v in range(V) if v != mask]

    def marginal_s(dist_x):  # q(z_s | x ~ dist_x) over V states
        out = [0.0] * V
        for v in nonmask:
            out[v] = g_s * (r_s * dist_x[v] + (1 - r_s) / K)
        out[mask] = 1 - g_s
        return out

    keep = g_t / g_s
    alpha = r_t / r_s

    def trans(v, w):  # P(z_t = w | z_s = v)
        if v == mask:
            return 1.0 if w == mask else 0.0
        if w == mask:
            return 1 - keep
        return keep * ((1 - alpha) / K + (alpha if v == w else 0.0))

    def posterior(dist_x):
        joint = [p * trans(v, z) for v, p in enumerate(marginal_s(dist_x))]
        tot = sum(joint)
        return [j / tot for j in joint]

    onehot = [1.0 if v == x else 0.0 for v in range(V)]
    row = [float(v) for v in logits_row]
    top = max(row[v] for v in nonmask)
    den = sum(math.exp(row[v] - top) for v in nonmask)
    p_model = [0.0 if v == mask else math.exp(row[v] - top) / den for v in range(V)]
    q = posterior(onehot)
    p = posterior(p_model)
    return T * sum(qi * math.log(qi / pi) for qi, pi in zip(q, p) if qi > 0)


def grads(fn, *tensors):
    """Gradients of ``fn()`` w.r.t. ``tensors`` (cleared before)."""
    for t in tensors:
        t.grad = None
    out = fn()
    out.backward()
    return out.detach(), [torch.zeros_like(t) if t.grad is None else t.grad.clone()
                          for t in tensors]


def rng_untouched(call):
    """Run ``call`` and assert the global CPU RNG state did not move."""
    before = torch.get_rng_state()
    call()
    assert torch.equal(before, torch.get_rng_state())
