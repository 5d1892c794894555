"""Where each document of a micro-batch sits in its step's global batch (its *slot*).

Stratified time sampling (:mod:`dlmkit.diffusion.timesteps`) gives the sample in slot ``k``
of the ``G`` slots of a step a noise level in the ``k``-th stratum. The slot is the sample's
position in the step's global batch, which :class:`~dlmkit.data.GlobalBatchSampler` fixes from
``(seed, step)``: the same for every rank count and micro-batch split.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

__all__ = ["doc_slots"]


def doc_slots(doc_sample_index: torch.Tensor, indices: Sequence[int],
              first_slot: int) -> torch.Tensor:
    """``[B, D]`` slot of every document of a collated micro-batch (-1 where none).

    ``doc_sample_index [B, D]``: the collator's global sample index per document;
    ``indices``: the micro-batch's global sample indices in the order they were collated, which
    occupy slots ``first_slot, first_slot + 1, ...`` of the global batch. A sample drawn twice
    in one micro-batch (a global batch straddling an epoch) gets both its slots, the lower one
    to its first document in row-major order — the order its repeat numbers are handed out in
    (:func:`~dlmkit.data.seeds.document_generators`), so a copy keeps its slot and its noise
    together whatever the packing.
    """
    free: dict[int, list[int]] = {}
    for k, index in enumerate(indices):
        free.setdefault(int(index), []).append(first_slot + k)
    for slots in free.values():
        slots.reverse()  # pop() hands them out in order
    rows = doc_sample_index.tolist()
    try:
        out = [[free[i].pop() if i >= 0 else -1 for i in row] for row in rows]
    except (KeyError, IndexError):
        raise ValueError(f"doc_sample_index {rows} does not match the micro-batch's sample "
                         f"indices {list(indices)}") from None
    return torch.tensor(out, dtype=torch.long, device=doc_sample_index.device)
