"""Hybrid AR + diffusion (Nemotron-Labs-Diffusion): one pass over ``[x_t | x_0]`` gives the
diffusion logits (noisy half) and next-token logits (clean half); loss ``alpha L_diff + L_AR``.
"""

from __future__ import annotations

from dlmkit.diffusion import HybridLoss, corrupt_blockwise
from dlmkit.diffusion.losses import next_token_scored
from dlmkit.families.twostream import TwoStreamStrategy
from dlmkit.masks.hybrid import hybrid

from .options import HybridTraining


class HybridStrategy(TwoStreamStrategy):
    name = "hybrid"
    options = HybridTraining
    mask_factory = staticmethod(hybrid)
    # Trained defaults (why: docs/families/hybrid.md#why-these-defaults).
    default_lr = 1.0e-3
    default_steps = 3000

    def validate(self) -> None:
        super().validate()
        self._noise_range_options()
        default = self.defaults()["half_life_ratio"]
        if self.config["corruption"] == "uniform" and self.config["half_life_ratio"] != default:
            # The late-position bias is blockwise's; the uniform corruption has no use for it.
            raise ValueError(f"strategy.half_life_ratio is read by corruption 'blockwise' only; "
                             f"with corruption 'uniform' leave it at {default}, got "
                             f"{self.config['half_life_ratio']!r}")
        self.loss_fn = HybridLoss(alpha=self.config["alpha"], chunk_size=self.loss_chunk_size)

    def prepare(self, batch, generators):
        c = self.config
        if c["corruption"] == "uniform":
            noisy, noise_mask, p_mask = self.corrupt_uniform(batch, generators)
        else:
            stratum, num = self.time_strata(batch, c["block_size"])
            noisy, noise_mask, p_mask = self.corrupt(
                corrupt_blockwise, batch, generators, self.mask_token_id,
                block_size=c["block_size"], eps=float(c["t_min"]), t_max=float(c["t_max"]),
                half_life_ratio=c["half_life_ratio"], stratum=stratum, num_strata=num)
        return {**self.two_stream(batch, noisy), "noise_mask": noise_mask, "p_mask": p_mask}

    def counts(self, prepared):
        supervised = prepared["loss_mask"] != 0
        return {"num_tokens": (prepared["noise_mask"] & supervised).sum(),
                "num_ar_tokens": next_token_scored(supervised, prepared["doc_ids"]).sum()}

    def loss(self, model, prepared, denominators):
        length = prepared["target_ids"].shape[1]
        logits = self.logits(model, prepared["input_ids"], prepared["mask"],
                             prepared["position_ids"])
        return self.loss_fn(logits=logits[:, :length], causal_logits=logits[:, length:],
                            target_ids=prepared["target_ids"], noise_mask=prepared["noise_mask"],
                            p_mask=prepared["p_mask"], loss_mask=prepared["loss_mask"],
                            num_tokens=denominators["num_tokens"],
                            num_ar_tokens=denominators["num_ar_tokens"],
                            doc_ids=prepared["doc_ids"])
