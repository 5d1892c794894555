"""The gallery: attention patterns that no dLLM family trains or decodes with.

The attention-gym catalogue (sliding windows, prefix LM, documents, Flamingo, NATTEN, STA and
Sparse VideoGen, VSA, JetSpec trees, the log-sum-exp merge) and the chunk-causal video/action
masks with their token tags. Each is a rule on top of the engine in :mod:`dlmkit.masks`
(``Mask``, tiles, block construction, padding): these modules import the engine, the engine
never imports them (``tests/masks/test_layout.py``). Every name here is also exported by
:mod:`dlmkit.masks`.
"""

from .chunk_causal import chunk_causal, expert_cross, expert_self
from .document import batchify, document, packed_causal_document, shared_prefix
from .jetspec import jetspec_training, jetspec_tree
from .merge import merge_attention
from .natten import natten
from .prefix import prefix_lm
from .tags import KIND_CLEAN, KIND_GLOBAL, KIND_NOISED, Slot, TokenTags, window_tags
from .video import sta, svg_spatial, svg_temporal
from .vision import flamingo
from .vsa import vsa
from .window import dilated_sliding_window, global_sliding_window, sliding_window

__all__ = [
    "KIND_CLEAN", "KIND_GLOBAL", "KIND_NOISED", "Slot", "TokenTags", "batchify", "chunk_causal",
    "dilated_sliding_window", "document", "expert_cross", "expert_self", "flamingo",
    "global_sliding_window", "jetspec_training", "jetspec_tree", "merge_attention", "natten",
    "packed_causal_document", "prefix_lm", "shared_prefix", "sliding_window", "sta",
    "svg_spatial", "svg_temporal", "vsa", "window_tags",
]
