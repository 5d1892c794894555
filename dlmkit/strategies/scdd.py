"""SCDD: absorbing + uniform channels on the SCDD schedule; the discrete-time NELBO loss."""

from __future__ import annotations

from dlmkit.diffusion import SCDDLoss, corrupt_scdd
from dlmkit.masks.bidirectional import bidirectional

from .base import Strategy


class SCDDStrategy(Strategy):
    name = "scdd"
    options = {"num_timesteps": 1000, "max_ratio": 0.1, "gamma_shape": 1.0, "t_peak": 0.5}

    def validate(self) -> None:
        c = self.config
        self.loss_fn = SCDDLoss(self.mask_token_id, num_timesteps=c["num_timesteps"],
                                max_ratio=c["max_ratio"], gamma_shape=c["gamma_shape"],
                                t_peak=c["t_peak"], chunk_size=self.loss_chunk_size)

    def prepare(self, batch, generators):
        c = self.config
        ids, loss_mask, valid = batch["input_ids"], batch["loss_mask"], batch["attention_valid"]
        noisy, noise_mask, t = corrupt_scdd(
            ids, loss_mask, self.mask_token_id, self.vocab_size, num_timesteps=c["num_timesteps"],
            max_ratio=c["max_ratio"], gamma_shape=c["gamma_shape"], t_peak=c["t_peak"],
            generator=generators)
        mask = self.cached_mask(self.layout_key(batch),
                                lambda: bidirectional(ids.shape[1], valid, device=ids.device))
        return {"input_ids": noisy, "mask": mask, "position_ids": batch["position_ids"],
                "target_ids": ids, "noise_mask": noise_mask, "p_mask": t, "loss_mask": loss_mask}

    def counts(self, prepared):
        return {"num_tokens": (prepared["loss_mask"] != 0).sum()}

    def loss(self, model, prepared, denominators):
        logits = self.logits(model, prepared["input_ids"], prepared["mask"],
                             prepared["position_ids"])
        return self.loss_fn(logits=logits, target_ids=prepared["target_ids"],
                            noisy_ids=prepared["input_ids"], p_mask=prepared["p_mask"],
                            loss_mask=prepared["loss_mask"], num_tokens=denominators["num_tokens"])
