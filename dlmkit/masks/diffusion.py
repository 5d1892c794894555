"""Masks of the block-diffusion families over the concatenated ``[x_t | x_0]`` layout.

Positions ``[0, L)`` hold the noised stream ``x_t``, positions ``[L, 2L)`` the clean stream
``x_0``; both use position ids ``0 .. L-1``. ``blk(i) = (i mod L) // block_size``; the last
block may be short when ``L`` is not a multiple of ``block_size``. Padding follows
:mod:`dlmkit.masks.padding`: padded keys are blocked in both copies, padded queries see only
themselves.

Sequence packing: with ``doc_ids [batch, L]`` several samples share one row. Two positions
interact only when their document ids are equal, and block ids are counted from each document's
own start (``blk(i) = rank of i inside its document // block_size``), so a packed row is, document
by document, exactly the mask of the unpacked sample. When every document is one contiguous run
the row intervals stay exact (each row is still at most two intervals) and ``.block_mask()`` is
O(tiles); documents split into several runs fall back to rule evaluation (still exact).
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from .checks import broadcast_batch, check_ids, check_positive_int, check_valid, mask_device
from .core import Mask
from .padding import padded_rule, self_attention_mask


class Documents:
    """Per-position document structure of ``doc_ids [batch, L]``.

    ``doc`` (int64) and ``rank`` (index of the position inside its document) are ``[batch, L]``.
    ``start``/``end`` (``[batch, L]``, half-open run of each position's document) are set only
    when every document of every row is one contiguous run, else None.
    """

    def __init__(self, doc_ids, seq_len: int, name: str = "doc_ids", device=None) -> None:
        doc = check_ids(name, doc_ids, seq_len)
        if device is not None:
            doc = doc.to(device)
        batch = doc.shape[0]
        position = torch.arange(seq_len, device=doc.device).expand(batch, seq_len)
        sorted_doc, order = doc.sort(dim=1, stable=True)
        new_doc = torch.ones_like(sorted_doc, dtype=torch.bool)
        new_doc[:, 1:] = sorted_doc[:, 1:] != sorted_doc[:, :-1]
        first = torch.where(new_doc, position, 0).cummax(1).values
        self.doc = doc
        self.rank = torch.empty_like(doc).scatter_(1, order, position - first)
        changes = (doc[:, 1:] != doc[:, :-1]).sum(1) + 1
        self.start = self.end = None
        if bool((changes == new_doc.sum(1)).all()):
            self.start = position - self.rank
            last = torch.ones_like(doc, dtype=torch.bool)
            last[:, :-1] = doc[:, 1:] != doc[:, :-1]
            end = torch.where(last, position + 1, seq_len)
            self.end = end.flip(1).cummin(1).values.flip(1)

    @property
    def batch(self) -> int:
        return self.doc.shape[0]

    @property
    def contiguous(self) -> bool:
        return self.start is not None

    def expand(self, batch: int) -> Documents:
        for field in ("doc", "rank", "start", "end"):
            value = getattr(self, field)
            if value is not None:
                setattr(self, field, value.expand(batch, value.shape[1]))
        return self


def _block_ids(seq_len: int, block_size: int, docs: Documents | None) -> Callable:
    """``ids(b, q, kv) -> (half_q, half_k, block_q, block_k, ok)`` with integer halves (0 noisy,
    1 clean); ``ok`` = both inside ``[0, 2L)`` and, when packed, in the same document."""
    L, S = seq_len, block_size

    def ids(b, q, kv):
        hq, hk = q // L, kv // L
        lq, lk = q - hq * L, kv - hk * L
        ok = (q < 2 * L) & (kv < 2 * L)
        if docs is None:
            return hq, hk, lq // S, lk // S, ok
        lq, lk = lq.clamp(0, L - 1), lk.clamp(0, L - 1)
        same_doc = docs.doc[b, lq] == docs.doc[b, lk]
        return hq, hk, docs.rank[b, lq] // S, docs.rank[b, lk] // S, ok & same_doc

    return ids


def _layout(seq_len: int, block_size: int, docs: Documents | None, device):
    """Per position of ``[x_t | x_0]`` (``[batch or 1, 2L]``): (position, is-noisy, document
    start, block start, block end), all in stream-local coordinates ``0 .. L``."""
    L, S = seq_len, block_size
    q = torch.arange(2 * L, device=device).unsqueeze(0)
    local = q % L
    if docs is None:
        doc_start, doc_end = torch.zeros_like(local), torch.full_like(local, L)
    else:
        doc_start, doc_end = docs.start.repeat(1, 2), docs.end.repeat(1, 2)
    start = doc_start + (local - doc_start) // S * S
    end = torch.minimum(start + S, doc_end)
    return q, q < L, doc_start, start, end


def _mask(name: str, rule, intervals, seq_len: int, valid, docs: Documents | None,
          device) -> Mask:
    """Apply the padding convention (and the packing batch) to a ``[x_t | x_0]`` rule."""
    if docs is None:
        return self_attention_mask(name, rule, intervals, seq_len, 2, valid, device)
    valid = check_valid(valid, seq_len)
    batch = broadcast_batch(docs.batch, 1 if valid is None else valid.shape[0])
    docs.expand(batch)
    if not docs.contiguous:
        intervals = None
    if valid is None:
        return Mask(rule, 2 * seq_len, 2 * seq_len, batch, intervals=intervals, name=name,
                    device=docs.doc.device)
    valid = valid.to(docs.doc.device).expand(batch, seq_len)
    if intervals is None:
        return Mask(padded_rule(rule, valid, seq_len), 2 * seq_len, 2 * seq_len, batch,
                    name=name, device=docs.doc.device)
    return self_attention_mask(name, rule, intervals, seq_len, 2, valid, docs.doc.device)


def _documents(doc_ids, seq_len: int, device) -> Documents | None:
    return None if doc_ids is None else Documents(doc_ids, seq_len, device=device)


def block_diffusion(seq_len: int, block_size: int, valid=None, *, doc_ids=None,
                    device=None) -> Mask:
    """BD3-LM training mask over ``[x_t | x_0]`` (``2L x 2L``).

    ========  ======================  ========================
    q \\ kv   x_t                     x_0
    ========  ======================  ========================
    x_t       same block              strictly earlier blocks
    x_0       never                   same or earlier blocks
    ========  ======================  ========================

    Example, ``block_diffusion(4, 2)`` (``#`` = attend)::

        x_t  # # . . | . . . .
        x_t  # # . . | . . . .
        x_t  . . # # | # # . .
        x_t  . . # # | # # . .
        x_0  . . . . | # # . .
        x_0  . . . . | # # . .
        x_0  . . . . | # # # #
        x_0  . . . . | # # # #

    Args:
        seq_len: ``L``, tokens per stream (> 0).
        block_size: diffusion block length (> 0).
        valid: optional ``[batch, L]`` padding mask (1 = real token).
        doc_ids: optional ``[batch, L]`` non-negative document ids for packed samples: no
            attention across documents, blocks counted from each document's start.
    """
    seq_len = check_positive_int("seq_len", seq_len)
    block_size = check_positive_int("block_size", block_size)
    L, S = seq_len, block_size
    device = mask_device(device, valid, doc_ids)
    docs = _documents(doc_ids, L, device)
    ids = _block_ids(L, S, docs)

    def rule(b, q, kv):
        hq, hk, bq, bk, ok = ids(b, q, kv)
        same_block = (hq == hk) & (bq == bk)
        noisy_sees_clean = (hq == 0) & (hk == 1) & (bk < bq)
        clean_causal = (hq == 1) & (hk == 1) & (bk <= bq)
        return ok & (same_block | noisy_sees_clean | clean_causal)

    def intervals():
        q, noisy, doc_start, start, end = _layout(L, S, docs, device)
        lo = torch.stack([torch.where(noisy, start, L + doc_start),
                          torch.where(noisy, L + doc_start, L)], -1)
        hi = torch.stack([torch.where(noisy, end, L + end), torch.where(noisy, L + start, L)], -1)
        return lo, hi

    return _mask(f"block_diffusion_{L}_{S}", rule, intervals, L, valid, docs, device)


def idlm(seq_len: int, block_size: int, valid=None, *, doc_ids=None, device=None) -> Mask:
    """I-DLM training mask over ``[x_t | x_0]`` (``2L x 2L``).

    ========  ================================  ========================
    q \\ kv   x_t                               x_0
    ========  ================================  ========================
    x_t       same block, causal (kv <= q)      strictly earlier blocks
    x_0       never                             token-causal (kv <= q)
    ========  ================================  ========================

    Example, ``idlm(4, 2)``::

        x_t  # . . . | . . . .
        x_t  # # . . | . . . .
        x_t  . . # . | # # . .
        x_t  . . # # | # # . .
        x_0  . . . . | # . . .
        x_0  . . . . | # # . .
        x_0  . . . . | # # # .
        x_0  . . . . | # # # #

    With ``block_size=1`` a noisy token sees itself plus the clean tokens strictly before it.
    Unlike the reference builder, left-padded and empty samples never produce a fully blocked
    row (padded queries keep their diagonal). ``doc_ids`` packs samples as in
    :func:`block_diffusion`.
    """
    seq_len = check_positive_int("seq_len", seq_len)
    block_size = check_positive_int("block_size", block_size)
    L, S = seq_len, block_size
    device = mask_device(device, valid, doc_ids)
    docs = _documents(doc_ids, L, device)
    ids = _block_ids(L, S, docs)

    def rule(b, q, kv):
        hq, hk, bq, bk, ok = ids(b, q, kv)
        noisy_block = (hq == 0) & (hk == 0) & (bq == bk) & (kv <= q)
        noisy_sees_clean = (hq == 0) & (hk == 1) & (bk < bq)
        clean_causal = (hq == 1) & (hk == 1) & (kv <= q)
        return ok & (noisy_block | noisy_sees_clean | clean_causal)

    def intervals():
        q, noisy, doc_start, start, _ = _layout(L, S, docs, device)
        lo = torch.stack([torch.where(noisy, start, L + doc_start),
                          torch.where(noisy, L + doc_start, L)], -1)
        hi = torch.stack(torch.broadcast_tensors(q + 1, torch.where(noisy, L + start, L)), -1)
        return lo, hi

    return _mask(f"idlm_{L}_{S}", rule, intervals, L, valid, docs, device)


def _packed_doc_ids(seq_len: int, block_size: int) -> torch.Tensor:
    """Three documents of unequal length in one row (for the examples)."""
    cuts = torch.tensor([seq_len // 3 + block_size // 2, 2 * seq_len // 3])
    return torch.bucketize(torch.arange(seq_len), cuts, right=True).unsqueeze(0)


EXAMPLES = {
    "block_diffusion": lambda seq_len, block_size: block_diffusion(seq_len, block_size),
    "idlm": lambda seq_len, block_size: idlm(seq_len, block_size),
    "block_diffusion_packed": lambda seq_len, block_size: block_diffusion(
        seq_len, block_size, doc_ids=_packed_doc_ids(seq_len, block_size)),
    "idlm_packed": lambda seq_len, block_size: idlm(
        seq_len, block_size, doc_ids=_packed_doc_ids(seq_len, block_size)),
}
