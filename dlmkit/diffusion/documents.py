"""Corrupting packed rows document by document.

A packed row holds several documents: ``doc_ids [B, L]`` numbers them ``0, 1, ...`` within the
row (each one contiguous run, in order) and is ``-1`` on padding that belongs to none. A
corruption draws position-major from one generator per row (:mod:`dlmkit.diffusion.rng`), so
on a packed row every document after the first would take its noise from the first one's
stream at its offset: the noise — and so the gradient — would depend on how samples were
packed and split into micro-batches.

:func:`corrupt_documents` cuts every document out to a row of its own, starting at column 0,
corrupts those rows with one generator per document (the recipe seeds them from each
document's own ``(seed, step, sample)``), and puts the results back. A document's noise is
then exactly what it gets unpacked, however it was packed, and per-block levels (BD3-LM) start
at each document's first token, like the blocks of the packed masks
(:mod:`dlmkit.masks.diffusion` counts blocks from each document's start) — so a noise block
never straddles two mask blocks, whatever the documents' offsets.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from dlmkit.diffusion import rng
from dlmkit.diffusion._checks import check_ids, check_same_shape

Corruption = tuple[torch.Tensor, torch.Tensor, torch.Tensor]


class _Segments:
    """Where each document of ``doc_ids [B, L]`` lies: ``rows``/``cols`` of every position
    inside a document (row-major), its document ``which`` (numbered row by row, in order) and
    ``local`` offset in it; ``count`` documents, the longest ``width`` positions."""

    def __init__(self, doc_ids: torch.Tensor) -> None:
        length = doc_ids.shape[1]
        self.rows, self.cols = (doc_ids >= 0).nonzero(as_tuple=True)
        key = self.rows * (length + 1) + doc_ids[self.rows, self.cols]
        unique, counts = torch.unique_consecutive(key, return_counts=True)
        if unique.numel() > 1 and not bool((unique[1:] > unique[:-1]).all()):
            raise ValueError("doc_ids: every document of a row must be one contiguous run, "
                             "numbered 0, 1, ... in order (as the Collator packs them)")
        self.count = int(unique.numel())
        self.width = int(counts.max()) if self.count else 0
        starts = counts.cumsum(0) - counts
        self.which = torch.repeat_interleave(torch.arange(self.count, device=key.device),
                                             counts)
        self.local = torch.arange(key.numel(), device=key.device) - starts[self.which]

    def cut(self, values: torch.Tensor, fill=0) -> torch.Tensor:
        """``values [B, L, ...]`` -> ``[count, width, ...]`` (``fill`` past each document)."""
        out = torch.full((self.count, self.width, *values.shape[2:]), fill, dtype=values.dtype,
                         device=values.device)
        out[self.which, self.local] = values[self.rows, self.cols]
        return out

    def paste(self, values: torch.Tensor, into: torch.Tensor) -> torch.Tensor:
        """Write ``values [count, width, ...]`` back over ``into [B, L, ...]`` (a copy)."""
        out = into.clone()
        out[self.rows, self.cols] = values[self.which, self.local].to(out.dtype)
        return out


def corrupt_documents(
    corruption: Callable[..., Corruption], input_ids: torch.Tensor, loss_mask: torch.Tensor,
    *args, doc_ids: torch.Tensor | None, generator: rng.Generators, **kwargs,
) -> Corruption:
    """``corruption(input_ids, loss_mask, *args, generator=..., **kwargs)`` run per document.

    Args:
        corruption: any function of :mod:`dlmkit.diffusion.corruption`.
        input_ids, loss_mask: ``[B, L]``.
        doc_ids: ``[B, L]`` document numbers (``-1`` = in no document), or ``None`` for one
            document per row: then this is exactly ``corruption(...)``.
        generator: one ``torch.Generator`` per *document*, in row-major order (row 0's
            documents 0, 1, ..., then row 1's; one per row when nothing is packed), or a
            single generator.
        kwargs: passed on; tensors of shape ``[B, L]`` (e.g. per-position offsets) are cut
            into documents like ``input_ids``.

    Returns ``(noisy_ids, noise_mask, p_mask)`` ``[B, L]`` as the corruption does; positions
    in no document are unchanged, never in ``noise_mask``, and get ``p_mask = 1`` (they are
    never scored: a supervised one is an error).
    """
    if doc_ids is None:
        return corruption(input_ids, loss_mask, *args, generator=generator, **kwargs)
    check_ids("input_ids", input_ids)
    check_same_shape("loss_mask", loss_mask, input_ids, "input_ids")
    check_same_shape("doc_ids", doc_ids, input_ids, "input_ids")
    doc_ids = doc_ids.to(input_ids.device).long()
    loss_mask = loss_mask.to(input_ids.device)
    if bool(((doc_ids < 0) & (loss_mask != 0)).any()):
        raise ValueError("loss_mask supervises positions that are in no document (doc_ids -1); "
                         "every supervised position must belong to a document")
    segments = _Segments(doc_ids)
    if not isinstance(generator, torch.Generator) and hasattr(generator, "__len__") and \
            len(generator) != segments.count:
        raise ValueError(f"generator must be one torch.Generator or one per document "
                         f"({segments.count} in these packed rows), got {len(generator)}")
    rng.check_generator(generator, segments.count)
    shape = tuple(input_ids.shape)
    kwargs = {k: segments.cut(v) if isinstance(v, torch.Tensor) and tuple(v.shape) == shape
              else v for k, v in kwargs.items()}
    noisy, noise, p_mask = corruption(segments.cut(input_ids), segments.cut(loss_mask), *args,
                                      generator=generator, **kwargs)
    return (segments.paste(noisy, input_ids),
            segments.paste(noise, torch.zeros(shape, dtype=torch.bool, device=input_ids.device)),
            segments.paste(p_mask, torch.ones(shape, dtype=torch.float32,
                                              device=input_ids.device)))
