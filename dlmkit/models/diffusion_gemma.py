"""DiffusionGemma: transformers' own ``DiffusionGemmaForBlockDiffusion``, built, loaded and called.

The architecture (``transformers.models.diffusion_gemma``): an encoder over the clean context
that writes a KV cache, and a decoder over a *canvas* of ``canvas_length`` tokens that reads
that cache (read-only) and attends the canvas bidirectionally, with a self-conditioning input
(the previous denoising step's logits, gated per example). Encoder and decoder share every
transformer weight; the decoder adds the self-conditioning block. Logits are soft-capped.

dlmkit drives it with explicit per-layer-type masks (``{"full_attention": ...,
"sliding_attention": ...}``), which transformers hands to the kernel unchanged:

* encoder: causal over the real tokens; sliding layers also ``kv > q - W`` (transformers'
  window convention: ``W`` keys including the query);
* decoder: :func:`dlmkit.masks.canvas` over ``[encoder keys | canvas keys]``; its sliding
  variant keeps the ``W - 1`` encoder keys before the block, exactly what transformers'
  sliding cache holds at generation time.

The cache is a plain ``DynamicCache()`` (every layer keeps every key), so the sliding limit
comes from the mask alone and a cache built for training or decoding holds the same keys.

The vision tower is part of every DiffusionGemma config; it is never run on text, so it is
frozen (a trained parameter that gets no gradient would stall DDP).
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import torch

from dlmkit.masks import Mask, canvas, canvas_encoder

from .directory import check_model_directory
from .hf import quiet_transformers

MODEL_TYPE = "diffusion_gemma"
LAYER_TYPES = ("full_attention", "sliding_attention")

# A text-only DiffusionGemma small enough to learn the bundled tasks on a CPU in minutes.
# ``layer_types`` is derived from the layer count (sliding layers, last one full) unless given;
# the vision tower is the smallest the config accepts (frozen, never run).
PRESETS: dict[str, dict] = {
    "tiny-diffusion-gemma": {
        "text": dict(hidden_size=128, intermediate_size=256, num_hidden_layers=3,
                     num_attention_heads=4, num_key_value_heads=2, head_dim=32,
                     global_head_dim=32, num_global_key_value_heads=2, num_experts=2,
                     top_k_experts=2, moe_intermediate_size=128, sliding_window=512,
                     max_position_embeddings=1024, pad_token_id=None, eos_token_id=None,
                     bos_token_id=None),
        "vision": dict(model_type="gemma4_vision", hidden_size=8, intermediate_size=8,
                       num_hidden_layers=1, num_attention_heads=1, num_key_value_heads=1,
                       head_dim=8, position_embedding_size=8, patch_size=2),
    },
}


def is_preset(spec: str) -> bool:
    return spec in PRESETS


def model_type_of(path: str | os.PathLike) -> str | None:
    """``model_type`` of a local model directory's ``config.json`` (None if unreadable)."""
    config = Path(path) / "config.json"
    if not config.is_file():
        return None
    try:
        return json.loads(config.read_text()).get("model_type")
    except (json.JSONDecodeError, AttributeError):
        return None


def check_directory(path: str | os.PathLike, what: str = "model.name") -> Path:
    """A local DiffusionGemma directory, or a ValueError saying what it is instead."""
    path = Path(path)
    if not path.is_dir():
        raise ValueError(f"{what} must be a DiffusionGemma preset ({', '.join(PRESETS)}) or a "
                         f"local DiffusionGemma directory, got {str(path)!r} (not a directory)")
    check_model_directory(path, what)  # a run directory, a checkpoint, weights missing
    found = model_type_of(path)
    if found != MODEL_TYPE:
        detail = "no readable config.json" if found is None else f"model_type {found!r}"
        raise ValueError(f"{what}={str(path)!r} is not a DiffusionGemma model ({detail}); the "
                         f"block_diffusion strategy trains transformers' "
                         f"DiffusionGemmaForBlockDiffusion (model_type {MODEL_TYPE!r})")
    return path


def _check_text_config(model) -> None:
    text = model.config.get_text_config()
    if getattr(text, "use_bidirectional_attention", None) == "all":
        # A bidirectional encoder makes a prefix's keys depend on later tokens, so one encoder
        # pass over the clean sequence would leak every canvas block's answer.
        raise ValueError("DiffusionGemma with text_config.use_bidirectional_attention='all' is "
                         "not supported: block diffusion needs a causal encoder")


def freeze_vision(model) -> None:
    """Text-only training: the vision tower and its projection are never run; freeze them."""
    encoder = model.model.encoder
    for module in (encoder.vision_tower, encoder.embed_vision):
        module.requires_grad_(False)


