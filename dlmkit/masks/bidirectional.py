"""Plain bidirectional attention over the real tokens of each row (MDLM / LLaDA / SCDD).

    bidirectional(4, valid=[[0, 1, 1, 1]])
    q0  # . . .      (a padded query sees only itself)
    q1  . # # #
    q2  . # # #
    q3  . # # #
"""

from __future__ import annotations

import torch

from .checks import check_positive_int, mask_device
from .core import Mask
from .padding import self_attention_mask


def bidirectional(seq_len: int, valid=None, *, device=None) -> Mask:
    """Every real token attends every real token; padding per :mod:`dlmkit.masks.padding`."""
    seq_len = check_positive_int("seq_len", seq_len)
    device = mask_device(device, valid)

    def rule(b, q, kv):
        return (q < seq_len) & (kv < seq_len)

    def intervals():
        q = torch.arange(seq_len, device=device).view(1, seq_len, 1)
        return torch.zeros_like(q), torch.full_like(q, seq_len)

    return self_attention_mask(f"bidirectional_{seq_len}", rule, intervals, seq_len, 1, valid,
                               device)


EXAMPLES = {"bidirectional": lambda seq_len, block_size: bidirectional(seq_len)}
