"""DFlash: a block-diffusion drafter trained against a frozen causal target, decoded by
speculative decoding (token for token the target's greedy output)."""

from dlmkit.families.family import Drafting, Family

from .decode import decode_dflash
from .options import DFlashSampling, DFlashTraining
from .pair import attach_draft, check_draft_pair, summary
from .strategy import DFlashStrategy

FAMILY = Family(
    name="dflash", paper="DFlash (block-diffusion drafting for speculative decoding)",
    trains="a drafter's masked blocks, conditioned on a frozen target's hidden states",
    strategy=DFlashStrategy, sampling=DFlashSampling, training=DFlashTraining,
    decode=decode_dflash,
    drafting=Drafting(check=check_draft_pair, attach=attach_draft, summary=summary))
