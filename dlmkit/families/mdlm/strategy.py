"""MDLM / LLaDA: absorbing corruption, bidirectional attention over ``x_t``, ``CE / p`` loss."""

from __future__ import annotations

from dlmkit.diffusion import MDLMLoss
from dlmkit.diffusion.losses import predictor_rows
from dlmkit.families.strategy import Strategy
from dlmkit.masks.bidirectional import bidirectional

from .options import MDLMTraining


class MDLMStrategy(Strategy):
    name = "mdlm"
    options = MDLMTraining
    # Runs from before logit_shift existed trained without it (dlmkit.train.resume).
    former_defaults = {"logit_shift": False}
    supervise_padding = True  # (inherited by SCDD)
    # Rows padded to one length in training and decoding (inherited by SCDD; README).
    fixed_length = True
    # Trained defaults (why: docs/families/mdlm.md#why-these-defaults).
    default_steps = 6000
    default_lr = 1.0e-3

    def validate(self) -> None:
        self._noise_range_options()
        self.loss_fn = MDLMLoss(chunk_size=self.loss_chunk_size)

    def prepare(self, batch, generators):
        batch = self.shift_batch(batch)
        noisy, noise_mask, p_mask = self.corrupt_uniform(batch, generators)
        return self.one_stream(batch, noisy, noise_mask, p_mask)

    def one_stream(self, batch, noisy, noise_mask, p_mask) -> dict:
        """The model sees ``x_t`` alone under bidirectional attention over the real tokens."""
        ids, valid = batch["input_ids"], batch["attention_valid"]
        mask = self.cached_mask(self.layout_key(batch),
                                lambda: bidirectional(ids.shape[1], valid, device=ids.device))
        return {"input_ids": noisy, "mask": mask, "position_ids": batch["position_ids"],
                "target_ids": ids, "noise_mask": noise_mask, "p_mask": p_mask,
                "loss_mask": batch["loss_mask"]}

    def counts(self, prepared):
        return {"num_tokens": (prepared["loss_mask"] != 0).sum()}

    def loss(self, model, prepared, denominators):
        logits = self.logits(model, prepared["input_ids"], prepared["mask"],
                             prepared["position_ids"])
        p = self.scored_rows(prepared, "target_ids", "noise_mask", "p_mask")
        return self.loss_fn(logits=logits, target_ids=p["target_ids"],
                            noise_mask=p["noise_mask"], p_mask=p["p_mask"],
                            loss_mask=p["loss_mask"], num_tokens=denominators["num_tokens"])

    def scored_rows(self, prepared: dict, *names: str) -> dict:
        """``loss_mask`` and the per-token tensors ``names`` of ``prepared``, indexed by the
        logit row that predicts each token: the same position, or with ``logit_shift`` the one
        before it (:func:`~dlmkit.diffusion.losses.predictor_rows`)."""
        tensors = {name: prepared[name] for name in names}
        if not self.config["logit_shift"]:
            return {**tensors, "loss_mask": prepared["loss_mask"]}
        return predictor_rows(prepared["loss_mask"], **tensors)
