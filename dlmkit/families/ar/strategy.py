"""Plain autoregressive SFT: next-token CE on the supervised tokens under a causal mask.

The baseline every diffusion family is compared with, and the target a DFlash drafter is
trained against. Same recipe, same rule for denominators: the loss divides by the global count
of exactly the pairs it scores (supervised tokens that have a predecessor in their row).
"""

from __future__ import annotations

from dlmkit.diffusion import LossOutput, next_token_loss
from dlmkit.families.strategy import Strategy
from dlmkit.masks.causal import padded_causal

from .options import ARTraining


class ARStrategy(Strategy):
    name = "ar"
    options = ARTraining
    default_steps = 3000  # why: docs/families/ar.md#why-these-defaults

    def prepare(self, batch, generators):
        # No corruption: the generators go unused (the model sees the clean tokens).
        ids, valid = batch["input_ids"], batch["attention_valid"]
        mask = self.cached_mask(self.layout_key(batch),
                                lambda: padded_causal(ids.shape[1], valid, device=ids.device))
        return {"input_ids": ids, "mask": mask, "position_ids": batch["position_ids"],
                "target_ids": ids, "loss_mask": batch["loss_mask"]}

    def counts(self, prepared):
        return {"num_tokens": (prepared["loss_mask"] != 0)[:, 1:].sum()}

    def loss(self, model, prepared, denominators):
        logits = self.logits(model, prepared["input_ids"], prepared["mask"],
                             prepared["position_ids"])
        loss = next_token_loss(logits, prepared["target_ids"], prepared["loss_mask"],
                               num_tokens=denominators["num_tokens"],
                               chunk_size=self.loss_chunk_size)
        return LossOutput(loss, loss.detach(), {})
