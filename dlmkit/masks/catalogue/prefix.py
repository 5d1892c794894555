"""Prefix-LM: a bidirectional prefix followed by causal continuation.

    prefix_lm(6, 3)
    q0  # # # . . .
    q1  # # # . . .
    q2  # # # . . .
    q3  # # # # . .
    q4  # # # # # .
    q5  # # # # # #

Attend iff ``kv < prefix_length`` or ``kv <= q`` (strictly ``kv < P``: the prefix is keys
``0 .. P - 1``). Prefix rows see the whole prefix; later rows are causal and see the prefix.
"""

from __future__ import annotations

import torch

from ..checks import check_int, check_positive_int
from ..core import Mask


def _check_prefix(prefix_length, seq_len: int) -> tuple[torch.Tensor | None, int | None]:
    """An int (one prefix for every row) or an int tensor ``[batch]`` (one per row)."""
    if isinstance(prefix_length, torch.Tensor) and prefix_length.dim() > 0:
        if prefix_length.dim() != 1 or prefix_length.numel() < 1:
            raise ValueError(f"prefix_length must be an int or a 1-D int tensor [batch], "
                             f"got shape {tuple(prefix_length.shape)}")
        if prefix_length.is_floating_point() or prefix_length.dtype == torch.bool:
            raise TypeError(f"prefix_length must hold integers, got dtype {prefix_length.dtype}")
        lo, hi = int(prefix_length.min()), int(prefix_length.max())
        if lo < 0 or hi > seq_len:
            raise ValueError(f"prefix_length must be in [0, seq_len={seq_len}], "
                             f"got values in [{lo}, {hi}]")
        return prefix_length.to(torch.int64), None
    value = check_int("prefix_length", prefix_length, minimum=0)
    if value > seq_len:
        raise ValueError(f"prefix_length must be in [0, seq_len={seq_len}], got {value}")
    return None, value


def prefix_lm(seq_len: int, prefix_length, *, device=None) -> Mask:
    """Prefix-LM mask ``[batch, 1, seq_len, seq_len]``: attend iff ``kv < P`` or ``kv <= q``.

    Args:
        seq_len: queries = keys (> 0).
        prefix_length: ``P`` in ``[0, seq_len]``: an int, or an int tensor ``[batch]`` with one
            prefix length per batch row (e.g. prompt lengths of right-padded SFT samples).
            ``P = 0`` gives plain causal attention.
    """
    seq_len = check_positive_int("seq_len", seq_len)
    per_row, P = _check_prefix(prefix_length, seq_len)
    if per_row is None:
        def rule(b, q, kv):
            return (kv < P) | (kv <= q)

        def intervals():
            q = torch.arange(seq_len, device=device).view(1, seq_len, 1)
            return torch.zeros_like(q), (q + 1).clamp(min=P)

        return Mask(rule, seq_len, seq_len, 1, intervals=intervals,
                    name=f"prefix_lm_{P}", device=device)

    device = per_row.device if device is None else torch.device(device)
    lengths = per_row.to(device)
    batch = lengths.shape[0]

    def rule(b, q, kv):
        return (kv < lengths[b]) | (kv <= q)

    def intervals():
        q = torch.arange(seq_len, device=device).view(1, seq_len, 1)
        hi = torch.maximum(q + 1, lengths.view(batch, 1, 1))
        return torch.zeros_like(hi), hi

    return Mask(rule, seq_len, seq_len, batch, intervals=intervals,
                name="prefix_lm_per_row", device=device)


EXAMPLES = {
    "prefix_lm": lambda seq_len, block_size: prefix_lm(seq_len, seq_len // 3),
}
