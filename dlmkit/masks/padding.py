"""The padding convention shared by self-attention masks.

A self-attention layout holds ``copies`` concatenated copies of a stream of ``seq_len`` tokens
(1 for plain MDLM, 2 for ``[x_t | x_0]``), all padded the same way by ``valid [batch, seq_len]``
(1 = real token). Given the unpadded rule ``base(b, q, kv)``:

    attend(q, kv) = (base(q, kv) and valid(q) and valid(kv))  or  q == kv

Padded keys are blocked in every copy; a padded query row sees only its own diagonal, and a real
row keeps its diagonal too, so no row is ever fully blocked and eager softmax never gives NaN.
When every row's real tokens form one contiguous run (left or right padding, empty samples),
the same convention is applied to the row intervals; otherwise the mask falls back to rule
evaluation (still exact, just not O(tiles)).
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from .checks import check_valid, mask_device
from .core import Mask
from .tiles import RowIntervals, intersect_intervals, union_intervals


def valid_runs(valid: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor] | None:
    """``(start, end) [batch]`` of each row's single run of real tokens, or None if some row has
    holes. An all-padding row gives ``start == end == 0``."""
    seq_len = valid.shape[1]
    real = valid > 0
    count = real.sum(1)
    position = torch.arange(seq_len, device=valid.device)
    start = torch.where(real, position, seq_len).amin(1)
    end = torch.where(real, position + 1, 0).amax(1)
    start = torch.where(count > 0, start, 0)
    if bool(((end - start) != count).any()):
        return None
    return start, end


def padded_rule(base: Callable, valid: torch.Tensor, seq_len: int) -> Callable:
    """Apply the convention to a rule over ``copies * seq_len`` positions."""
    last = seq_len - 1

    def rule(b, q, kv):
        # Indices are clamped before indexing so kernels that probe tile padding beyond the
        # sequence never read out of bounds; those positions are never attended anyway.
        vq = valid[b, (q % seq_len).clamp(0, last)] > 0
        vk = valid[b, (kv % seq_len).clamp(0, last)] > 0
        return (base(b, q, kv) & vq & vk) | (q == kv)

    return rule


def padded_intervals(
    base: RowIntervals, valid: torch.Tensor, seq_len: int, copies: int
) -> RowIntervals | None:
    """Apply the convention to row intervals ``[batch or 1, copies * seq_len, K]``."""
    runs = valid_runs(valid)
    if runs is None:
        return None
    start, end = runs
    length = copies * seq_len
    batch = valid.shape[0]
    offsets = torch.arange(copies, device=valid.device) * seq_len
    key_lo = (start.view(batch, 1, 1) + offsets.view(1, 1, copies)).expand(batch, length, copies)
    key_hi = (end.view(batch, 1, 1) + offsets.view(1, 1, copies)).expand(batch, length, copies)
    lo, hi = intersect_intervals(base, (key_lo, key_hi), length)
    position = torch.arange(length, device=valid.device)
    local = (position % seq_len).view(1, length)
    real_row = ((local >= start.view(batch, 1)) & (local < end.view(batch, 1))).unsqueeze(-1)
    lo = torch.where(real_row, lo, length)
    hi = torch.where(real_row, hi, length)
    diagonal = (position.view(1, length, 1), (position + 1).view(1, length, 1))
    return union_intervals((lo, hi), diagonal, length)


def self_attention_mask(
    name: str,
    base_rule: Callable,
    base_intervals: Callable[[], RowIntervals],
    seq_len: int,
    copies: int,
    valid,
    device=None,
) -> Mask:
    """A ``Mask`` over ``copies * seq_len`` positions with the padding convention applied."""
    valid = check_valid(valid, seq_len)
    length = copies * seq_len
    if valid is None:
        return Mask(base_rule, length, length, 1, intervals=base_intervals, name=name,
                    device=device)
    device = mask_device(device, valid)
    valid = valid.to(device)
    intervals = None
    if valid_runs(valid) is not None:
        def intervals():
            return padded_intervals(base_intervals(), valid, seq_len, copies)
    return Mask(padded_rule(base_rule, valid, seq_len), length, length, valid.shape[0],
                intervals=intervals, name=name, device=device)
