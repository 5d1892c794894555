"""Attention masks: one rule -> dense bool, additive float and FlexAttention ``BlockMask``.

Every factory returns a :class:`Mask`; see ``docs/gallery.md`` for pictures of each and
``dlmkit mask list`` / ``dlmkit mask show NAME`` on the command line.

The modules directly in this package are the engine: ``Mask`` and its tiles, block
construction, rendering and padding, and the masks the dLLM families train and decode with
(causal, bidirectional, block diffusion / I-DLM, hybrid, DFlash, canvas, the decode masks).
The patterns no family uses live in :mod:`dlmkit.masks.catalogue`; their names are exported
here as well.
"""

from .bidirectional import bidirectional
from .cache import MaskCache
from .canvas import canvas, canvas_encoder
from .catalogue import (
    KIND_CLEAN,
    KIND_GLOBAL,
    KIND_NOISED,
    Slot,
    TokenTags,
    batchify,
    chunk_causal,
    dilated_sliding_window,
    document,
    expert_cross,
    expert_self,
    flamingo,
    global_sliding_window,
    jetspec_training,
    jetspec_tree,
    merge_attention,
    natten,
    packed_causal_document,
    prefix_lm,
    shared_prefix,
    sliding_window,
    sta,
    svg_spatial,
    svg_temporal,
    vsa,
    window_tags,
)
from .causal import causal
from .core import Mask
from .decode import block_diffusion_decode, causal_decode, dflash_decode, idlm_decode
from .dflash import dflash
from .diffusion import block_diffusion, idlm
from .hybrid import hybrid
from .tiles import EMPTY, FULL, PARTIAL

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
