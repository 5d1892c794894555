"""Objectives of the dLLM families: corruption processes, schedules and losses (pure torch).

See :mod:`.corruption` for the ``(noisy_ids, noise_mask, p_mask)`` contract and
:mod:`.losses` for the keyword-argument calling convention and the denominator rule.
"""

from dlmkit.diffusion.chunked import weighted_token_loss
from dlmkit.diffusion.corruption import (
    corrupt_all_masked,
    corrupt_blockwise,
    corrupt_mix,
    corrupt_scdd,
    corrupt_uniform,
    corrupt_uniform_random,
)
from dlmkit.diffusion.losses import (
    BlockDiffusionLoss,
    DFlashDecayLoss,
    HybridLoss,
    IDLMLoss,
    LossOutput,
    MDLMLoss,
    SCDDLoss,
    encoder_ar_loss,
    next_token_loss,
)
from dlmkit.diffusion.schedules import SCDDMasses, scdd_schedule

__all__ = [
    "BlockDiffusionLoss",
    "DFlashDecayLoss",
    "HybridLoss",
    "IDLMLoss",
    "LossOutput",
    "MDLMLoss",
    "SCDDLoss",
    "SCDDMasses",
    "corrupt_all_masked",
    "corrupt_blockwise",
    "corrupt_mix",
    "corrupt_scdd",
    "corrupt_uniform",
    "corrupt_uniform_random",
    "encoder_ar_loss",
    "next_token_loss",
    "scdd_schedule",
    "weighted_token_loss",
]
