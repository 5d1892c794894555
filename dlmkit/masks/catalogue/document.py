"""Packed documents: any mask applied inside each document, never across documents.

    document(causal(3), offsets=[0, 3, 5])     shared_prefix([0, 2, 4, 6], [0, 0, 0])
    q0  # . . . .                              q0  # . . . . .     doc 0 = shared prefix
    q1  # # . . .                              q1  # # . . . .
    q2  # # # . .                              q2  # # # . . .     doc 1 = continuation
    q3  . . . # .                              q3  # # # # . .
    q4  . . . # #                              q4  # # . . # .     doc 2 = continuation
                                               q5  # # . . # #

A *layout* says which document each position belongs to, given either as ``offsets``
(cu_seqlens: ``[n_docs + 1]`` starting at 0, non-decreasing, zero-length documents allowed) or
as ``doc_ids`` (an integer id per position). Either may be 2-D (``[batch, ...]``) for one
layout per batch row. With ``doc_ids`` a document need not be contiguous; the inner mask then
sees each token's rank within its document.

:func:`document` hands the inner mask *document-local* indices (``q - start(doc(q))``,
``kv - start(doc(kv))``). Queries and keys may have different layouts (cross-attention,
``kv_offsets``/``kv_doc_ids``); query document ``d`` then sees key document ``d`` (same index
for offsets, same id for ids).

Empty rows: a query whose document has no keys (a zero-length key document in
cross-attention), or whose inner row is empty, attends to nothing. For such rows
``flex_attention`` returns 0 (LSE ``-inf``), SDPA with the boolean mask returns 0, and the
additive mask stays finite (softmax gives the uniform average of the values, never NaN).
Self-attention layouts around an inner mask with no empty rows never produce one.
"""

from __future__ import annotations

import torch

from ..causal import causal
from ..checks import broadcast_batch, check_ids, check_int, check_positive_int, int_rows
from ..core import Mask


# ---------------------------------------------------------------------- layouts
def _check_offsets(name: str, offsets, device) -> torch.Tensor:
    """``[batch or 1, n_docs + 1]`` int64 cu_seqlens."""
    offsets = int_rows(f"{name} (cu_seqlens, n_docs + 1 values)", offsets)
    if offsets.shape[1] < 2:
        raise ValueError(f"{name} must have shape [n_docs + 1] or [batch, n_docs + 1] with "
                         f"n_docs >= 1, got {tuple(offsets.shape)}")
    offsets = offsets.to(dtype=torch.int64)
    if device is not None:
        offsets = offsets.to(device)
    if bool((offsets[:, 0] != 0).any()):
        raise ValueError(f"{name} must start at 0, got first values {offsets[:, 0].tolist()}")
    if bool((offsets[:, 1:] < offsets[:, :-1]).any()):
        raise ValueError(f"{name} must be non-decreasing, got {offsets.tolist()}")
    total = offsets[:, -1]
    if int(total[0]) < 1 or bool((total != total[0]).any()):
        raise ValueError(f"{name}: every row must end at the same total length >= 1, "
                         f"got {total.tolist()}")
    return offsets


def _ids_from_offsets(offsets: torch.Tensor) -> torch.Tensor:
    total = int(offsets[0, -1])
    position = torch.arange(total, device=offsets.device).expand(offsets.shape[0], total)
    return torch.searchsorted(offsets[:, 1:].contiguous(), position.contiguous(), right=True)


def _layout_ids(offsets, doc_ids, side: str, device) -> torch.Tensor:
    """Document ids ``[batch or 1, length]`` from exactly one of ``offsets`` / ``doc_ids``."""
    names = ("offsets", "doc_ids") if side == "" else (f"{side}_offsets", f"{side}_doc_ids")
    if (offsets is None) == (doc_ids is None):
        raise ValueError(f"give exactly one of {names[0]} or {names[1]}")
    if offsets is not None:
        return _ids_from_offsets(_check_offsets(names[0], offsets, device))
    if isinstance(doc_ids, (list, tuple)):
        doc_ids = torch.tensor(doc_ids)
    if isinstance(doc_ids, torch.Tensor) and doc_ids.dim() >= 1:
        length = doc_ids.shape[-1]
        if length < 1:
            raise ValueError(f"{names[1]} must hold at least one position")
        ids = check_ids(names[1], doc_ids, length)
        return ids if device is None else ids.to(device)
    return check_ids(names[1], doc_ids, 1)  # raises the TypeError


