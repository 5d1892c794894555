"""DFlash draft-block mask (and its causal JetSpec variant).

Queries are ``N`` draft blocks of ``block_size`` tokens (``q_len = N * bs``); keys are
``[target context (ctx_len) | block_0 | ... | block_{N-1}]`` (``kv_len = ctx_len + N * bs``).
The context is the frozen target's hidden states and is never a query.

Query ``q`` (block ``j = q // bs``, offset ``o = q % bs``, anchor ``a = anchors[b, j]``) sees:

* context ``k < a`` (strictly before its anchor) when ``keep[b, j]``; with ``sliding_window=W``
  only ``k > a + o - W`` (the window is measured from the query's own sequence position
  ``a + o``, so at most ``W - 1 - o`` context keys, none when ``o >= W - 1``); with document ids
  only ``ctx_doc_id[b, k] == anchor_doc_id[b, j]``;
* its own block, bidirectionally, or causally (key offset ``<= o``) with ``causal=True``
  (JetSpec); never another block.

Example, ``dflash(tensor([[3, 1]]), None, 4, 2)`` (``#`` = attend)::

    block 0 (anchor 3)  # # # . | # # . .
                        # # # . | # # . .
    block 1 (anchor 1)  # . . . | . . # #
                        # . . . | . . # #

**No configuration lets a block see context at or after its anchor**, for any ``N``: the
reference passes no mask at all when ``N == 1`` on SDPA and leaks the very target states the
draft must predict; this mask is always built and always bounded by the anchor. Every row keeps
at least its own diagonal (dropped blocks, ``keep=False``, keep their in-block attention and
see no context), so no row is ever fully blocked.
"""

from __future__ import annotations

import torch

from .checks import check_int, check_positive_int, check_valid, int_rows
from .core import Mask


def _check_anchors(anchors, ctx_len: int) -> torch.Tensor:
    if not isinstance(anchors, torch.Tensor):
        raise TypeError(f"anchors must be an integer torch.Tensor [batch, N] or [N], "
                        f"got {type(anchors).__name__}")
    if anchors.is_floating_point() or anchors.is_complex() or anchors.dtype == torch.bool:
        raise TypeError(f"anchors must hold integers, got dtype {anchors.dtype}")
    if anchors.dim() == 1:
        anchors = anchors.unsqueeze(0)
    if anchors.dim() != 2 or anchors.shape[0] < 1 or anchors.shape[1] < 1:
        raise ValueError(f"anchors must have shape [batch, N] or [N] with N >= 1, "
                         f"got {tuple(anchors.shape)}")
    low, high = int(anchors.min()), int(anchors.max())
    if low < 0 or high > ctx_len:
        bad = low if low < 0 else high
        raise ValueError(f"anchors must lie in [0, ctx_len={ctx_len}] (a block sees the "
                         f"context strictly before its anchor), got {bad}")
    return anchors.long()


def _check_per_block(name: str, value, anchors: torch.Tensor) -> torch.Tensor:
    if not isinstance(value, torch.Tensor):
        raise TypeError(f"{name} must be a torch.Tensor with the shape of anchors "
                        f"{tuple(anchors.shape)}, got {type(value).__name__}")
    if value.dim() == 1:
        value = value.unsqueeze(0)
    if value.shape != anchors.shape:
        raise ValueError(f"{name} must have the shape of anchors {tuple(anchors.shape)}, "
                         f"got {tuple(value.shape)}")
    return value.to(anchors.device)


def _check_ctx_docs(ctx_doc_id, anchor_doc_id, anchors: torch.Tensor, ctx_len: int):
    if (ctx_doc_id is None) != (anchor_doc_id is None):
        given = "ctx_doc_id" if ctx_doc_id is not None else "anchor_doc_id"
        raise ValueError(f"ctx_doc_id and anchor_doc_id must be given together (packing needs "
                         f"both), got only {given}")
    if ctx_doc_id is None:
        return None
    if not isinstance(ctx_doc_id, torch.Tensor):
        raise TypeError(f"ctx_doc_id must be an integer torch.Tensor [batch, {ctx_len}], "
                        f"got {type(ctx_doc_id).__name__}")
    ctx_doc_id = int_rows("ctx_doc_id", ctx_doc_id, ctx_len)
    batch = anchors.shape[0]
    if ctx_doc_id.shape[0] not in (1, batch):
        raise ValueError(f"ctx_doc_id must have shape [{batch} or 1, ctx_len={ctx_len}], "
                         f"got {tuple(ctx_doc_id.shape)}")
    anchor_doc_id = _check_per_block("anchor_doc_id", anchor_doc_id, anchors)
    if anchor_doc_id.is_floating_point() or anchor_doc_id.is_complex() or \
            anchor_doc_id.dtype == torch.bool:
        raise TypeError(f"anchor_doc_id must hold integers, got dtype {anchor_doc_id.dtype}")
    return ctx_doc_id.to(anchors.device).long().expand(batch, ctx_len), anchor_doc_id.long()


