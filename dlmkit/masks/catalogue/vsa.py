"""Video Sparse Attention (VSA): tiled layout, coarse stage, top-k tile selection, block masks.

VSA works on a video latent grid ``(T, H, W)`` cut into tiles of ``tile_twh`` voxels
(``tile_numel = prod(tile_twh)`` tokens each). The pipeline:

1. :func:`create_vsa_tile_metadata` pads the grid to whole tiles and orders tokens tile-major
   (tile grid t-major, then h, then w); inside a tile the *real* voxels come first, row-major
   over the tile's real extent, and padding takes the tail slots. ``variable_block_sizes``
   holds each tile's real-token count. :func:`tile_vsa_sequence` / :func:`untile_vsa_sequence`
   move a sequence between the original and the tiled layout.
2. Coarse stage: :func:`pool_to_vsa_tiles` averages each tile (real tokens only),
   :func:`compute_vsa_tile_scores` scores query tiles against key tiles,
   :func:`compute_vsa_topk_indices` keeps the ``top_k`` best key tiles per query tile and
   :func:`compute_vsa_coarse_attention` also returns the tile-level attention output and LSE.
   :func:`vsa_topk_from_sparsity` turns a sparsity target into ``top_k``.
3. Fine stage: attention restricted to the selected tiles, through
   :func:`create_vsa_block_mask` (block = tile) or :func:`create_vsa_flash_block_mask` (KV
   sub-blocks of ``kv_block_size``, the shape FlexAttention's FLASH/FA4 backend needs), both
   built directly from the selection in O(tiles); :func:`vsa` is the same pattern as a
   :class:`Mask` (dense / additive forms, any block size).
4. :func:`lift_vsa_tile_output`, :func:`vsa_additive_combine`, :func:`vsa_gated_mix` merge the
   coarse output back into the fine one.

Unlike attention-gym's fast path, the block-mask constructors validate the selection (tile ids
out of ``[0, num_kv_tiles)`` and duplicate ids in one row raise ``ValueError``) and attach the
whole pattern as mask_mod, so the BlockMask is also right in eager FlexAttention, which ignores
the block lists.

Sequences are ``[..., seq, dim]`` (FlexAttention's ``[batch, heads, seq, dim]``); the
``dim`` argument of tile/untile selects another sequence axis.
"""

from __future__ import annotations

import math
import numbers
from dataclasses import dataclass

import torch
from torch.nn.attention.flex_attention import BlockMask

from ..blocks import block_mask_from_tiles
from ..checks import check_int, check_positive_int
from ..core import Mask
from ..tiles import FULL, PARTIAL

# ---------------------------------------------------------------------------- metadata


@dataclass(frozen=True)
class VSATileMetadata:
    """Layout of a ``(T, H, W)`` latent grid in VSA's padded, tile-major order.

    Attributes:
        dit_seq_shape: the latent grid ``(T, H, W)``.
        tile_twh: tile shape.
        num_tiles_twh: tiles per axis (``ceil(grid / tile)``).
        num_tiles: total number of tiles.
        tile_numel: tokens per tile (``prod(tile_twh)``).
        seq_len: real tokens ``T * H * W``.
        padded_seq_len: ``num_tiles * tile_numel``.
        tile_index: ``[seq_len]``; ``x[..., tile_index, :]`` lists the real tokens in tiled
            order (the gather permutation).
        reverse_tile_index: ``[seq_len]``, inverse permutation of ``tile_index``.
        variable_block_sizes: ``[num_tiles]`` real tokens per tile.
        non_pad_index: ``[seq_len]`` ascending positions of the real tokens in the padded tiled
            sequence.
        untile_index: ``[seq_len]``; position in the padded tiled sequence of each original
            token (``tiled[..., untile_index, :]`` restores the original order).
    """

    dit_seq_shape: tuple[int, int, int]
    tile_twh: tuple[int, int, int]
    num_tiles_twh: tuple[int, int, int]
    num_tiles: int
    tile_numel: int
    seq_len: int
    padded_seq_len: int
    tile_index: torch.Tensor
    reverse_tile_index: torch.Tensor
    variable_block_sizes: torch.Tensor
    non_pad_index: torch.Tensor
    untile_index: torch.Tensor


