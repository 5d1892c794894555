"""Decode-time masks: the queries of one sampler forward against a KV cache.

Each is exactly a sub-grid (rows = the tokens being decoded, columns = the cached keys followed
by the new ones) of the training mask it is consistent with, so a model decodes under the very
pattern it was trained on:

================================  ==========================================================
decode mask                       rows/columns of the training mask
================================  ==========================================================
``block_diffusion_decode``        ``block_diffusion``: noisy rows ``[P, P + n*S)``; clean
                                  columns ``[0, P)`` then noisy columns ``[P, P + n*S)``
                                  (when ``S`` does not divide ``P``, the cached head of
                                  the first block stands for its ``x_t`` columns)
``idlm_decode``                   ``idlm``: clean rows ``[P, P+V)``, noisy rows of the block
                                  at ``P+V``; clean columns ``[0, P+V)``, noisy block columns
``causal_decode``                 ``causal(L)``: rows ``[C, C+n)``, columns ``[0, C+n)``
``dflash_decode``                 ``dflash``: the rows of one block with anchor ``ctx_len``
================================  ==========================================================

Key order is always ``[cache | new tokens]`` and a new token's key index equals its stream
position, so position ids are ``arange(kv_len)`` for keys and the last ``q_len`` of them for
queries.
"""

from __future__ import annotations

import torch

from .causal import causal
from .checks import check_int, check_positive_int
from .core import Mask
from .dflash import dflash


def block_diffusion_decode(prefix_len: int, block_size: int, num_blocks: int = 1, *,
                           device=None) -> Mask:
    """BD3-LM / block-diffusion decode: ``num_blocks`` noisy blocks over a clean cache.

    Queries are the noisy tokens at stream positions ``[P, P + n*S)`` (``q_len = n*S``); keys are
    ``[clean cache (P) | the noisy tokens]``. A noisy token at position ``s`` (block
    ``s // S``) sees the whole cache and the noisy tokens of its own block; several blocks are
    denoised side by side, each seeing the whole cache plus itself, never each other.

    ``P`` need not be a multiple of ``S``: the first block is then the tail of the block
    containing ``P``, and its head ``[P // S * S, P)`` — tokens of the *same* block already
    committed and cached — stays visible. In training a noisy token sees its whole block in
    ``x_t`` (a committed token is an unmasked one there), so hiding the head would drop
    context the model was trained with; cache keys before the block are the clean tokens of
    earlier blocks, visible in training too. Every cache key is therefore visible to every row.

    Example, ``block_diffusion_decode(2, 2, 2)``::

        # # # # . .
        # # # # . .
        # # . . # #
        # # . . # #
    """
    P = check_int("prefix_len", prefix_len, minimum=0)
    S = check_positive_int("block_size", block_size)
    n = check_positive_int("num_blocks", num_blocks)
    Q = n * S

    def rule(b, q, kv):
        start = (P + q) // S * S
        own = (kv >= P) & (kv >= start) & (kv < start + S)
        return (q < Q) & (kv < P + Q) & ((kv < P) | own)

    def intervals():
        start = (P + torch.arange(Q, device=device)) // S * S
        lo = torch.stack([torch.zeros_like(start), start.clamp(min=P)], -1)
        hi = torch.stack([torch.full_like(start, P), (start + S).clamp(max=P + Q)], -1)
        return lo.unsqueeze(0), hi.unsqueeze(0)

    return Mask(rule, Q, P + Q, 1, intervals=intervals,
                name=f"block_diffusion_decode_{P}_{S}x{n}", device=device)


def idlm_decode(prefix_len: int, verify_len: int, block_size: int, *, device=None) -> Mask:
    """I-DLM introspective strided decoding (ISD): one forward verifies ``V`` speculative tokens
    and proposes the next block of ``N = block_size`` tokens.

    Queries ``[V clean tokens to verify | N noisy tokens]``; keys ``[cache (P) | the same]``. The
    verified tokens attend token-causally (the clean ``x_0`` rows of ``idlm``); the noisy block
    sees every clean token before it and is causal inside (the ``x_t`` rows of ``idlm`` for a
    block starting at ``P + V``). Together that is bottom-right causal attention over the
    ``P + V + N`` keys — I-DLM keeps strict causal attention, so the sampler needs no special
    kernel. Training blocks start at multiples of ``block_size``; ISD re-anchors the block grid
    at ``P + V`` each step, which the noisy block's view (all clean keys before it) does not
    depend on.
    """
    P = check_int("prefix_len", prefix_len, minimum=0)
    V = check_int("verify_len", verify_len, minimum=0)
    N = check_positive_int("block_size", block_size)
    return causal(V + N, P + V + N, align="bottom_right", device=device)


def causal_decode(cache_len: int, num_tokens: int, *, device=None) -> Mask:
    """KV-cached causal verification: ``num_tokens`` new queries over ``[cache | new]`` keys,
    each seeing the cache and the new tokens up to itself (the last rows of ``causal``)."""
    C = check_int("cache_len", cache_len, minimum=0)
    n = check_positive_int("num_tokens", num_tokens)
    return causal(n, C + n, offset=C, device=device)


def dflash_decode(ctx_len: int, block_size: int, causal: bool = False,
                  sliding_window: int | None = None, *, device=None) -> Mask:
    """DFlash drafting step: one block anchored right after the ``ctx_len`` accepted target
    states (the anchor token is the target's last correction token), keys ``[ctx | block]``.
    Equal to the rows of a ``dflash`` training block with anchor ``ctx_len``."""
    ctx_len = check_int("ctx_len", ctx_len, minimum=0)
    anchors = torch.tensor([[ctx_len]], device=device)
    return dflash(anchors, None, ctx_len, block_size, causal=causal,
                  sliding_window=sliding_window, device=device)


EXAMPLES = {
    "block_diffusion_decode": lambda seq_len, block_size: block_diffusion_decode(
        seq_len - 2 * block_size if seq_len > 2 * block_size else 0, block_size, 2),
    "idlm_decode": lambda seq_len, block_size: idlm_decode(
        max(0, seq_len - 2 * block_size), block_size, block_size),
    "causal_decode": lambda seq_len, block_size: causal_decode(
        max(0, seq_len - block_size), block_size),
    "dflash_decode": lambda seq_len, block_size: dflash_decode(seq_len, block_size),
}
