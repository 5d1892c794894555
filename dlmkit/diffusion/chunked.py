"""Weighted sums of per-token losses over a vocabulary, in row chunks: O(chunk x V) memory.

A *token loss* is a row-wise function ``fn(logits [c, V] float32, rows: slice) -> [c]``: the
loss of row ``i`` depends on row ``i`` of the logits only. ``rows`` says which rows of the
flattened batch the chunk holds, so ``fn`` can slice its own per-row data (targets, ...).
``fn`` must not modify ``logits`` in place.

:func:`weighted_token_loss` returns ``sum_i coef_i * fn_i`` (per group) over ``N`` rows of
either logits ``[N, V]`` or hidden states ``[N, D]`` with an LM head (``logits = hidden @
weight.T + bias``, the fused path: the full logits never exist). Every loss in
:mod:`dlmkit.diffusion.losses` is such a weighted sum, its weights fixed before the values are
known (masks, ``1/p``, decay weights, the denominator).

Chunked mode (``chunk_size`` set): because the output is linear in the per-token losses with
known weights, each chunk's gradient is computed right away in the forward pass — logits, loss
and the gradient w.r.t. the logits of one chunk, then folded into the input's gradient
(``@ weight`` for the fused path, and ``weight``'s own gradient accumulated) — and the chunk is
freed. The backward only scales the stored gradients by the incoming one. So the forward keeps
no vocabulary-sized activations, nothing is recomputed (no slower than the plain path), and the
extra memory is O(chunk x V) plus the inputs' gradients. Values and gradients equal the
unchunked computation up to float rounding. (The same idea as checkpointing the loss chunk by
chunk, without the second forward.) Not supported: double backward.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
import torch.nn.functional as F

TokenLoss = Callable[[torch.Tensor, slice], torch.Tensor]


def _logits(x: torch.Tensor, weight: torch.Tensor | None, bias: torch.Tensor | None):
    return (x if weight is None else F.linear(x, weight, bias)).float()


def _terms(fn: TokenLoss, logits: torch.Tensor, rows: slice, coef: torch.Tensor):
    # where(), not a product: a row with weight 0 may hold inf (e.g. an unscored target).
    return torch.where(coef != 0, fn(logits, rows) * coef, 0.0)


class _ChunkedWeightedLoss(torch.autograd.Function):
    @staticmethod
    def forward(ctx, fn, chunk_size, want_argmax, track, num_groups, group, coef, x, weight,
                bias):
        need_x, need_w, need_b = (track and n for n in ctx.needs_input_grad[7:10])
        n = x.shape[0]
        out = torch.zeros(num_groups, dtype=torch.float32, device=x.device)
        pred = torch.full((n if want_argmax else 0,), -1, dtype=torch.long, device=x.device)
        gx = torch.empty_like(x) if need_x else None  # every chunk writes its rows
        gw = (torch.zeros((num_groups, *weight.shape), dtype=torch.float32, device=x.device)
              if need_w else None)
        gb = (torch.zeros((num_groups, *bias.shape), dtype=torch.float32, device=x.device)
              if need_b else None)
        for start in range(0, n, chunk_size):
            rows = slice(start, min(start + chunk_size, n))
            c, g = coef[rows], group[rows]
            if not bool((c != 0).any()):  # unscored rows (prompt, padding) cost no gradient
                if need_x:
                    gx[rows] = 0
                if want_argmax:  # but a weight that underflowed to 0 still has a prediction
                    pred[rows] = _logits(x[rows], weight, bias).argmax(-1)
                continue
            xc = x[rows]
            with torch.enable_grad():
                logits = _logits(xc, weight, bias).detach().requires_grad_(True)
                terms = _terms(fn, logits, rows, c)
                glogits = (torch.autograd.grad(terms.sum(), logits)[0]
                           if need_x or need_w or need_b else None)
            out.index_add_(0, g, terms.detach())
            if want_argmax:
                pred[rows] = logits.detach().argmax(-1)
            if need_x:
                gx[rows] = glogits.to(x.dtype) if weight is None else \
                    (glogits.to(weight.dtype) @ weight).to(x.dtype)
            for k in range(num_groups) if (need_w or need_b) else ():
                gk = glogits if num_groups == 1 else glogits * (g == k)[:, None]
                if need_w:
                    gw[k] += gk.t() @ xc.float()
                if need_b:
                    gb[k] += gk.sum(0)
        ctx.saved = (group, gx, gw, gb, weight, bias)
        ctx.mark_non_differentiable(pred)
        return out, pred

    @staticmethod
    def backward(ctx, grad_out, _grad_pred):
        group, gx, gw, gb, weight, bias = ctx.saved
        ctx.saved = None  # the stored gradients are scaled in place: one backward only
        if gx is not None:
            gx.mul_(grad_out[group].to(gx.dtype)[:, None])
        if gw is not None:
            gw = torch.einsum("g,g...->...", grad_out, gw).to(weight.dtype)
        if gb is not None:
            gb = torch.einsum("g,g...->...", grad_out, gb).to(bias.dtype)
        return None, None, None, None, None, None, None, gx, gw, gb


def weighted_token_loss(
    fn: TokenLoss, x: torch.Tensor, coef: torch.Tensor, *, weight: torch.Tensor | None = None,
    bias: torch.Tensor | None = None, group: torch.Tensor | None = None, num_groups: int = 1,
    chunk_size: int | None = None, argmax: bool = False,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """``out[k] = sum_{i: group_i = k} coef_i * fn(logits)_i``; rows with ``coef_i = 0`` add 0.

    ``x``: logits ``[N, V]`` (``weight=None``) or hidden states ``[N, D]`` with LM head
    ``weight [V, D]`` and optional ``bias [V]``. ``coef [N]``: fixed weights (no gradient).
    ``group [N]`` long in ``[0, num_groups)`` (default all 0). ``chunk_size``: rows per chunk,
    ``None`` = one plain autograd pass. Returns ``(out [num_groups] float32, pred)``, ``pred
    [N]`` the argmax over the vocabulary of every row if ``argmax``, whatever the chunking
    (so counts such as DFlash's per-offset accuracy do not depend on ``chunk_size``; a chunk
    whose weights are all 0 then costs one forward of its logits, no gradient).
    """
    coef = coef.detach().to(torch.float32).reshape(-1)
    group = (torch.zeros(x.shape[0], dtype=torch.long, device=x.device) if group is None
             else group.reshape(-1))
    if chunk_size is None:
        logits = _logits(x, weight, bias)
        terms = _terms(fn, logits, slice(0, x.shape[0]), coef)
        out = torch.zeros(num_groups, dtype=terms.dtype, device=x.device).index_add(0, group,
                                                                                  terms)
        return out, (logits.detach().argmax(-1) if argmax else None)
    out, pred = _ChunkedWeightedLoss.apply(fn, chunk_size, argmax, torch.is_grad_enabled(),
                                           num_groups, group, coef, x, weight, bias)
    return out, (pred if argmax else None)


def cross_entropy_fn(targets: torch.Tensor) -> TokenLoss:
    """Token loss: cross-entropy against ``targets [N]`` (ids in ``[0, V)``)."""

    def fn(logits: torch.Tensor, rows: slice) -> torch.Tensor:
        return F.cross_entropy(logits, targets[rows], reduction="none")

    return fn