class _Ranks:
    """Per position of a layout: rank within its document, document size, and whether
    every document is one contiguous run."""

    def __init__(self, ids: torch.Tensor) -> None:
        batch, length = ids.shape
        position = torch.arange(length, device=ids.device).expand(batch, length)
        order = ids.argsort(dim=1, stable=True)
        ordered = ids.gather(1, order)
        change = ordered[:, 1:] != ordered[:, :-1]
        ones = torch.ones(batch, 1, dtype=torch.bool, device=ids.device)
        first = torch.cat([ones, change], 1)
        last = torch.cat([change, ones], 1)
        group_lo = torch.where(first, position, 0).cummax(1).values
        group_hi = torch.where(last, position + 1, length).flip(1).cummin(1).values.flip(1)
        self.rank = torch.empty_like(ids).scatter_(1, order, position - group_lo)
        self.size = torch.empty_like(ids).scatter_(1, order, group_hi - group_lo)
        self.order, self.ordered = order, ordered
        runs = 1 + (ids[:, 1:] != ids[:, :-1]).sum(1)
        self.contiguous = bool((runs == first.sum(1)).all())
        self.ids = ids

    def key_range(self, query_ids: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """``[start, end)`` of the (contiguous) run of each query's id in this layout;
        ``[0, 0)`` when the id has no position here."""
        batch = query_ids.shape[0]
        ordered = self.ordered.expand(batch, -1).contiguous()
        left = torch.searchsorted(ordered, query_ids.contiguous())
        right = torch.searchsorted(ordered, query_ids.contiguous(), right=True)
        count = right - left
        order = self.order.expand(batch, -1)
        start = order.gather(1, left.clamp(max=order.shape[1] - 1))
        start = torch.where(count > 0, start, 0)
        return start, start + count


# ---------------------------------------------------------------------- document
def document(inner: Mask, offsets=None, kv_offsets=None, *, doc_ids=None, kv_doc_ids=None,
             device=None) -> Mask:
    """Apply ``inner`` inside every packed document; never attend across documents.

    attend(b, q, kv) iff ``doc(q) == doc(kv)`` and ``inner(b, q - start(q), kv - start(kv))``
    (with ``doc_ids``: the ranks of ``q`` and ``kv`` within their documents)::

        document(causal(3), offsets=[0, 2, 5])
        q0  # . . . .
        q1  # # . . .
        q2  . . # . .
        q3  . . # # .
        q4  . . # # #

    Args:
        inner: the mask inside a document, in document-local indices. Its ``q_len`` /
            ``kv_len`` must cover the longest query / key document (e.g.
            ``causal(max_doc_len)``); a batched inner mask pairs row ``b`` with layout row
            ``b``.
        offsets: query (and, without a key layout, key) cu_seqlens ``[n_docs + 1]`` or
            ``[batch, n_docs + 1]``.
        kv_offsets: key cu_seqlens for cross-attention, same number of documents.
        doc_ids: instead of offsets, integer ids ``[length]`` or ``[batch, length]``.
        kv_doc_ids: key ids for cross-attention (query doc ``d`` sees key doc with id ``d``).

    ``.block_mask()`` stays analytic (O(rows * K + tiles)) when ``inner`` has row intervals
    and every document is one contiguous run; otherwise the exact rule fallback is used.
    """
    if not isinstance(inner, Mask):
        raise TypeError(f"inner must be a dlmkit Mask, got {type(inner).__name__}")
    device = inner.device if device is None else torch.device(device)
    q_ids = _layout_ids(offsets, doc_ids, "", device)
    cross = kv_offsets is not None or kv_doc_ids is not None
    if cross:
        kv_ids = _layout_ids(kv_offsets, kv_doc_ids, "kv", device)
        if offsets is not None and kv_offsets is not None:
            n_q, n_kv = _check_offsets("offsets", offsets, device).shape[1], \
                _check_offsets("kv_offsets", kv_offsets, device).shape[1]
            if n_q != n_kv:
                raise ValueError(f"offsets and kv_offsets must list the same number of "
                                 f"documents, got {n_q - 1} and {n_kv - 1}")
    else:
        kv_ids = q_ids
    try:
        batch = broadcast_batch(q_ids.shape[0], kv_ids.shape[0], inner.batch)
    except ValueError:
        raise ValueError(
            f"batch rows do not broadcast: query layout has {q_ids.shape[0]}, key layout "
            f"{kv_ids.shape[0]}, inner mask {inner.batch} (each must be 1 or the same)"
        ) from None
    q_ids = q_ids.expand(batch, -1).contiguous()
    kv_ids = kv_ids.expand(batch, -1).contiguous()
    q_len, kv_len = q_ids.shape[1], kv_ids.shape[1]
    q_ranks = _Ranks(q_ids)
    kv_ranks = _Ranks(kv_ids) if cross else q_ranks
    longest_q, longest_kv = int(q_ranks.size.max()), int(kv_ranks.size.max())
    if inner.q_len < longest_q or inner.kv_len < longest_kv:
        raise ValueError(
            f"inner mask {inner.name!r} is {inner.q_len} x {inner.kv_len} but the longest "
            f"document has {longest_q} queries and {longest_kv} keys; inner must cover it")
    q_local, kv_local = q_ranks.rank, kv_ranks.rank
    inner_mod = inner.mask_mod
    q_last, kv_last = q_len - 1, kv_len - 1

    def rule(b, q, kv):
        qc, kc = q.clamp(0, q_last), kv.clamp(0, kv_last)
        same = q_ids[b, qc] == kv_ids[b, kc]
        inside = (q <= q_last) & (kv <= kv_last)
        return same & inside & inner_mod(b, 0, q_local[b, qc], kv_local[b, kc])

    intervals = None
    if inner.has_intervals and q_ranks.contiguous and kv_ranks.contiguous:
        def intervals():
            lo, hi = inner.row_intervals()
            rows = torch.arange(batch, device=device).view(batch, 1) if lo.shape[0] > 1 else 0
            lo, hi = lo[rows, q_local], hi[rows, q_local]  # [batch, q_len, K]
            start, end = kv_ranks.key_range(q_ids)
            start, end = start.unsqueeze(-1), end.unsqueeze(-1)
            lo = torch.minimum(torch.maximum(lo + start, start), end)
            hi = torch.minimum(torch.maximum(hi + start, start), end)
            return lo, hi

    return Mask(rule, q_len, kv_len, batch, intervals=intervals,
                name=f"document({inner.name})", device=device)


def packed_causal_document(offsets=None, *, doc_ids=None, device=None) -> Mask:
    """Causal attention inside each packed document: attend iff ``start(doc(q)) <= kv <= q``
    and ``doc(kv) == doc(q)``::

        packed_causal_document([0, 2, 5])
        q0  # . . . .
        q1  # # . . .
        q2  . . # . .
        q3  . . # # .
        q4  . . # # #

    Equal to ``document(causal(longest), offsets)`` but with no inner lookup: one key interval
    per row. ``offsets``/``doc_ids`` as in :func:`document` (per-row layouts allowed);
    documents given by ids that are not contiguous runs use the exact rule fallback.
    """
    device = torch.device(device) if device is not None else None
    ids = _layout_ids(offsets, doc_ids, "", device)
    device = ids.device
    ranks = _Ranks(ids)
    batch, length = ids.shape
    last = length - 1
    if not ranks.contiguous:
        def rule(b, q, kv):
            same = ids[b, q.clamp(0, last)] == ids[b, kv.clamp(0, last)]
            return same & (kv <= q) & (q <= last)

        return Mask(rule, length, length, batch, name="packed_causal_document", device=device)

    start = torch.arange(length, device=device) - ranks.rank  # [batch, length]

    def rule(b, q, kv):
        return (kv >= start[b, q.clamp(0, last)]) & (kv <= q) & (q <= last)

    def intervals():
        q = torch.arange(length, device=device).view(1, length, 1)
        return start.unsqueeze(-1), (q + 1).expand(batch, length, 1)

    return Mask(rule, length, length, batch, intervals=intervals,
                name="packed_causal_document", device=device)


def shared_prefix(offsets, prefix_document_id, *, device=None) -> Mask:
    """Packed "shared prefix + continuations": every document is causal within itself, and a
    continuation document ``d`` also sees *all* of its prefix document ``p = prefix[d]``.

    attend iff ``start(d) <= kv <= q``, or ``p != d`` and ``start(p) <= kv < end(p)``
    (``d = doc(q)``)::

        shared_prefix([0, 2, 4, 6], [0, 0, 0])
        q0  # . . . . .     doc 0: the prompt (its own prefix)
        q1  # # . . . .
        q2  # # # . . .     doc 1: continuation of doc 0
        q3  # # # # . .
        q4  # # . . # .     doc 2: another continuation of doc 0
        q5  # # . . # #

    Args:
        offsets: cu_seqlens ``[n_docs + 1]`` or ``[batch, n_docs + 1]``.
        prefix_document_id: ``[n_docs]`` or ``[batch, n_docs]`` ints in ``[0, n_docs)``;
            a prefix document must be its own prefix (``prefix[prefix[d]] == prefix[d]``),
            so prefixes never chain.
    """
    offsets = _check_offsets("offsets", offsets, device)
    device = offsets.device
    n_docs = offsets.shape[1] - 1
    pid = prefix_document_id
    if isinstance(pid, (list, tuple)):
        pid = torch.tensor(pid)
    if not isinstance(pid, torch.Tensor):
        raise TypeError(f"prefix_document_id must be an int tensor [n_docs] or "
                        f"[batch, n_docs], got {type(pid).__name__}")
    pid = check_ids("prefix_document_id", pid, n_docs).to(device)
    if int(pid.max()) >= n_docs:
        raise ValueError(f"prefix_document_id must be in [0, n_docs={n_docs}), "
                         f"got {pid.tolist()}")
    try:
        batch = broadcast_batch(offsets.shape[0], pid.shape[0])
    except ValueError:
        raise ValueError(f"offsets has {offsets.shape[0]} rows and prefix_document_id "
                         f"{pid.shape[0]}; each must be 1 or the same") from None
    offsets = offsets.expand(batch, -1).contiguous()
    pid = pid.expand(batch, -1).contiguous()
    if bool((pid.gather(1, pid) != pid).any()):
        raise ValueError(f"prefix_document_id: a prefix document must be its own prefix "
                         f"(prefix[prefix[d]] == prefix[d]), got {pid.tolist()}")
    doc = _ids_from_offsets(offsets)  # [batch, length]
    length = doc.shape[1]
    last = length - 1
    start = offsets.gather(1, doc)
    p = pid.gather(1, doc)
    p_lo = offsets.gather(1, p)
    p_hi = torch.where(p != doc, offsets.gather(1, p + 1), p_lo)

    def rule(b, q, kv):
        qc = q.clamp(0, last)
        own = (kv >= start[b, qc]) & (kv <= q)
        shared = (kv >= p_lo[b, qc]) & (kv < p_hi[b, qc])
        return (own | shared) & (q <= last)

    def intervals():
        q = torch.arange(length, device=device).view(1, length, 1).expand(batch, length, 1)
        lo = torch.cat([start.unsqueeze(-1), p_lo.unsqueeze(-1)], -1)
        hi = torch.cat([q + 1, p_hi.unsqueeze(-1)], -1)
        return lo, hi

    return Mask(rule, length, length, batch, intervals=intervals, name="shared_prefix",
                device=device)


def batchify(inner: Mask, num_groups: int) -> Mask:
    """``num_groups`` independent copies of ``inner`` on the diagonal (fixed-size groups).

    With ``n_q = inner.q_len`` and ``n_kv = inner.kv_len``: attend iff
    ``q // n_q == kv // n_kv`` and ``inner(b, q % n_q, kv % n_kv)``::

        batchify(causal(2), 3)
        q0  # . . . . .
        q1  # # . . . .
        q2  . . # . . .
        q3  . . # # . .
        q4  . . . . # .
        q5  . . . . # #

    Args:
        inner: the mask of one group.
        num_groups: number of groups (> 0); the result is
            ``num_groups * n_q`` x ``num_groups * n_kv``.
    """
    if not isinstance(inner, Mask):
        raise TypeError(f"inner must be a dlmkit Mask, got {type(inner).__name__}")
    groups = check_positive_int("num_groups", num_groups)
    nq, nkv = inner.q_len, inner.kv_len
    q_len, kv_len = groups * nq, groups * nkv
    inner_mod = inner.mask_mod
    device = inner.device

    def rule(b, q, kv):
        gq, gk = q // nq, kv // nkv
        inside = (q < q_len) & (kv < kv_len)
        return (gq == gk) & inside & inner_mod(b, 0, q - gq * nq, kv - gk * nkv)

    intervals = None
    if inner.has_intervals:
        def intervals():
            lo, hi = inner.row_intervals()
            q = torch.arange(q_len, device=device)
            shift = (q // nq * nkv).view(1, q_len, 1)
            return lo[:, q % nq] + shift, hi[:, q % nq] + shift

    return Mask(rule, q_len, kv_len, inner.batch, intervals=intervals,
                name=f"batchify({inner.name}, {groups})", device=device)


def _even_offsets(seq_len: int, doc_len: int) -> torch.Tensor:
    doc_len = check_int("doc_len", doc_len, minimum=1)
    cuts = list(range(0, seq_len, doc_len)) + [seq_len]
    return torch.tensor(cuts)


def _example_document(seq_len: int, block_size: int) -> Mask:
    offsets = _even_offsets(seq_len, max(1, seq_len // 4))
    longest = int((offsets[1:] - offsets[:-1]).max())
    return document(causal(longest), offsets)


def _example_shared_prefix(seq_len: int, block_size: int) -> Mask:
    offsets = _even_offsets(seq_len, max(1, seq_len // 4))
    return shared_prefix(offsets, [0] * (len(offsets) - 1))


EXAMPLES = {
    "document_causal": _example_document,
    "packed_causal_document": lambda seq_len, block_size: packed_causal_document(
        _even_offsets(seq_len, max(1, seq_len // 3))),
    "shared_prefix": _example_shared_prefix,
    "batchify": lambda seq_len, block_size: batchify(
        causal(block_size), max(1, seq_len // block_size)),
}
