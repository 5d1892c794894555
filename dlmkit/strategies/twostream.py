"""Shared layout of the families that train on ``[x_t | x_0]`` (bd3lm, hybrid, idlm)."""

from __future__ import annotations

import torch

from .base import Strategy, doc_ids_of


class TwoStreamStrategy(Strategy):
    """Feeds ``[noisy | clean]`` with position ids ``[p | p]`` under ``mask_factory``."""

    supports_packing = True
    mask_factory = None  # (seq_len, block_size, valid, doc_ids=, device=) -> Mask

    def validate(self) -> None:
        self._positive_option("block_size")

    def two_stream(self, batch: dict, noisy: torch.Tensor) -> dict:
        ids, valid = batch["input_ids"], batch["attention_valid"]
        length = ids.shape[1]
        factory = type(self).mask_factory
        mask = self.cached_mask(
            self.layout_key(batch),
            lambda: factory(length, self.config["block_size"], valid,
                            doc_ids=doc_ids_of(batch), device=ids.device))
        positions = batch["position_ids"]
        return {"input_ids": torch.cat([noisy, ids], 1), "mask": mask,
                "position_ids": torch.cat([positions, positions], 1), "target_ids": ids,
                "loss_mask": batch["loss_mask"], "valid": valid}
