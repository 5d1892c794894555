"""DiffusionGemma canvas training mask (full and sliding).

Queries are the ``R`` canvas positions; keys are ``[clean encoder (enc_len) | canvas (R)]``
(``kv_len = enc_len + R``). Example ``b`` has a prompt of ``prefix_b`` tokens followed by a
response of ``resp_b`` tokens in the encoder stream; canvas position ``j`` stands for response
token ``j`` and belongs to canvas block ``qb = j // S``. A real canvas row (``j < resp_b``) sees:

* the encoder columns ``[0, prefix_b + qb*S)``: the whole prompt, and the clean response
  blocks **strictly** before its own (the leakage invariant: never the clean copy of its own
  block); the tail beyond ``prefix_b + resp_b`` is therefore never visible;
* with ``sliding_window=W``, only encoder columns ``>= prefix_b + qb*S - W + 1``: the window is
  anchored at the block boundary, so the bound is the same for every query of a block;
* the canvas columns of its own block (bidirectional), limited to the real canvas ``< resp_b``.

A padded canvas row (``j >= resp_b``) sees only its own canvas diagonal, and padded canvas
columns are never visible to real rows, so no row is ever fully blocked. With ``valid``
(``[B, enc_len]``, 1 = real encoder token) padded encoder columns are blocked too (left-padded
or holey encoder streams).

:func:`canvas_encoder` is the matching encoder mask: causal over the real clean tokens, with
transformers' sliding convention for the sliding layers (``kv > q - W``: ``W`` keys including
the query), so the decoder's sliding bound ``> boundary - W`` is the window of the block's
first query.

Example, ``canvas(2, 4, 7, 2)`` (``#`` = attend; ``p`` prompt, ``r`` response, ``t`` tail)::

                 p p r r r r t | c c c c
    block 0      # # . . . . . | # # . .
                 # # . . . . . | # # . .
    block 1      # # # # . . . | . . # #
                 # # # # . . . | . . # #
"""

from __future__ import annotations

import torch

from .checks import check_int, check_positive_int, check_valid, mask_device
from .core import Mask
from .padding import self_attention_mask, valid_runs


def _lengths(name: str, value, device) -> torch.Tensor:
    """An int or a 1-D integer tensor ``[batch]`` of non-negative lengths, as int64 ``[B]``."""
    if isinstance(value, torch.Tensor) and value.dim() == 1:
        if value.is_floating_point() or value.is_complex() or value.dtype == torch.bool:
            raise TypeError(f"{name} must hold integers, got dtype {value.dtype}")
        if value.numel() == 0:
            raise ValueError(f"{name} must have at least one entry, got shape (0,)")
        out = value.to(device=device, dtype=torch.int64)
    elif isinstance(value, torch.Tensor) and value.dim() > 1:
        raise ValueError(f"{name} must be an int or a 1-D tensor [batch], "
                         f"got shape {tuple(value.shape)}")
    else:
        out = torch.tensor([check_int(name, value)], device=device)
    if int(out.min()) < 0:
        raise ValueError(f"{name} must be >= 0, got {int(out.min())}")
    return out


