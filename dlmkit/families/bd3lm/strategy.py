"""BD3-LM: per-block noise levels, ``[x_t | x_0]`` under the block-diffusion mask, MDLM loss."""

from __future__ import annotations

import torch

from dlmkit.diffusion import MDLMLoss
from dlmkit.diffusion.losses import predictor_rows
from dlmkit.families.twostream import TwoStreamStrategy
from dlmkit.masks import block_diffusion

from .options import BD3LMTraining


class BD3LMStrategy(TwoStreamStrategy):
    name = "bd3lm"
    options = BD3LMTraining
    # Runs from before logit_shift existed trained without it (dlmkit.train.resume).
    former_defaults = {"logit_shift": False}
    mask_factory = staticmethod(block_diffusion)
    # Trained defaults (why: docs/families/bd3lm.md#why-these-defaults).
    default_lr = 1.0e-3
    default_steps = 6000
    default_ema_decay = 0.999

    def validate(self) -> None:
        super().validate()
        self._noise_range_options()
        self.loss_fn = MDLMLoss(chunk_size=self.loss_chunk_size)

    def prepare(self, batch, generators):
        batch = self.shift_batch(batch)
        noisy, noise_mask, p_mask = self.corrupt_uniform(batch, generators,
                                                         self.config["block_size"])
        return {**self.two_stream(batch, noisy), "noise_mask": noise_mask, "p_mask": p_mask}

    def counts(self, prepared):
        return {"num_tokens": (prepared["loss_mask"] != 0).sum()}

    def loss(self, model, prepared, denominators):
        length = prepared["target_ids"].shape[1]
        logits = self.logits(model, prepared["input_ids"], prepared["mask"],
                             prepared["position_ids"])
        if not self.config["logit_shift"]:
            return self.loss_fn(logits=logits[:, :length], target_ids=prepared["target_ids"],
                                noise_mask=prepared["noise_mask"], p_mask=prepared["p_mask"],
                                loss_mask=prepared["loss_mask"],
                                num_tokens=denominators["num_tokens"])
        # Shifted: token i is predicted by the row before it. Inside a block that is the noisy
        # row i - 1 (it sees the same noisy block and clean prefix as row i). A block's first
        # token is predicted by the last position of the block before in the *clean* stream:
        # that row sees exactly the clean tokens before i, as an AR head does, while the noisy
        # row there sees the previous block's noise and never this block. Both halves of the
        # [x_t | x_0] logits are scored, each token in exactly one, so nothing is copied.
        rows = predictor_rows(prepared["loss_mask"], target_ids=prepared["target_ids"],
                              noise_mask=prepared["noise_mask"], p_mask=prepared["p_mask"],
                              starts=prepared["position_ids"][:, :length]
                              % self.config["block_size"] == 0)
        clean = rows["starts"]  # row i predicts a block's first token: read the clean stream
        sup = rows["loss_mask"]
        return self.loss_fn(logits=logits, target_ids=rows["target_ids"].repeat(1, 2),
                            noise_mask=rows["noise_mask"].repeat(1, 2),
                            p_mask=rows["p_mask"].repeat(1, 2),
                            loss_mask=torch.cat([sup * ~clean, sup * clean], 1),
                            num_tokens=denominators["num_tokens"])
