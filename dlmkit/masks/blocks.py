"""Direct FlexAttention ``BlockMask`` construction from a tile map.

``create_block_mask`` evaluates the whole Q x KV grid, and ``BlockMask.from_kv_blocks`` rebuilds
the Q-side lists by scattering the KV lists back into a dense matrix, transposing and argsorting.
We already hold the tile map, so both sides are produced here directly, each in O(tiles) with a
cumulative-sum placement (no sort).

The index layout matches ``create_block_mask`` exactly (``argsort(descending, stable)`` of the
0/1 tile row): the selected tiles in ascending order, then the unselected ones in ascending
order. Equal tensors, not just equal sets, make the result trivially comparable in tests.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch.nn.attention.flex_attention import BlockMask

from .threads import single_threaded
from .tiles import FULL, PARTIAL


def ordered_indices(selected: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Count and order the selected entries of each row of a bool tensor ``[..., n]``.

    Returns ``(num [...], indices [..., n])`` as int32, the selected positions first (ascending)
    followed by the rest (ascending).
    """
    n = selected.shape[-1]
    chosen = selected.to(torch.int32)
    num = chosen.sum(-1, dtype=torch.int32)
    rank = chosen.cumsum(-1, dtype=torch.int32)
    position = torch.arange(n, dtype=torch.int32, device=selected.device)
    slot = torch.where(selected, rank - 1, num.unsqueeze(-1) + position - rank)
    # Contiguous outputs even for a transposed ``selected`` (the Q-side lists): FlexAttention's
    # compiled backward reads the index lists as contiguous rows, and ``empty_like`` would copy
    # the transposed strides (equal values, wrong dK/dV on CUDA).
    indices = torch.empty(slot.shape, dtype=slot.dtype, device=slot.device)
    indices.scatter_(-1, slot.long(), position.expand_as(slot).contiguous())
    return num.contiguous(), indices


def block_mask_from_tiles(
    tiles: torch.Tensor,
    q_len: int,
    kv_len: int,
    block_size: tuple[int, int],
    mask_mod: Callable,
) -> BlockMask:
    """Build a ``BlockMask`` (KV- and Q-side lists) from a tile map ``[batch, n_q, n_kv]``
    (heads broadcast) or ``[batch, heads, n_q, n_kv]``."""
    if tiles.dim() == 3:
        tiles = tiles.unsqueeze(1)
    if tiles.dim() != 4:
        raise ValueError(f"tiles must be [batch, n_q, n_kv] or [batch, heads, n_q, n_kv], "
                         f"got shape {tuple(tiles.shape)}")
    with single_threaded():  # a few small ops per side: see threads.py
        partial, full = tiles == PARTIAL, tiles == FULL
        kv_num, kv_idx = ordered_indices(partial)
        full_kv_num, full_kv_idx = ordered_indices(full)
        q_num, q_idx = ordered_indices(partial.transpose(-2, -1))
        full_q_num, full_q_idx = ordered_indices(full.transpose(-2, -1))
    return BlockMask(
        (q_len, kv_len),
        kv_num, kv_idx, full_kv_num, full_kv_idx,
        q_num, q_idx, full_q_num, full_q_idx,
        BLOCK_SIZE=tuple(block_size),
        mask_mod=mask_mod,
    )
