"""Attention masks: one rule -> dense bool, additive float and FlexAttention ``BlockMask``."""

from .cache import MaskCache
from .causal import causal
from .core import Mask
from .diffusion import block_diffusion, idlm
from .tiles import EMPTY, FULL, PARTIAL

__all__ = ["EMPTY", "FULL", "PARTIAL", "Mask", "MaskCache", "block_diffusion", "causal", "idlm"]
