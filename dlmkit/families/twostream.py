"""Shared layout of the families that train on ``[x_t | x_0]`` (bd3lm, hybrid, idlm)."""

from __future__ import annotations

import torch

from dlmkit.diffusion.documents import corrupt_documents
from dlmkit.families.strategy import Strategy, doc_ids_of


class TwoStreamStrategy(Strategy):
    """Feeds ``[noisy | clean]`` with position ids ``[p | p]`` under ``mask_factory``."""

    supports_packing = True
    mask_factory = None  # (seq_len, block_size, valid, doc_ids=, device=) -> Mask

    def corrupt(self, corruption, batch: dict, generators, *args, **kwargs):
        """``corruption(input_ids, loss_mask, *args, **kwargs)`` document by document on packed
        rows (``generators``: one per document, row-major), so a document's noise does not
        depend on how it was packed (:mod:`dlmkit.diffusion.documents`)."""
        packed = doc_ids_of(batch) is not None
        return corrupt_documents(corruption, batch["input_ids"], batch["loss_mask"], *args,
                                 doc_ids=batch["doc_ids"] if packed else None,
                                 generator=generators, **kwargs)

    def two_stream(self, batch: dict, noisy: torch.Tensor) -> dict:
        ids, valid = batch["input_ids"], batch["attention_valid"]
        length = ids.shape[1]
        factory = type(self).mask_factory
        mask = self.cached_mask(
            self.layout_key(batch),
            lambda: factory(length, self.config["block_size"], valid,
                            doc_ids=doc_ids_of(batch), device=ids.device))
        positions = batch["position_ids"]
        # doc_ids (packed rows only): the shifted losses score no pair across documents.
        return {"input_ids": torch.cat([noisy, ids], 1), "mask": mask,
                "position_ids": torch.cat([positions, positions], 1), "target_ids": ids,
                "loss_mask": batch["loss_mask"], "valid": valid,
                "doc_ids": batch["doc_ids"] if doc_ids_of(batch) is not None else None}
