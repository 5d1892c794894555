"""Models: Hugging Face causal LMs driven with dlmkit masks."""

from .attention import forward_logits, mask_argument
from .directory import check_model_directory
from .hf import (
    ATTENTION_BACKENDS,
    PRESETS,
    build_model,
    load_exported,
    make_readable,
    quiet_transformers,
    resolve_attention,
    write_token_ids,
)

__all__ = ["ATTENTION_BACKENDS", "PRESETS", "build_model", "check_model_directory",
           "forward_logits", "load_exported", "make_readable", "mask_argument",
           "quiet_transformers", "resolve_attention", "write_token_ids"]