def build(spec: str, vocab_size: int, *, attention: str, dtype: torch.dtype = torch.float32,
          overrides: dict | None = None, canvas_length: int | None = None):
    """``DiffusionGemmaForBlockDiffusion`` from a preset (``overrides`` apply to its text
    config; ``canvas_length`` sets the config's canvas) or a local DiffusionGemma directory
    (loaded as it is; ``canvas_length``, if given, must fit its canvas and then replaces it,
    so the model's own ``generate`` decodes the blocks it was trained on)."""
    from transformers import DiffusionGemmaConfig, DiffusionGemmaForBlockDiffusion

    if spec in PRESETS:
        text = dict(PRESETS[spec]["text"])
        text.update(overrides or {})
        n = text["num_hidden_layers"]
        text.setdefault("layer_types", ["sliding_attention"] * (n - 1) + ["full_attention"])
        config = DiffusionGemmaConfig(text_config=dict(vocab_size=vocab_size, **text),
                                      vision_config=dict(PRESETS[spec]["vision"]),
                                      canvas_length=canvas_length or 8)
        model = DiffusionGemmaForBlockDiffusion._from_config(
            config, attn_implementation=attention, dtype=dtype)
    else:
        path = check_directory(spec)
        if overrides:
            raise ValueError(f"model.config overrides apply to presets only, got {overrides}")
        with quiet_transformers():
            model = DiffusionGemmaForBlockDiffusion.from_pretrained(
                path, attn_implementation=attention, dtype=dtype, local_files_only=True)
        rows = model.get_input_embeddings().num_embeddings
        if rows < vocab_size:
            raise ValueError(f"{path}: the model has {rows} embeddings, fewer than the "
                             f"tokenizer's vocabulary ({vocab_size}); use its own tokenizer")
        if canvas_length is not None:
            check_block_size(canvas_length, model)
            model.config.canvas_length = canvas_length
    _check_text_config(model)
    freeze_vision(model)
    return model


def check_block_size(block_size: int, model) -> None:
    """The canvas blocks must fit the model's canvas (``config.canvas_length``)."""
    limit = model.config.canvas_length
    if limit is not None and block_size > limit:
        raise ValueError(f"strategy.block_size={block_size} does not fit the model's canvas "
                         f"(config.canvas_length={limit}); use a block size <= {limit}")


def load(path: str | os.PathLike, *, attention: str = "sdpa", device="cpu"):
    """An exported DiffusionGemma directory in eval mode."""
    from transformers import DiffusionGemmaForBlockDiffusion

    path = check_directory(path, what="--model")
    with quiet_transformers():
        model = DiffusionGemmaForBlockDiffusion.from_pretrained(
            path, attn_implementation=attention, local_files_only=True)
    _check_text_config(model)
    return model.to(device).eval()


def unwrap(model):
    """The DiffusionGemma inside a DDP wrapper (or the model itself)."""
    return getattr(model, "module", model)


def layer_types(model) -> tuple[str, ...]:
    return tuple(sorted(set(unwrap(model).config.get_text_config().layer_types)))


def sliding_window(model) -> int | None:
    """``W`` of the sliding layers (None when the model has none)."""
    text = unwrap(model).config.get_text_config()
    return text.sliding_window if "sliding_attention" in text.layer_types else None


def implementation(model) -> str:
    return unwrap(model).config.get_text_config()._attn_implementation or "sdpa"


def encoder_masks(model, seq_len: int, valid, *, cache=None, key: tuple = ()) -> dict:
    """``{layer type: Mask}`` of the encoder over ``seq_len`` clean tokens (``valid [B, L]``).

    ``cache(key, build)`` (a strategy's ``cached_mask``) reuses masks of a repeated layout."""
    window = sliding_window(model)
    build = {"full_attention": lambda: canvas_encoder(seq_len, valid),
             "sliding_attention": lambda: canvas_encoder(seq_len, valid, window)}
    return {t: build[t]() if cache is None else cache(("encoder", t, window, *key), build[t])
            for t in layer_types(model)}


def decoder_masks(model, starts, lengths, enc_len: int, block_size: int, canvas_len: int,
                  valid=None, *, full: Mask | None = None) -> dict:
    """``{layer type: Mask}`` of the decoder: canvas rows over ``[encoder | canvas]`` keys
    (:func:`dlmkit.masks.canvas` with ``prefix = starts``, ``response = lengths``)."""
    out = {}
    for t in layer_types(model):
        if t == "full_attention" and full is not None:
            out[t] = full
            continue
        window = sliding_window(model) if t == "sliding_attention" else None
        out[t] = canvas(starts, lengths, enc_len, block_size, window, canvas_length=canvas_len,
                        valid=valid)
    return out


def rendered(masks: dict, model, dtype: torch.dtype = torch.float32) -> dict:
    """The masks as transformers takes them for the model's attention backend."""
    from .attention import mask_argument

    impl = implementation(model)
    return {t: mask_argument(m, impl, dtype) for t, m in masks.items()}


def softcapped_logits(model, hidden: torch.Tensor) -> torch.Tensor:
    """The LM head on ``hidden [B, T, H]`` with the model's final soft-cap, float32 — how
    ``DiffusionGemmaForBlockDiffusion`` turns decoder states into logits (used for the
    encoder's co-trained next-token loss)."""
    inner = unwrap(model)
    cap = inner.final_logit_softcapping
    logits = inner.lm_head(hidden).float()
    return logits if cap is None else torch.tanh(logits / cap) * cap


def new_cache():
    from transformers import DynamicCache

    return DynamicCache()
