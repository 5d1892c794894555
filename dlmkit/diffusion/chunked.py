"""Per-token losses over a vocabulary, computed in row chunks so memory stays O(chunk x V).

A *token loss* is a function ``fn(logits [c, V] float32, rows: slice) -> [c]`` giving the loss
of each of ``c`` rows; ``rows`` says which rows of the flattened batch the chunk holds, so
``fn`` can slice its own per-row data (targets, weights, ...). ``fn`` must not modify
``logits`` in place and must only close over tensors that need no gradient.

:func:`token_losses` evaluates it over ``N`` rows of either logits ``[N, V]`` or hidden states
``[N, D]`` with an LM head (``logits = hidden @ weight.T + bias``, the fused path: the full
logits never exist). With ``chunk_size`` set, the forward keeps no vocabulary-sized
activations and the backward recomputes each chunk (activation checkpointing done chunk by
chunk), writing its gradient straight into one preallocated buffer, so the extra memory is
the input's gradient plus O(chunk x V) — not the O(N x V) log-softmax and its gradient of the
plain path. Values and gradients equal the unchunked computation up to float rounding.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
import torch.nn.functional as F

TokenLoss = Callable[[torch.Tensor, slice], torch.Tensor]


def _logits(x: torch.Tensor, weight: torch.Tensor | None, bias: torch.Tensor | None):
    return (x if weight is None else F.linear(x, weight, bias)).float()


def _chunks(n: int, size: int) -> list[slice]:
    return [slice(i, min(i + size, n)) for i in range(0, n, size)]


class _ChunkedTokenLoss(torch.autograd.Function):
    @staticmethod
    def forward(ctx, fn, chunk_size, want_argmax, x, weight, bias):
        n = x.shape[0]
        out = torch.empty(n, dtype=torch.float32, device=x.device)
        pred = torch.empty(n if want_argmax else 0, dtype=torch.long, device=x.device)
        for rows in _chunks(n, chunk_size):
            logits = _logits(x[rows], weight, bias)
            out[rows] = fn(logits, rows)
            if want_argmax:
                pred[rows] = logits.argmax(-1)
        ctx.fn, ctx.chunk_size = fn, chunk_size
        ctx.save_for_backward(x, weight, bias)
        ctx.mark_non_differentiable(pred)
        return out, pred

    @staticmethod
    def backward(ctx, grad_out, _grad_pred):
        x, weight, bias = ctx.saved_tensors
        need_x, need_w, need_b = ctx.needs_input_grad[3:6]
        gx = torch.zeros_like(x) if need_x else None
        gw = torch.zeros_like(weight, dtype=torch.float32) if need_w else None
        gb = torch.zeros_like(bias, dtype=torch.float32) if need_b else None
        for rows in _chunks(x.shape[0], ctx.chunk_size):
            g = grad_out[rows]
            if not bool(g.any()):  # rows that are not scored (padding, prompt) cost nothing
                continue
            with torch.enable_grad():
                xc = x[rows].detach().requires_grad_(need_x)
                wc = None if weight is None else weight.detach().requires_grad_(need_w)
                bc = None if bias is None else bias.detach().requires_grad_(need_b)
                loss = ctx.fn(_logits(xc, wc, bc), rows)
                wrt = [t for t, need in ((xc, need_x), (wc, need_w), (bc, need_b)) if need]
                grads = list(torch.autograd.grad(loss, wrt, g))
            if need_x:
                gx[rows] = grads.pop(0)
            if need_w:
                gw += grads.pop(0)
            if need_b:
                gb += grads.pop(0)
        gw = None if gw is None else gw.to(weight.dtype)
        gb = None if gb is None else gb.to(bias.dtype)
        return None, None, None, gx, gw, gb


def token_losses(
    fn: TokenLoss, x: torch.Tensor, *, weight: torch.Tensor | None = None,
    bias: torch.Tensor | None = None, chunk_size: int | None = None, argmax: bool = False,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Evaluate ``fn`` on every row of ``x``.

    ``x``: logits ``[N, V]`` (``weight=None``) or hidden states ``[N, D]`` with LM head
    ``weight [V, D]`` and optional ``bias [V]``. ``chunk_size``: rows per chunk (``None`` =
    one plain autograd pass). Returns ``(loss [N] float32, pred)`` where ``pred [N]`` is the
    argmax over the vocabulary if ``argmax`` else ``None``.
    """
    if chunk_size is None:
        logits = _logits(x, weight, bias)
        loss = fn(logits, slice(0, x.shape[0]))
        return loss, (logits.detach().argmax(-1) if argmax else None)
    loss, pred = _ChunkedTokenLoss.apply(fn, chunk_size, argmax, x, weight, bias)
    return loss, (pred if argmax else None)


def cross_entropy_fn(targets: torch.Tensor) -> TokenLoss:
    """Token loss: cross-entropy against ``targets [N]`` (ids in ``[0, V)``)."""

    def fn(logits: torch.Tensor, rows: slice) -> torch.Tensor:
        return F.cross_entropy(logits, targets[rows], reduction="none")

    return fn
