"""SCDD: absorbing + uniform channels on the SCDD schedule; the discrete-time NELBO loss."""

from __future__ import annotations

from dlmkit.diffusion import SCDDLoss, corrupt_scdd
from dlmkit.families.mdlm.strategy import MDLMStrategy

from .options import SCDDTraining


class SCDDStrategy(MDLMStrategy):
    """Same layout and denominators as MDLM; its own corruption and loss."""

    name = "scdd"
    options = SCDDTraining
    # What a checkpoint that records no option trained with: scdd's defaults before t_min 0.2
    # and stratified times (and before logit_shift existed).
    former_defaults = {"t_min": 0.0, "time_sampling": "iid", "logit_shift": False}
    # Trained defaults (why: docs/families/scdd.md#why-these-defaults).
    default_steps = 10000
    default_ema_decay = 0.999
    default_lr = 1.0e-3

    def validate(self) -> None:
        c = self.config
        self.loss_fn = SCDDLoss(self.mask_token_id, num_timesteps=c["num_timesteps"],
                                max_ratio=c["max_ratio"], gamma_shape=c["gamma_shape"],
                                t_peak=c["t_peak"], chunk_size=self.loss_chunk_size,
                                vocab_size=self.vocab_size)

    def prepare(self, batch, generators):
        c = self.config
        batch = self.shift_batch(batch)
        stratum, num = self.time_strata(batch)  # one time per row: its first position's slot
        noisy, noise_mask, t = corrupt_scdd(
            batch["input_ids"], batch["loss_mask"], self.mask_token_id, self.vocab_size,
            num_timesteps=c["num_timesteps"], max_ratio=c["max_ratio"],
            gamma_shape=c["gamma_shape"], t_peak=c["t_peak"], t_min=c["t_min"],
            stratum=None if stratum is None else stratum[:, 0], num_strata=num,
            generator=generators)
        return self.one_stream(batch, noisy, noise_mask, t)

    def loss(self, model, prepared, denominators):
        logits = self.logits(model, prepared["input_ids"], prepared["mask"],
                             prepared["position_ids"])
        p = self.scored_rows(prepared, "target_ids", "input_ids", "p_mask")
        return self.loss_fn(logits=logits, target_ids=p["target_ids"], noisy_ids=p["input_ids"],
                            p_mask=p["p_mask"], loss_mask=p["loss_mask"],
                            num_tokens=denominators["num_tokens"])
