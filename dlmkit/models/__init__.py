"""Models: Hugging Face causal LMs driven with dlmkit masks."""

from .attention import forward_logits, mask_argument
from .hf import ATTENTION_BACKENDS, PRESETS, build_model, load_exported, resolve_attention

__all__ = ["ATTENTION_BACKENDS", "PRESETS", "build_model", "forward_logits", "load_exported",
           "mask_argument", "resolve_attention"]
