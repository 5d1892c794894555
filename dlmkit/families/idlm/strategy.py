"""I-DLM: every supervised token masked in ``x_t``; ``[x_t | x_0]`` under the I-DLM mask;
shifted CE on both halves, the clean half weighted by a fixed or auto-balanced ``alpha``."""

from __future__ import annotations

from dlmkit.diffusion import IDLMLoss, corrupt_all_masked
from dlmkit.diffusion.losses import next_token_scored
from dlmkit.families.twostream import TwoStreamStrategy
from dlmkit.masks import idlm

from .options import IDLMTraining


class IDLMStrategy(TwoStreamStrategy):
    name = "idlm"
    options = IDLMTraining
    mask_factory = staticmethod(idlm)
    default_steps = 6000  # why: docs/families/idlm.md#why-these-defaults
    # A run whose config.yaml does not record clean_loss_weight trained with 1.0, the default
    # before it depended on the regime: a resume keeps it (dlmkit.train.resume), not 4.0.
    former_defaults = {"clean_loss_weight": 1.0}

    def validate(self) -> None:
        super().validate()
        self.loss_fn = IDLMLoss(clean_loss_weight=self.config["clean_loss_weight"],
                                auto_balance=self.config["auto_balance"],
                                chunk_size=self.loss_chunk_size)

    def prepare(self, batch, generators):
        noisy, _, _ = corrupt_all_masked(batch["input_ids"], batch["loss_mask"],
                                         self.mask_token_id)
        return self.two_stream(batch, noisy)

    def counts(self, prepared):
        scored_next = (prepared["loss_mask"] != 0) & (prepared["valid"] != 0)
        return {"num_tokens": next_token_scored(scored_next, prepared["doc_ids"]).sum()}

    def loss(self, model, prepared, denominators):
        logits = self.logits(model, prepared["input_ids"], prepared["mask"],
                             prepared["position_ids"])
        return self.loss_fn(logits=logits, target_ids=prepared["target_ids"],
                            loss_mask=prepared["loss_mask"], valid_mask=prepared["valid"],
                            num_tokens=denominators["num_tokens"], doc_ids=prepared["doc_ids"])
