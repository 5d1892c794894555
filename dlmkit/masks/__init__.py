"""Attention masks: one rule -> dense bool, additive float and FlexAttention ``BlockMask``.

Every factory returns a :class:`Mask`; see ``docs/gallery.md`` for pictures of each and
``dlmkit mask list`` / ``dlmkit mask show NAME`` on the command line.
"""

from .bidirectional import bidirectional
from .cache import MaskCache
from .canvas import canvas, canvas_encoder
from .causal import causal
from .chunk_causal import chunk_causal, expert_cross, expert_self
from .core import Mask
from .decode import block_diffusion_decode, causal_decode, dflash_decode, idlm_decode
from .dflash import dflash
from .diffusion import block_diffusion, idlm
from .document import batchify, document, packed_causal_document, shared_prefix
from .hybrid import hybrid
from .jetspec import jetspec_training, jetspec_tree
from .merge import merge_attention
from .natten import natten
from .prefix import prefix_lm
from .tags import KIND_CLEAN, KIND_GLOBAL, KIND_NOISED, Slot, TokenTags, window_tags
from .tiles import EMPTY, FULL, PARTIAL
from .video import sta, svg_spatial, svg_temporal
from .vision import flamingo
from .vsa import vsa
from .window import dilated_sliding_window, global_sliding_window, sliding_window

__all__ = [
    "EMPTY", "FULL", "KIND_CLEAN", "KIND_GLOBAL", "KIND_NOISED", "PARTIAL", "Mask", "MaskCache",
    "Slot", "TokenTags", "batchify", "bidirectional", "block_diffusion",
    "block_diffusion_decode", "canvas", "canvas_encoder", "causal", "causal_decode",
    "chunk_causal", "dflash",
    "dflash_decode", "dilated_sliding_window", "document", "expert_cross", "expert_self",
    "flamingo", "global_sliding_window", "hybrid", "idlm", "idlm_decode", "jetspec_training",
    "jetspec_tree", "merge_attention", "natten", "packed_causal_document", "prefix_lm",
    "shared_prefix", "sliding_window", "sta", "svg_spatial", "svg_temporal", "vsa",
    "window_tags",
]
