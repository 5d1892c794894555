"""Hugging Face causal LMs: load one from a local directory or create a tiny one from a preset.

Diffusion training needs no change to the architecture: the attention pattern arrives as an
explicit mask (transformers passes a 4-D mask or a ``BlockMask`` to the kernel unchanged), and
the ``[x_t | x_0]`` layouts get their position ids from the strategy.
"""

from __future__ import annotations

import os
from pathlib import Path

import torch

# Tiny models that learn the bundled tasks on a laptop CPU in minutes (no download).
PRESETS: dict[str, dict] = {
    "tiny-llama": dict(model_type="llama", hidden_size=128, intermediate_size=384,
                       num_hidden_layers=3, num_attention_heads=4, num_key_value_heads=4,
                       max_position_embeddings=1024, rope_theta=10000.0,
                       tie_word_embeddings=False),
    "tiny-qwen3": dict(model_type="qwen3", hidden_size=128, intermediate_size=384,
                       num_hidden_layers=3, num_attention_heads=4, num_key_value_heads=2,
                       head_dim=32, max_position_embeddings=1024, tie_word_embeddings=False),
    "small-llama": dict(model_type="llama", hidden_size=256, intermediate_size=768,
                        num_hidden_layers=4, num_attention_heads=8, num_key_value_heads=8,
                        max_position_embeddings=2048, tie_word_embeddings=False),
}

ATTENTION_BACKENDS = ("auto", "sdpa", "flex_attention", "eager")


def resolve_attention(requested: str, device: torch.device) -> str:
    """``auto`` picks FlexAttention with our ``BlockMask``s on CUDA, SDPA with dense masks
    elsewhere (FlexAttention has no backward on CPU)."""
    if requested not in ATTENTION_BACKENDS:
        raise ValueError(f"model.attention must be one of {ATTENTION_BACKENDS}, got {requested!r}")
    if requested == "auto":
        return "flex_attention" if device.type == "cuda" else "sdpa"
    return requested


def build_model(spec: str, vocab_size: int, *, attention: str, dtype: torch.dtype = torch.float32,
                overrides: dict | None = None):
    """A causal LM from a preset name (``tiny-llama``...) or a local HF model directory.

    The embeddings are resized to ``vocab_size`` when the tokenizer has more tokens (e.g. an
    added mask token).
    """
    from transformers import AutoConfig, AutoModelForCausalLM

    if spec in PRESETS:
        params = dict(PRESETS[spec])
        params.update(overrides or {})
        model_type = params.pop("model_type")
        config = AutoConfig.for_model(model_type, vocab_size=vocab_size, **params)
        model = AutoModelForCausalLM.from_config(config, attn_implementation=attention,
                                                 dtype=dtype)
    elif os.path.isdir(spec):
        if overrides:
            raise ValueError(f"model.config overrides apply to presets only, got {overrides}")
        model = AutoModelForCausalLM.from_pretrained(spec, attn_implementation=attention,
                                                     dtype=dtype, local_files_only=True)
        if model.get_input_embeddings().num_embeddings < vocab_size:
            model.resize_token_embeddings(vocab_size)
    else:
        raise ValueError(f"model.name must be a preset ({', '.join(PRESETS)}) or a local "
                         f"model directory, got {spec!r} (not a directory)")
    return model


def load_exported(path: str | Path, *, attention: str = "sdpa", device: str | torch.device = "cpu"):
    """Load a model directory written by ``dlmkit train`` (``RUN/final``) for inference."""
    from transformers import AutoModelForCausalLM
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()  # a weight-loading bar per call clutters generate/eval
    path = Path(path)
    from .lora import is_adapter_dir, load_adapter_export

    if is_adapter_dir(path) and not (path / "config.json").is_file():  # model.lora.export=adapter
        return load_adapter_export(path, attention=attention, device=device)
    if not (path / "config.json").is_file():
        raise ValueError(f"{path} is not a model directory (no config.json); pass RUN/final")
    model = AutoModelForCausalLM.from_pretrained(path, attn_implementation=attention,
                                                 local_files_only=True)
    return model.to(device).eval()