def _check_triple(name: str, value) -> tuple[int, int, int]:
    if isinstance(value, torch.Size):
        value = tuple(value)
    if not isinstance(value, (tuple, list)):
        raise TypeError(f"{name} must be a (t, h, w) tuple of ints, got "
                        f"{type(value).__name__} {value!r}")
    if len(value) != 3:
        raise ValueError(f"{name} must have 3 entries (t, h, w), got {len(value)}: {value!r}")
    return tuple(check_positive_int(f"{name}[{i}]", v) for i, v in enumerate(value))


def create_vsa_tile_metadata(dit_seq_shape, tile_twh=(4, 4, 4), device=None) -> VSATileMetadata:
    """Tile metadata for a latent grid ``dit_seq_shape = (T, H, W)``.

    Example: grid ``(1, 2, 3)``, tiles ``(1, 2, 2)`` -> 2 tiles of 4 slots; the second tile has
    only one real column, so its real tokens are compacted to its first two slots::

        grid (h, w)        tiled sequence (8 slots)
        0 1 | 2            tile 0: 0 1 3 4      tile 1: 2 5 _ _
        3 4 | 5            variable_block_sizes = [4, 2]
    """
    shape = _check_triple("dit_seq_shape", dit_seq_shape)
    tile = _check_triple("tile_twh", tile_twh)
    counts = tuple(-(-s // t) for s, t in zip(shape, tile))
    numel = math.prod(tile)
    n_tiles = math.prod(counts)
    T, H, W = shape
    t = torch.arange(T, device=device).view(T, 1, 1)
    h = torch.arange(H, device=device).view(1, H, 1)
    w = torch.arange(W, device=device).view(1, 1, W)
    tile_id = ((t // tile[0]) * counts[1] + h // tile[1]) * counts[2] + w // tile[2]
    # Real extent of each voxel's tile along every axis (the last tile gets the remainder).
    ext = [(torch.clamp(size - (c // sz) * sz, max=sz))
           for c, size, sz in ((t, T, tile[0]), (h, H, tile[1]), (w, W, tile[2]))]
    slot = ((t % tile[0]) * ext[1] + h % tile[1]) * ext[2] + w % tile[2]
    position = (tile_id * numel + slot).reshape(-1)  # padded position of each original token
    non_pad, order = position.sort()
    reverse = torch.empty_like(order)
    reverse[order] = torch.arange(order.numel(), device=device)
    per_axis = [torch.clamp(size - torch.arange(n, device=device) * sz, max=sz)
                for size, n, sz in zip(shape, counts, tile)]
    sizes = (per_axis[0].view(-1, 1, 1) * per_axis[1].view(1, -1, 1)
             * per_axis[2].view(1, 1, -1)).reshape(-1)
    return VSATileMetadata(
        dit_seq_shape=shape, tile_twh=tile, num_tiles_twh=counts, num_tiles=n_tiles,
        tile_numel=numel, seq_len=T * H * W, padded_seq_len=n_tiles * numel,
        tile_index=order, reverse_tile_index=reverse, variable_block_sizes=sizes,
        non_pad_index=non_pad, untile_index=position,
    )


def _check_metadata(metadata) -> VSATileMetadata:
    if not isinstance(metadata, VSATileMetadata):
        raise TypeError(f"metadata must be a VSATileMetadata (from create_vsa_tile_metadata), "
                        f"got {type(metadata).__name__}")
    return metadata


def _check_seq(name: str, x, length: int, dim: int) -> None:
    if not isinstance(x, torch.Tensor):
        raise TypeError(f"{name} must be a torch.Tensor, got {type(x).__name__}")
    if x.dim() == 0 or not -x.dim() <= dim < x.dim():
        raise ValueError(f"dim={dim} is out of range for {name} of shape {tuple(x.shape)}")
    if x.shape[dim] != length:
        raise ValueError(f"{name}.shape[{dim}] must be {length}, got shape {tuple(x.shape)}")


def tile_vsa_sequence(x: torch.Tensor, metadata: VSATileMetadata, dim: int = -2) -> torch.Tensor:
    """Original order (``seq_len`` along ``dim``) -> padded tiled order (``padded_seq_len``);
    padding slots are zero."""
    metadata = _check_metadata(metadata)
    _check_seq("x", x, metadata.seq_len, dim)
    shape = list(x.shape)
    shape[dim] = metadata.padded_seq_len
    out = x.new_zeros(shape)
    return out.index_copy_(dim, metadata.untile_index.to(x.device), x)


def untile_vsa_sequence(x: torch.Tensor, metadata: VSATileMetadata, dim: int = -2) -> torch.Tensor:
    """Padded tiled order -> original order (drops the padding); inverse of
    :func:`tile_vsa_sequence`."""
    metadata = _check_metadata(metadata)
    _check_seq("x", x, metadata.padded_seq_len, dim)
    return x.index_select(dim, metadata.untile_index.to(x.device))


# ---------------------------------------------------------------------------- coarse stage


def _check_sizes(name: str, sizes, num_tiles: int, tile_numel: int, device) -> torch.Tensor | None:
    """Validate ``variable_block_sizes``: integer ``[num_tiles]`` in ``[1, tile_numel]``."""
    if sizes is None:
        return None
    if not isinstance(sizes, torch.Tensor):
        raise TypeError(f"{name} must be an integer torch.Tensor of shape [{num_tiles}], got "
                        f"{type(sizes).__name__}")
    if sizes.is_floating_point() or sizes.is_complex() or sizes.dtype == torch.bool:
        raise TypeError(f"{name} must hold integers, got dtype {sizes.dtype}")
    if tuple(sizes.shape) != (num_tiles,):
        raise ValueError(f"{name} must have shape [{num_tiles}] (one count per tile), got "
                         f"{tuple(sizes.shape)}")
    lo, hi = int(sizes.min()), int(sizes.max())
    if lo < 1 or hi > tile_numel:
        raise ValueError(f"{name} must be in [1, tile_numel={tile_numel}], got values in "
                         f"[{lo}, {hi}]")
    return sizes.to(device=device, dtype=torch.long)


def _check_tokens(name: str, x, tile_numel: int) -> int:
    if not isinstance(x, torch.Tensor):
        raise TypeError(f"{name} must be a torch.Tensor [..., seq, dim], got {type(x).__name__}")
    if x.dim() < 2:
        raise ValueError(f"{name} must have shape [..., seq, dim], got {tuple(x.shape)}")
    if x.shape[-2] % tile_numel:
        raise ValueError(f"{name}.shape[-2]={x.shape[-2]} must be a multiple of "
                         f"tile_numel={tile_numel} (use tile_vsa_sequence to pad)")
    return x.shape[-2] // tile_numel


def pool_to_vsa_tiles(x: torch.Tensor, tile_numel: int,
                      variable_block_sizes: torch.Tensor | None = None) -> torch.Tensor:
    """Mean of every run of ``tile_numel`` tokens: ``[..., n * tile_numel, D] -> [..., n, D]``.

    With ``variable_block_sizes`` only the first ``sizes[i]`` slots of tile ``i`` (its real
    tokens) count, whatever the padding slots hold; the sum is taken in float32 and the
    result cast back to ``x.dtype``.
    """
    tile_numel = check_positive_int("tile_numel", tile_numel)
    n = _check_tokens("x", x, tile_numel)
    sizes = _check_sizes("variable_block_sizes", variable_block_sizes, n, tile_numel, x.device)
    tiles = x.reshape(*x.shape[:-2], n, tile_numel, x.shape[-1])
    if sizes is None:
        return tiles.mean(-2)
    real = torch.arange(tile_numel, device=x.device) < sizes.unsqueeze(-1)  # [n, T]
    total = (tiles.float() * real.unsqueeze(-1)).sum(-2)
    return (total / sizes.unsqueeze(-1).float()).to(x.dtype)


def _scale(scale, dim: int) -> float:
    if scale is None:
        return 1.0 / math.sqrt(dim)
    if isinstance(scale, bool) or not isinstance(scale, numbers.Real):
        raise TypeError(f"scale must be a real number or None, got {type(scale).__name__}")
    return float(scale)


def compute_vsa_tile_scores(q: torch.Tensor, k: torch.Tensor, tile_numel: int, scale=None,
                            q_variable_block_sizes=None,
                            kv_variable_block_sizes=None) -> torch.Tensor:
    """``pool(q) @ pool(k)^T * scale`` (default ``1/sqrt(D)``): float32 ``[..., QT, NT]``."""
    tile_numel = check_positive_int("tile_numel", tile_numel)
    pq = pool_to_vsa_tiles(q, tile_numel, q_variable_block_sizes)
    pk = pool_to_vsa_tiles(k, tile_numel, kv_variable_block_sizes)
    if pq.shape[-1] != pk.shape[-1]:
        raise ValueError(f"q and k must have the same head dim, got {q.shape[-1]} and "
                         f"{k.shape[-1]}")
    return (pq.float() @ pk.float().transpose(-1, -2)) * _scale(scale, q.shape[-1])


def _topk_from_scores(scores: torch.Tensor, top_k: int, sort_indices: bool,
                      include_self: bool) -> torch.Tensor:
    qt, nt = scores.shape[-2:]
    top_k = check_int("top_k", top_k, minimum=1)
    if top_k > nt:
        raise ValueError(f"top_k must be in [1, num_kv_tiles={nt}], got {top_k}")
    if not isinstance(include_self, bool) or not isinstance(sort_indices, bool):
        raise TypeError("include_self and sort_indices must be bools")
    if include_self and qt > nt:
        raise ValueError(f"include_self=True needs num_q_tiles <= num_kv_tiles, got {qt} > {nt}")
    picks = scores.topk(top_k, dim=-1).indices  # best first
    if include_self:
        own = torch.arange(qt, device=scores.device).unsqueeze(-1)
        present = (picks == own).any(-1)
        last = torch.where(present, picks[..., -1], own.squeeze(-1))
        picks = torch.cat([picks[..., :-1], last.unsqueeze(-1)], -1)
    if sort_indices:
        picks = picks.sort(-1).values
    return picks.to(torch.int32)


def compute_vsa_topk_indices(q, k, tile_numel: int, top_k: int, scale=None, *,
                             sort_indices: bool = True, include_self: bool = False,
                             q_variable_block_sizes=None,
                             kv_variable_block_sizes=None) -> torch.Tensor:
    """The ``top_k`` highest-scoring KV tiles of every query tile: int32 ``[..., QT, top_k]``.

    ``include_self`` puts the query tile's own id (same index) in place of the lowest-scoring
    pick when it was not selected (needs ``QT <= NT``). ``sort_indices`` returns ids ascending,
    otherwise best first (the own id, if forced, last).
    """
    scores = compute_vsa_tile_scores(q, k, tile_numel, scale, q_variable_block_sizes,
                                     kv_variable_block_sizes)
    return _topk_from_scores(scores, top_k, sort_indices, include_self)


@dataclass(frozen=True)
class VSACoarseResult:
    """``topk_indices`` int32 ``[..., QT, top_k]``; ``output`` ``[..., QT, D]`` (dtype of v);
    ``lse`` float32 ``[..., QT]`` (natural log)."""

    topk_indices: torch.Tensor
    output: torch.Tensor
    lse: torch.Tensor


def compute_vsa_coarse_attention(q, k, v, tile_numel: int, top_k: int, scale=None, *,
                                 sort_indices: bool = True, include_self: bool = False,
                                 q_variable_block_sizes=None,
                                 kv_variable_block_sizes=None) -> VSACoarseResult:
    """Coarse stage: dense attention of pooled query tiles over all pooled KV tiles
    (``softmax(scores) @ pool(v)``, ``lse = logsumexp(scores)``) plus the top-k selection."""
    scores = compute_vsa_tile_scores(q, k, tile_numel, scale, q_variable_block_sizes,
                                     kv_variable_block_sizes)
    topk = _topk_from_scores(scores, top_k, sort_indices, include_self)
    pv = pool_to_vsa_tiles(v, tile_numel, kv_variable_block_sizes)
    if pv.shape[-2] != scores.shape[-1]:
        raise ValueError(f"v must have as many tiles as k ({scores.shape[-1]}), got "
                         f"{pv.shape[-2]}")
    output = (torch.softmax(scores, -1) @ pv.float()).to(v.dtype)
    return VSACoarseResult(topk, output, torch.logsumexp(scores, -1))


def vsa_topk_from_sparsity(seq_len: int, tile_numel: int, num_kv_tiles: int,
                           sparsity: float) -> int:
    """``min(num_kv_tiles, max(1, ceil((1 - sparsity) * seq_len / tile_numel)))``."""
    seq_len = check_positive_int("seq_len", seq_len)
    tile_numel = check_positive_int("tile_numel", tile_numel)
    num_kv_tiles = check_positive_int("num_kv_tiles", num_kv_tiles)
    if isinstance(sparsity, bool) or not isinstance(sparsity, numbers.Real):
        raise TypeError(f"sparsity must be a number in [0, 1], got {type(sparsity).__name__}")
    if not 0.0 <= float(sparsity) <= 1.0:
        raise ValueError(f"sparsity must be in [0, 1], got {sparsity}")
    keep = math.ceil((1.0 - float(sparsity)) * seq_len / tile_numel)
    return min(num_kv_tiles, max(1, keep))


# ---------------------------------------------------------------------------- combine


def lift_vsa_tile_output(tile_output: torch.Tensor, tile_numel: int,
                         seq_len: int | None = None) -> torch.Tensor:
    """Repeat each tile's row ``tile_numel`` times: ``[..., n, D] -> [..., n * tile_numel, D]``,
    optionally truncated to ``seq_len`` tokens."""
    tile_numel = check_positive_int("tile_numel", tile_numel)
    if not isinstance(tile_output, torch.Tensor) or tile_output.dim() < 2:
        raise ValueError("tile_output must be a tensor [..., num_tiles, dim]")
    full = tile_output.shape[-2] * tile_numel
    out = tile_output.repeat_interleave(tile_numel, dim=-2)
    if seq_len is None:
        return out
    seq_len = check_int("seq_len", seq_len, minimum=0)
    if seq_len > full:
        raise ValueError(f"seq_len must be <= num_tiles * tile_numel = {full}, got {seq_len}")
    return out[..., :seq_len, :]


def vsa_additive_combine(fine: torch.Tensor, coarse: torch.Tensor, weight,
                         tile_numel: int) -> torch.Tensor:
    """``fine + weight * lift(coarse)`` (the FastVideo VSA wrapper's combination)."""
    return fine + weight * lift_vsa_tile_output(coarse, tile_numel, fine.shape[-2])


def vsa_gated_mix(fine: torch.Tensor, coarse: torch.Tensor, gate,
                  tile_numel: int) -> torch.Tensor:
    """``gate * fine + (1 - gate) * lift(coarse)``. A convex mix, *not* an LSE-correct merge of
    two attention results (use ``merge_attention`` for that)."""
    return gate * fine + (1 - gate) * lift_vsa_tile_output(coarse, tile_numel, fine.shape[-2])


# ---------------------------------------------------------------------------- block masks


def _check_topk(topk, num_kv_tiles: int, name: str = "topk_indices") -> torch.Tensor:
    """Integer ids in ``[0, num_kv_tiles)``, no duplicate within a row, ``1 <= K <= NT``."""
    if not isinstance(topk, torch.Tensor):
        raise TypeError(f"{name} must be an integer torch.Tensor, got {type(topk).__name__}")
    if topk.is_floating_point() or topk.is_complex() or topk.dtype == torch.bool:
        raise TypeError(f"{name} must hold integer tile ids, got dtype {topk.dtype}")
    k = topk.shape[-1] if topk.dim() else 0
    if not 1 <= k <= num_kv_tiles:
        raise ValueError(f"{name}.shape[-1] (tiles per query tile) must be in "
                         f"[1, num_kv_tiles={num_kv_tiles}], got shape {tuple(topk.shape)}")
    if topk.numel() == 0:
        raise ValueError(f"{name} must not be empty, got shape {tuple(topk.shape)}")
    lo, hi = int(topk.min()), int(topk.max())
    if lo < 0 or hi >= num_kv_tiles:
        bad = ((topk < 0) | (topk >= num_kv_tiles)).nonzero()[0].tolist()
        raise ValueError(f"{name} must be in [0, num_kv_tiles={num_kv_tiles}), got "
                         f"{int(topk[tuple(bad)])} at {bad}")
    ids = topk.long().sort(-1).values
    dup = ids[..., 1:] == ids[..., :-1]
    if bool(dup.any()):
        where = dup.nonzero()[0].tolist()
        raise ValueError(f"{name} has a duplicate tile id {int(ids[tuple(where)])} in row "
                         f"{where[:-1]}; each query tile must select distinct KV tiles")
    return topk.long()


def _pattern_mod(selected: torch.Tensor, counts: torch.Tensor, tile_numel: int):
    """mask_mod of the direct block masks: the whole pattern, i.e. a lookup in the int8
    selection table ``[B, H, QT, NT]`` and the padding test ``kv % T < counts[kv // T]``.

    Fused kernels evaluate it only on *partial* blocks (padding tiles), where membership is
    already known to hold, so it costs nothing without padding; but eager FlexAttention (the
    CPU "math" path) ignores the block lists and applies only the mask_mod, so a padding-only
    predicate (attention-gym's choice) would silently attend to every tile there.
    """
    B, H, QT, NT = selected.shape
    T = tile_numel
    q_len, kv_len = QT * T, NT * T

    def vsa_mask_mod(b, h, q_idx, kv_idx):
        qi = (q_idx // T).clamp(0, QT - 1)
        ki = (kv_idx // T).clamp(0, NT - 1)
        chosen = selected[b.clamp(0, B - 1), h.clamp(0, H - 1), qi, ki] > 0
        inside = (q_idx < q_len) & (kv_idx < kv_len)
        return inside & chosen & (kv_idx - ki * T < counts[ki])

    return vsa_mask_mod


def _counts(sizes, num_kv_tiles: int, tile_numel: int, device) -> torch.Tensor:
    if sizes is not None:
        return sizes
    return torch.full((num_kv_tiles,), tile_numel, dtype=torch.long, device=device)


def _selection(topk: torch.Tensor, num_kv_tiles: int) -> torch.Tensor:
    """int8 ``[..., QT, NT]``: 1 where a KV tile is selected."""
    selected = torch.zeros(*topk.shape[:-1], num_kv_tiles, dtype=torch.int8, device=topk.device)
    return selected.scatter_(-1, topk, 1)


def _check_4d(topk) -> None:
    if isinstance(topk, torch.Tensor) and topk.dim() != 4:
        raise ValueError(f"topk_indices must be 4-D [batch, heads, q_tiles, top_k], got shape "
                         f"{tuple(topk.shape)}")


def create_vsa_block_mask(topk_indices: torch.Tensor, tile_numel: int, num_kv_tiles: int,
                          variable_block_sizes: torch.Tensor | None = None) -> BlockMask:
    """BlockMask (block = tile, ``BLOCK_SIZE = (tile_numel, tile_numel)``) in which query tile
    ``i`` of ``(b, h)`` attends to the KV tiles ``topk_indices[b, h, i, :]``.

    ``topk_indices``: integer ``[B, H, QT, K]``, ids in ``[0, num_kv_tiles)``, distinct per
    row (checked). Sequence lengths ``(QT * tile_numel, num_kv_tiles * tile_numel)``.
    Without ``variable_block_sizes`` every selected tile is a *full* block; with them (real
    tokens per KV tile, ``[num_kv_tiles]`` in ``[1, tile_numel]``) a tile with padding is
    *partial*. All eight index lists (KV and Q side) are built from the ``[B, H, QT, NT]`` tile
    map and equal ``create_block_mask`` on the same pattern. The mask_mod is the whole pattern
    (selection-table lookup and padding test), not attention-gym's padding-only predicate:
    fused kernels only run it on partial blocks, and eager FlexAttention, which ignores the
    block lists, stays correct.
    """
    _check_4d(topk_indices)
    tile_numel = check_positive_int("tile_numel", tile_numel)
    num_kv_tiles = check_positive_int("num_kv_tiles", num_kv_tiles)
    topk = _check_topk(topk_indices, num_kv_tiles)
    device = topk.device
    sizes = _check_sizes("variable_block_sizes", variable_block_sizes, num_kv_tiles,
                         tile_numel, device)
    B, H, QT, _ = topk.shape
    counts = _counts(sizes, num_kv_tiles, tile_numel, device)
    kind = torch.where(counts < tile_numel, PARTIAL, FULL).to(torch.int8)
    selected = _selection(topk, num_kv_tiles)
    tiles = selected * kind
    return block_mask_from_tiles(
        tiles, QT * tile_numel, num_kv_tiles * tile_numel, (tile_numel, tile_numel),
        _pattern_mod(selected, counts, tile_numel))


def create_vsa_flash_block_mask(topk_indices: torch.Tensor, tile_numel: int, num_kv_tiles: int,
                                kv_block_size: int = 128,
                                variable_block_sizes: torch.Tensor | None = None) -> BlockMask:
    """VSA BlockMask shaped for FlexAttention's FLASH (FA4) backend: ``BLOCK_SIZE =
    (tile_numel, kv_block_size)``; each KV tile is split into ``f = tile_numel / kv_block_size``
    sub-blocks (``kv_block_size`` must divide ``tile_numel``).

    For a selected tile ``t`` and sub-block ``j`` (KV block ``t * f + j``), with ``n =
    variable_block_sizes[t]`` (default ``tile_numel``): *full* if ``n >= (j + 1) *
    kv_block_size``, *partial* if ``j * kv_block_size < n`` otherwise, and dropped when it holds
    only padding. Lists are ``[B, H, QT, NT * f]``; the mask_mod is the whole pattern
    (as in :func:`create_vsa_block_mask`).

    Example, ``tile_numel=4, kv_block_size=2`` (``f = 2``), tile 1 selected with 3 real tokens::

        KV blocks   t0.0 t0.1 t1.0 t1.1 ...
                     .    .   full part
    """
    _check_4d(topk_indices)
    tile_numel = check_positive_int("tile_numel", tile_numel)
    num_kv_tiles = check_positive_int("num_kv_tiles", num_kv_tiles)
    kv_block_size = check_positive_int("kv_block_size", kv_block_size)
    if tile_numel % kv_block_size:
        raise ValueError(f"kv_block_size={kv_block_size} must divide tile_numel={tile_numel}")
    topk = _check_topk(topk_indices, num_kv_tiles)
    device = topk.device
    sizes = _check_sizes("variable_block_sizes", variable_block_sizes, num_kv_tiles,
                         tile_numel, device)
    f = tile_numel // kv_block_size
    counts = _counts(sizes, num_kv_tiles, tile_numel, device)
    start = torch.arange(f, device=device) * kv_block_size  # [f]
    real = counts.unsqueeze(-1) - start  # real tokens in each sub-block (may be <= 0)
    kind = torch.where(real >= kv_block_size, FULL, torch.where(real > 0, PARTIAL, 0))
    B, H, QT, _ = topk.shape
    selected = _selection(topk, num_kv_tiles)
    tiles = (selected.unsqueeze(-1) * kind.to(torch.int8)).view(B, H, QT, num_kv_tiles * f)
    return block_mask_from_tiles(
        tiles, QT * tile_numel, num_kv_tiles * tile_numel, (tile_numel, kv_block_size),
        _pattern_mod(selected, counts, tile_numel))


def vsa(topk_indices: torch.Tensor, tile_numel: int, num_kv_tiles: int,
        variable_block_sizes: torch.Tensor | None = None, *, device=None) -> Mask:
    """The VSA fine-stage pattern as a :class:`Mask` (one head; batch rows may differ).

    ``kv`` is visible from ``q`` iff ``kv // T`` is among ``topk_indices[b, q // T]`` and (with
    ``variable_block_sizes``) ``kv % T < sizes[kv // T]``, ``T = tile_numel``.
    ``topk_indices``: ``[QT, K]``, ``[B, QT, K]`` or ``[B, 1, QT, K]`` (use
    :func:`create_vsa_block_mask` for per-head selections). Shape ``QT*T x NT*T``.

    ``vsa(torch.tensor([[0], [0], [2]]), 2, 3)`` -- tiles of 2, query tiles 0 and 1 pick KV
    tile 0, query tile 2 picks tile 2::

        # # . . . .
        # # . . . .
        # # . . . .
        # # . . . .
        . . . . # #
        . . . . # #

    Row intervals are the selected tiles, so ``.block_mask(bs)`` is O(q_len * K + tiles) for
    any block size; ``.block_mask(tile_numel)`` has the lists of :func:`create_vsa_block_mask`.
    """
    tile_numel = check_positive_int("tile_numel", tile_numel)
    num_kv_tiles = check_positive_int("num_kv_tiles", num_kv_tiles)
    if isinstance(topk_indices, torch.Tensor):
        if topk_indices.dim() == 4:
            if topk_indices.shape[1] != 1:
                raise ValueError(
                    f"vsa() is one head per mask; topk_indices has {topk_indices.shape[1]} heads "
                    f"(shape {tuple(topk_indices.shape)}): use create_vsa_block_mask")
            topk_indices = topk_indices[:, 0]
        elif topk_indices.dim() == 2:
            topk_indices = topk_indices.unsqueeze(0)
        elif topk_indices.dim() != 3:
            raise ValueError(f"topk_indices must be [QT, K], [B, QT, K] or [B, 1, QT, K], got "
                             f"shape {tuple(topk_indices.shape)}")
    topk = _check_topk(topk_indices, num_kv_tiles)
    device = topk.device if device is None else torch.device(device)
    topk = topk.to(device)
    sizes = _check_sizes("variable_block_sizes", variable_block_sizes, num_kv_tiles,
                         tile_numel, device)
    batch, qt, k = topk.shape
    selected = torch.zeros(batch, qt, num_kv_tiles, dtype=torch.int8, device=device)
    selected.scatter_(-1, topk, 1)
    counts = sizes if sizes is not None else torch.full((num_kv_tiles,), tile_numel,
                                                        device=device)
    T, last_q, last_kv = tile_numel, qt - 1, num_kv_tiles - 1
    q_len, kv_len = qt * T, num_kv_tiles * T

    def rule(b, q, kv):
        qi = (q // T).clamp(0, last_q)
        ki = (kv // T).clamp(0, last_kv)
        inside = (q < q_len) & (kv < kv_len)
        return inside & (selected[b, qi, ki] > 0) & (kv - ki * T < counts[ki])

    def intervals():
        lo = topk * T
        hi = lo + counts[topk]
        return lo.repeat_interleave(T, dim=1), hi.repeat_interleave(T, dim=1)

    name = f"vsa_{qt}x{num_kv_tiles}_t{T}_k{k}"
    return Mask(rule, q_len, kv_len, batch, intervals=intervals, name=name, device=device)


def _example(seq_len: int, block_size: int) -> Mask:
    """Tiles of ``block_size`` tokens, the last one partial; each query tile keeps the best
    1/8 of the KV tiles (itself included) under a fixed random score."""
    T = block_size
    n = max(1, -(-seq_len // T))
    sizes = torch.full((n,), T, dtype=torch.long)
    sizes[-1] = seq_len - (n - 1) * T
    g = torch.Generator().manual_seed(0)
    scores = torch.rand(n, n, generator=g)
    topk = _topk_from_scores(scores, max(1, n // 8), True, True)
    return vsa(topk, T, n, sizes)


EXAMPLES = {"vsa": _example}
