"""Masks of the block-diffusion families over the concatenated ``[x_t | x_0]`` layout.

Positions ``[0, L)`` hold the noised stream ``x_t``, positions ``[L, 2L)`` the clean stream
``x_0``; both use position ids ``0 .. L-1``. ``blk(i) = (i mod L) // block_size``; the last
block may be short when ``L`` is not a multiple of ``block_size``. Padding follows
:mod:`dlmkit.masks.padding`: padded keys are blocked in both copies, padded queries see only
themselves.
"""

from __future__ import annotations

import torch

from .checks import check_positive_int
from .core import Mask
from .padding import self_attention_mask


def _layout(seq_len: int, block_size: int, device) -> tuple[torch.Tensor, ...]:
    """Per position of ``[x_t | x_0]``: (position q, is-noisy, block start, block end)."""
    q = torch.arange(2 * seq_len, device=device)
    local = q % seq_len
    start = local // block_size * block_size
    end = (start + block_size).clamp(max=seq_len)
    return q, q < seq_len, start, end


def _halves(q, kv, seq_len: int, block_size: int):
    """Integer half ids (0 noisy, 1 clean) and block ids; no bool==bool comparisons."""
    hq, hk = q // seq_len, kv // seq_len
    bq = (q - hq * seq_len) // block_size
    bk = (kv - hk * seq_len) // block_size
    inside = (q < 2 * seq_len) & (kv < 2 * seq_len)
    return hq, hk, bq, bk, inside


def block_diffusion(seq_len: int, block_size: int, valid=None, *, device=None) -> Mask:
    """BD3-LM training mask over ``[x_t | x_0]`` (``2L x 2L``).

    ========  ======================  ========================
    q \\ kv   x_t                     x_0
    ========  ======================  ========================
    x_t       same block              strictly earlier blocks
    x_0       never                   same or earlier blocks
    ========  ======================  ========================

    Example, ``block_diffusion(4, 2)`` (``#`` = attend)::

        x_t  # # . . | . . . .
        x_t  # # . . | . . . .
        x_t  . . # # | # # . .
        x_t  . . # # | # # . .
        x_0  . . . . | # # . .
        x_0  . . . . | # # . .
        x_0  . . . . | # # # #
        x_0  . . . . | # # # #

    Args:
        seq_len: ``L``, tokens per stream (> 0).
        block_size: diffusion block length (> 0).
        valid: optional ``[batch, L]`` padding mask (1 = real token).
    """
    seq_len = check_positive_int("seq_len", seq_len)
    block_size = check_positive_int("block_size", block_size)
    L, S = seq_len, block_size

    def rule(b, q, kv):
        hq, hk, bq, bk, inside = _halves(q, kv, L, S)
        same_block = (hq == hk) & (bq == bk)
        noisy_sees_clean = (hq == 0) & (hk == 1) & (bk < bq)
        clean_causal = (hq == 1) & (hk == 1) & (bk <= bq)
        return inside & (same_block | noisy_sees_clean | clean_causal)

    def intervals():
        q, noisy, start, end = _layout(L, S, device)
        lo = torch.stack([torch.where(noisy, start, L), torch.full_like(q, L)], -1)
        hi = torch.stack([torch.where(noisy, end, L + end), torch.where(noisy, L + start, L)], -1)
        return lo.unsqueeze(0), hi.unsqueeze(0)

    return self_attention_mask(f"block_diffusion_{L}_{S}", rule, intervals, L, 2, valid, device)


def idlm(seq_len: int, block_size: int, valid=None, *, device=None) -> Mask:
    """I-DLM training mask over ``[x_t | x_0]`` (``2L x 2L``).

    ========  ================================  ========================
    q \\ kv   x_t                               x_0
    ========  ================================  ========================
    x_t       same block, causal (kv <= q)      strictly earlier blocks
    x_0       never                             token-causal (kv <= q)
    ========  ================================  ========================

    Example, ``idlm(4, 2)``::

        x_t  # . . . | . . . .
        x_t  # # . . | . . . .
        x_t  . . # . | # # . .
        x_t  . . # # | # # . .
        x_0  . . . . | # . . .
        x_0  . . . . | # # . .
        x_0  . . . . | # # # .
        x_0  . . . . | # # # #

    With ``block_size=1`` a noisy token sees itself plus the clean tokens strictly before it.
    Unlike the reference builder, left-padded and empty samples never produce a fully blocked
    row (padded queries keep their diagonal).
    """
    seq_len = check_positive_int("seq_len", seq_len)
    block_size = check_positive_int("block_size", block_size)
    L, S = seq_len, block_size

    def rule(b, q, kv):
        hq, hk, bq, bk, inside = _halves(q, kv, L, S)
        noisy_block = (hq == 0) & (hk == 0) & (bq == bk) & (kv <= q)
        noisy_sees_clean = (hq == 0) & (hk == 1) & (bk < bq)
        clean_causal = (hq == 1) & (hk == 1) & (kv <= q)
        return inside & (noisy_block | noisy_sees_clean | clean_causal)

    def intervals():
        q, noisy, start, _ = _layout(L, S, device)
        lo = torch.stack([torch.where(noisy, start, L), torch.full_like(q, L)], -1)
        hi = torch.stack([q + 1, torch.where(noisy, L + start, L)], -1)
        return lo.unsqueeze(0), hi.unsqueeze(0)

    return self_attention_mask(f"idlm_{L}_{S}", rule, intervals, L, 2, valid, device)