def _doc_runs(ctx_doc: torch.Tensor, anchor_doc: torch.Tensor):
    """``(start, end) [batch, N]``: the context run of each anchor's document (empty when the
    document is absent), or None when some document is not one contiguous run."""
    ctx_len = ctx_doc.shape[1]
    sorted_doc, order = ctx_doc.sort(dim=1, stable=True)
    runs = (ctx_doc[:, 1:] != ctx_doc[:, :-1]).sum(1)
    distinct = (sorted_doc[:, 1:] != sorted_doc[:, :-1]).sum(1)
    if not bool((runs == distinct).all()):
        return None
    lo = torch.searchsorted(sorted_doc, anchor_doc.contiguous(), side="left")
    hi = torch.searchsorted(sorted_doc, anchor_doc.contiguous(), side="right")
    # Stable sort keeps a contiguous run in position order: its first entry is the run start.
    start = order.gather(1, lo.clamp(max=ctx_len - 1))
    present = hi > lo
    return torch.where(present, start, 0), torch.where(present, start + (hi - lo), 0)


def dflash(anchors, keep, ctx_len: int, block_size: int, causal: bool = False,
           sliding_window: int | None = None, ctx_doc_id=None, anchor_doc_id=None, *,
           device=None) -> Mask:
    """DFlash training mask ``[batch, 1, N*bs, ctx_len + N*bs]``.

    Args:
        anchors: int ``[batch, N]`` (or ``[N]``) anchor positions in ``[0, ctx_len]``; block
            ``j`` sees context ``[0, anchors[:, j])``. ``ctx_len`` itself is allowed (decode:
            the block follows the whole context).
        keep: bool/0-1 ``[batch, N]`` (shape of ``anchors``), or None for all True. A dropped
            block (``False``) sees no context but keeps its in-block attention.
        ctx_len: context length ``S`` (>= 0).
        block_size: draft block length (> 0).
        causal: JetSpec variant: causal inside the block instead of bidirectional.
        sliding_window: ``W >= 0`` or None: context key ``k`` also needs ``anchor + o - k < W``.
        ctx_doc_id, anchor_doc_id: packing, given together: int ``[batch or 1, ctx_len]`` and
            ``[batch, N]``; a block sees only context of its anchor's document. Contiguous
            documents keep the mask O(tiles); scattered ones fall back to rule evaluation.
    """
    ctx_len = check_int("ctx_len", ctx_len, minimum=0)
    block_size = check_positive_int("block_size", block_size)
    anchors = _check_anchors(anchors, ctx_len)
    if device is not None:
        anchors = anchors.to(device)
    device = anchors.device
    if keep is None:
        keep = torch.ones_like(anchors, dtype=torch.int8)
    else:
        keep = _check_per_block("keep", keep, anchors)
        keep = check_valid(keep, anchors.shape[1], name="keep")
    if not isinstance(causal, bool):
        raise TypeError(f"causal must be a bool, got {type(causal).__name__} {causal!r}")
    window = None if sliding_window is None else check_int("sliding_window", sliding_window,
                                                           minimum=0)
    docs = _check_ctx_docs(ctx_doc_id, anchor_doc_id, anchors, ctx_len)
    if ctx_len == 0:
        docs = None  # no context to restrict
    batch, n = anchors.shape
    S, C, Q = block_size, ctx_len, n * block_size

    def rule(b, q, kv):
        j = (q // S).clamp(0, n - 1)
        o = q - j * S
        anchor = anchors[b, j]
        ctx = (kv < C) & (kv < anchor) & (keep[b, j] > 0)
        if window is not None:
            ctx = ctx & (kv > anchor + o - window)
        if docs is not None:
            ctx = ctx & (docs[0][b, kv.clamp(0, C - 1)] == docs[1][b, j])
        own = (kv >= C + j * S) & (kv < C + (j + 1) * S)
        if causal:
            own = own & (kv <= C + q)
        return (q < Q) & (ctx | own)

    def intervals():
        q = torch.arange(Q, device=device)
        j, o = q // S, q % S
        anchor = anchors[:, j]
        hi = torch.where(keep[:, j] > 0, anchor, 0)
        lo = torch.zeros_like(hi) if window is None else anchor + o - window + 1
        if docs is not None:
            start, end = runs
            lo = torch.maximum(lo, start[:, j])
            hi = torch.minimum(hi, end[:, j])
        own_lo = (C + j * S).expand_as(lo)
        own_hi = (C + q + 1 if causal else C + (j + 1) * S).expand_as(lo)
        return torch.stack([lo, own_lo], -1), torch.stack([hi, own_hi], -1)

    runs = None if docs is None else _doc_runs(*docs)
    structured = docs is None or runs is not None
    name = f"{'jetspec' if causal else 'dflash'}_{n}x{S}_ctx{C}"
    return Mask(rule, Q, C + Q, batch, intervals=intervals if structured else None, name=name,
                device=device)


def _example_anchors(seq_len: int, block_size: int) -> torch.Tensor:
    n = max(1, seq_len // (2 * block_size))
    return torch.linspace(0, seq_len, n + 2)[1:-1].long().unsqueeze(0)


EXAMPLES = {
    "dflash": lambda seq_len, block_size: dflash(
        _example_anchors(seq_len, block_size), None, seq_len, block_size),
    "dflash_causal": lambda seq_len, block_size: dflash(
        _example_anchors(seq_len, block_size), None, seq_len, block_size, causal=True),
    "dflash_sliding": lambda seq_len, block_size: dflash(
        _example_anchors(seq_len, block_size), None, seq_len, block_size,
        sliding_window=2 * block_size),
}
