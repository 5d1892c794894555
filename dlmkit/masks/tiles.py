"""Tile maps: which (query tile, key tile) pairs of a mask are empty, partial or full.

A tile map is an int8 tensor ``[batch, n_q_tiles, n_kv_tiles]`` holding ``EMPTY`` (0),
``PARTIAL`` (1) or ``FULL`` (2), with the exact semantics of ``create_block_mask``: the token
grid is padded with *blocked* entries up to a tile multiple, so a tile that contains padding is
never full.

Structured masks describe each query row as a short union of key intervals ("row intervals",
``lo``/``hi`` tensors ``[batch, q_len, K]``, half-open ``[lo, hi)``). From those the tile map
follows with integer arithmetic in O(q_len * K + tiles) time and memory — the Q x KV token grid
is never built. Rules without intervals fall back to evaluating one tile-row at a time
(memory O(q_block * kv_len)).
"""

from __future__ import annotations

from collections.abc import Callable

import torch

EMPTY, PARTIAL, FULL = 0, 1, 2

RowIntervals = tuple[torch.Tensor, torch.Tensor]


def cdiv(a: int, b: int) -> int:
    return -(-a // b)


def normalize_intervals(lo: torch.Tensor, hi: torch.Tensor, kv_len: int) -> RowIntervals:
    """Clip intervals to ``[0, kv_len)`` and merge overlapping or touching ones.

    The result keeps the input's shape ``[..., K]``; unused slots hold the empty interval
    ``[kv_len, kv_len)``. After normalisation a row's intervals are disjoint and separated by at
    least one blocked key, which is what makes the "fully covered tile" count exact.
    """
    lo = lo.clamp(0, kv_len)
    hi = hi.clamp(0, kv_len)
    empty = hi <= lo
    lo = torch.where(empty, kv_len, lo)
    hi = torch.where(empty, kv_len, hi)
    if lo.shape[-1] == 1:
        return lo, hi
    if lo.shape[-1] == 2:
        return _normalize_pair(lo, hi, kv_len)
    lo, order = lo.sort(dim=-1)
    hi = hi.gather(-1, order)
    reach = hi.cummax(dim=-1).values
    before = torch.cat([torch.full_like(reach[..., :1], -1), reach[..., :-1]], dim=-1)
    starts = lo > before  # strictly: an interval beginning where the last ended is merged
    start_lo = torch.where(starts, lo, -1).cummax(dim=-1).values
    is_end = torch.cat([starts[..., 1:], torch.ones_like(starts[..., :1])], dim=-1)
    return torch.where(is_end, start_lo, kv_len), torch.where(is_end, reach, kv_len)


def _normalize_pair(lo: torch.Tensor, hi: torch.Tensor, kv_len: int) -> RowIntervals:
    """The K == 2 case of :func:`normalize_intervals` without a sort (the common case)."""
    lo0, lo1, hi0, hi1 = lo[..., 0], lo[..., 1], hi[..., 0], hi[..., 1]
    swap = lo1 < lo0
    first_lo, second_lo = torch.where(swap, lo1, lo0), torch.where(swap, lo0, lo1)
    first_hi, second_hi = torch.where(swap, hi1, hi0), torch.where(swap, hi0, hi1)
    merge = second_lo <= first_hi
    first_hi = torch.where(merge, torch.maximum(first_hi, second_hi), first_hi)
    second_lo = torch.where(merge, kv_len, second_lo)
    second_hi = torch.where(merge, kv_len, second_hi)
    return torch.stack([first_lo, second_lo], -1), torch.stack([first_hi, second_hi], -1)


def intersect_intervals(a: RowIntervals, b: RowIntervals, kv_len: int) -> RowIntervals:
    """Pairwise intersection of two normalised interval unions (``K_a * K_b`` slots)."""
    (alo, ahi), (blo, bhi) = a, b
    lo = torch.maximum(alo.unsqueeze(-1), blo.unsqueeze(-2))
    hi = torch.minimum(ahi.unsqueeze(-1), bhi.unsqueeze(-2))
    lo, hi = torch.broadcast_tensors(lo, hi)
    return normalize_intervals(lo.flatten(-2), hi.flatten(-2), kv_len)


def union_intervals(a: RowIntervals, b: RowIntervals, kv_len: int) -> RowIntervals:
    (alo, ahi), (blo, bhi) = a, b
    batch = max(alo.shape[0], blo.shape[0])
    alo, ahi = (t.expand(batch, *t.shape[1:]) for t in (alo, ahi))
    blo, bhi = (t.expand(batch, *t.shape[1:]) for t in (blo, bhi))
    return normalize_intervals(torch.cat([alo, blo], -1), torch.cat([ahi, bhi], -1), kv_len)


def tile_map_from_intervals(
    lo: torch.Tensor, hi: torch.Tensor, q_len: int, kv_len: int, q_block: int, kv_block: int
) -> torch.Tensor:
    """Tile map from normalised row intervals ``[batch, q_len, K]``.

    For every row we add +1/-1 at the ends of the tile ranges its intervals touch and fully
    cover, summed per tile-row with one ``index_add_``; a cumulative sum along the key tiles then
    gives, per tile, how many of its rows touch it and how many cover it completely. A tile is
    full when all ``q_block`` rows cover it (a short last tile-row, i.e. padding, never is).
    """
    batch, rows, k = lo.shape
    if rows != q_len:
        raise ValueError(f"row intervals cover {rows} rows, expected q_len={q_len}")
    n_q, n_kv = cdiv(q_len, q_block), cdiv(kv_len, kv_block)
    device = lo.device
    nonempty = hi > lo
    touch_lo = torch.where(nonempty, lo // kv_block, 0)
    touch_hi = torch.where(nonempty, (hi + kv_block - 1) // kv_block, 0)
    full_lo = (lo + kv_block - 1) // kv_block
    full_hi = torch.maximum(hi // kv_block, full_lo)
    width = n_kv + 1
    # int32 indices: half the memory traffic of int64 and accepted by index_add_.
    tile_row = (torch.arange(q_len, device=device, dtype=torch.int32) // q_block).view(1, q_len, 1)
    base = (torch.arange(batch, device=device, dtype=torch.int32).view(batch, 1, 1) * n_q
            + tile_row) * width
    plane = batch * n_q * width  # the "full" counts live in a second plane of the buffer
    index = torch.cat([(base + t).reshape(-1) for t in
                       (touch_lo, touch_hi, full_lo + plane, full_hi + plane)]).to(torch.int32)
    one = torch.ones(batch * q_len * k, dtype=torch.int32, device=device)
    counts = torch.zeros(2 * plane, dtype=torch.int32, device=device)
    counts.index_add_(0, index, torch.cat([one, -one, one, -one]))
    counts = counts.view(2, batch, n_q, width).cumsum(-1, dtype=torch.int32)[..., :n_kv]
    tiles = (counts[0] > 0).to(torch.int8)
    tiles[counts[1] == q_block] = FULL
    return tiles


def tile_map_from_rule(
    rule: Callable, batch: int, q_len: int, kv_len: int, q_block: int, kv_block: int,
    device: torch.device,
) -> torch.Tensor:
    """Fallback for rules without row intervals: evaluate one tile-row at a time."""
    n_q, n_kv = cdiv(q_len, q_block), cdiv(kv_len, kv_block)
    tiles = torch.empty(batch, n_q, n_kv, dtype=torch.int8, device=device)
    b = torch.arange(batch, device=device).view(batch, 1, 1)
    kv = torch.arange(kv_len, device=device).view(1, 1, kv_len)
    pad = n_kv * kv_block - kv_len
    for i in range(n_q):
        q = torch.arange(i * q_block, min((i + 1) * q_block, q_len), device=device)
        allowed = rule(b, q.view(1, -1, 1), kv).expand(batch, q.numel(), kv_len)
        per_tile = torch.nn.functional.pad(allowed.to(torch.int32), (0, pad))
        per_tile = per_tile.view(batch, q.numel(), n_kv, kv_block).sum(dim=(1, 3))
        row = (per_tile > 0).to(torch.int8)
        row[per_tile == q_block * kv_block] = FULL
        tiles[:, i] = row
    return tiles
