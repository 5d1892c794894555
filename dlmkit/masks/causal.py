"""Causal attention, top-left or bottom-right aligned.

    causal(4, 6)                        causal(4, 6, align="bottom_right")
    q0  # . . . . .                     q0  # # # . . .
    q1  # # . . . .                     q1  # # # # . .
    q2  # # # . . .                     q2  # # # # # .
    q3  # # # # . .                     q3  # # # # # #

Query ``q`` sees keys ``0 .. q + offset`` (inclusive). ``align="bottom_right"`` adds
``kv_len - q_len`` to the offset, so the last query sees the last key: the layout of decoding
``q_len`` new tokens against a KV cache of ``kv_len - q_len`` earlier ones.
"""

from __future__ import annotations

import torch

from .checks import check_int, check_positive_int, mask_device
from .core import Mask
from .padding import self_attention_mask

ALIGNMENTS = ("top_left", "bottom_right")


def causal(q_len: int, kv_len: int | None = None, offset: int = 0, *,
           align: str = "top_left", device=None) -> Mask:
    """Causal mask ``[1, 1, q_len, kv_len]``: attend iff ``kv <= q + offset (+ kv_len - q_len)``.

    Args:
        q_len: number of queries (> 0).
        kv_len: number of keys (> 0); defaults to ``q_len``.
        offset: extra keys every query may see (>= 0 after alignment, so no row is empty).
        align: ``"top_left"`` (query 0 sees key ``offset``) or ``"bottom_right"``.
    """
    q_len = check_positive_int("q_len", q_len)
    kv_len = q_len if kv_len is None else check_positive_int("kv_len", kv_len)
    offset = check_int("offset", offset)
    if align not in ALIGNMENTS:
        raise ValueError(f"align must be one of {ALIGNMENTS}, got {align!r}")
    shift = offset + (kv_len - q_len if align == "bottom_right" else 0)
    if shift < 0:
        raise ValueError(
            f"causal: offset={offset} with align={align!r}, q_len={q_len}, kv_len={kv_len} "
            f"leaves query 0 with no key to attend (effective offset {shift} must be >= 0)"
        )

    def rule(b, q, kv):
        return kv <= q + shift

    def intervals():
        q = torch.arange(q_len, device=device).view(1, q_len, 1)
        return torch.zeros_like(q), q + shift + 1

    return Mask(rule, q_len, kv_len, 1, intervals=intervals,
                name=f"causal_{q_len}x{kv_len}_{shift}", device=device)


def padded_causal(seq_len: int, valid=None, *, device=None) -> Mask:
    """Causal self-attention over the real tokens of each row (autoregressive SFT): ``kv <= q``
    with padding per :mod:`dlmkit.masks.padding` (padded keys blocked, every row keeps its
    diagonal), ``[batch or 1, 1, seq_len, seq_len]``."""
    seq_len = check_positive_int("seq_len", seq_len)
    device = mask_device(device, valid)

    def rule(b, q, kv):
        return kv <= q

    def intervals():
        q = torch.arange(seq_len, device=device).view(1, seq_len, 1)
        return torch.zeros_like(q), q + 1

    return self_attention_mask(f"padded_causal_{seq_len}", rule, intervals, seq_len, 1, valid,
                               device)


EXAMPLES = {
    "causal": lambda seq_len, block_size: causal(seq_len),
    "causal_bottom_right": lambda seq_len, block_size: causal(
        max(1, seq_len // 2), seq_len, align="bottom_right"),
}