def canvas(prefix_lengths, response_length, enc_len: int, block_size: int,
           sliding_window: int | None = None, *, canvas_length: int | None = None,
           valid=None, device=None) -> Mask:
    """DiffusionGemma canvas mask ``[batch, 1, R, enc_len + R]``.

    Args:
        prefix_lengths: prompt length per example: an int (same for every row) or int ``[B]``.
        response_length: response length per example: an int or int ``[B]``; canvas rows
            ``>= resp_b`` are padding.
        enc_len: encoder (clean stream) length ``E``; ``prefix + response <= E`` per example.
        block_size: canvas block length ``S`` (> 0).
        sliding_window: ``W >= 0`` for the sliding-attention layers, None for the full mask
            (the sliding mask is always a subset of the full one).
        canvas_length: ``R``, defaults to the largest response length (must be >= it, >= 1).
        valid: optional ``[B or 1, enc_len]`` real-token mask of the encoder stream; padded
            encoder columns are then never visible.
    """
    enc_len = check_positive_int("enc_len", enc_len)
    block_size = check_positive_int("block_size", block_size)
    window = None if sliding_window is None else check_int("sliding_window", sliding_window,
                                                           minimum=0)
    device = mask_device(device, prefix_lengths, response_length, valid)
    prefix = _lengths("prefix_lengths", prefix_lengths, device)
    response = _lengths("response_length", response_length, device)
    if prefix.numel() != response.numel() and 1 not in (prefix.numel(), response.numel()):
        raise ValueError(f"prefix_lengths ({prefix.numel()} rows) and response_length "
                         f"({response.numel()} rows) must have the same batch size (or one)")
    prefix, response = torch.broadcast_tensors(prefix, response)
    total = prefix + response
    if int(total.max()) > enc_len:
        row = int(total.argmax())
        raise ValueError(f"prefix_lengths + response_length must be <= enc_len={enc_len}, got "
                         f"{int(prefix[row])} + {int(response[row])} = {int(total[row])} "
                         f"in row {row}")
    longest = int(response.max())
    if canvas_length is None:
        if longest < 1:
            raise ValueError("response_length is 0 for every row; pass canvas_length >= 1")
        canvas_length = longest
    canvas_length = check_positive_int("canvas_length", canvas_length)
    if canvas_length < longest:
        raise ValueError(f"canvas_length must be >= the longest response ({longest}), "
                         f"got {canvas_length}")
    E, S, R = enc_len, block_size, canvas_length
    device = prefix.device
    valid = check_valid(valid, E)
    runs = None
    if valid is not None:
        valid = valid.to(device)
        if valid.shape[0] not in (1, prefix.numel()) or prefix.numel() not in (1, valid.shape[0]):
            raise ValueError(f"valid has {valid.shape[0]} rows, prefix_lengths "
                             f"{prefix.numel()}: they must agree (or one of them be 1)")
        runs = valid_runs(valid)

    def rule(b, q, kv):
        p, r = prefix[b], response[b]
        block_start = q // S * S
        boundary = p + block_start
        enc = kv < boundary  # boundary <= p + q < p + r <= E for real rows
        if window is not None:
            enc = enc & (kv > boundary - window)
        if valid is not None:
            row = b if valid.shape[0] > 1 else torch.zeros_like(b)
            enc = enc & (valid[row, kv.clamp(0, E - 1)] > 0)
        own = (kv >= E + block_start) & (kv < E + block_start + S) & (kv < E + r)
        return ((q < r) & (enc | own)) | (kv == E + q)

    def intervals():
        q = torch.arange(R, device=device).view(1, R)
        p, r = prefix.view(-1, 1), response.view(-1, 1)
        block_start = q // S * S
        boundary = p + block_start
        real = q < r
        lo = torch.zeros_like(boundary) if window is None else boundary - window + 1
        hi = boundary
        if runs is not None:  # one run of real encoder tokens per row: clip to it
            start, end = (x.view(-1, 1) for x in runs)
            lo, hi = torch.maximum(lo, start), torch.minimum(hi, end)
            hi = torch.maximum(hi, lo)
        enc_lo = torch.where(real, lo, E)
        enc_hi = torch.where(real, hi, E)
        own_lo = torch.where(real, E + block_start, E + q)
        own_hi = torch.where(real, E + torch.minimum(block_start + S, r), E + q + 1)
        return torch.stack([enc_lo, own_lo], -1), torch.stack([enc_hi, own_hi], -1)

    kind = "full" if window is None else f"sliding{window}"
    batch = max(prefix.numel(), 1 if valid is None else valid.shape[0])
    return Mask(rule, R, E + R, batch,
                intervals=intervals if valid is None or runs is not None else None,
                name=f"canvas_{kind}_{R}x{E}_{S}", device=device)


def canvas_encoder(seq_len: int, valid=None, sliding_window: int | None = None, *,
                   device=None) -> Mask:
    """DiffusionGemma encoder mask ``[batch or 1, 1, L, L]``: causal over the real tokens
    (padding per :mod:`dlmkit.masks.padding`); with ``sliding_window=W`` also ``kv > q - W``
    (transformers' convention: ``W`` keys including the query's own)."""
    seq_len = check_positive_int("seq_len", seq_len)
    device = mask_device(device, valid)
    window = None if sliding_window is None else check_positive_int("sliding_window",
                                                                    sliding_window)

    def rule(b, q, kv):
        seen = kv <= q
        return seen if window is None else seen & (kv > q - window)

    def intervals():
        q = torch.arange(seq_len, device=device).view(1, seq_len, 1)
        lo = torch.zeros_like(q) if window is None else (q - window + 1).clamp(min=0)
        return lo, q + 1

    kind = "full" if window is None else f"sliding{window}"
    return self_attention_mask(f"canvas_encoder_{kind}_{seq_len}", rule, intervals, seq_len, 1,
                               valid, device)


EXAMPLES = {
    "canvas": lambda seq_len, block_size: canvas(
        seq_len // 4, max(1, seq_len // 2), seq_len, block_size),
    "canvas_sliding": lambda seq_len, block_size: canvas(
        seq_len // 4, max(1, seq_len // 2), seq_len, block_size, sliding_window=2 * block_size),
}
