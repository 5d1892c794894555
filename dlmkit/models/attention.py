"""Feeding a ``Mask`` to a Hugging Face model, whatever its attention backend."""

from __future__ import annotations

import weakref

import torch

from dlmkit.masks import Mask

# Rendered forms of masks still alive: a strategy's MaskCache hands back the same Mask for a
# repeated layout, so its dense/additive/BlockMask form is built once, not on every forward.
_RENDERED: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def mask_argument(mask: Mask, implementation: str, dtype: torch.dtype, block_size: int = 128):
    """What to pass as ``attention_mask``: a ``BlockMask`` for FlexAttention, a bool mask for
    SDPA, an additive float mask for eager attention (which *adds* its mask, so a bool mask
    there would be silently wrong)."""
    if implementation not in ("flex_attention", "sdpa", "eager"):
        raise ValueError(f"unknown attention implementation {implementation!r}")
    rendered = _RENDERED.setdefault(mask, {})
    key = (implementation, dtype, block_size)
    if key not in rendered:
        if implementation == "flex_attention":
            rendered[key] = mask.block_mask(block_size)
        elif implementation == "sdpa":
            rendered[key] = mask.dense()
        else:
            rendered[key] = mask.additive(dtype)
    return rendered[key]


def forward_logits(model, input_ids: torch.Tensor, mask: Mask, position_ids: torch.Tensor,
                   dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """``model(input_ids)`` under ``mask`` with explicit positions; returns logits [B, T, V]."""
    # DDP wraps the HF model (``.module``); call the wrapper, read the config from inside.
    implementation = getattr(model, "module", model).config._attn_implementation
    attention_mask = mask_argument(mask, implementation, dtype)
    if isinstance(attention_mask, torch.Tensor) and attention_mask.shape[0] != input_ids.shape[0]:
        attention_mask = attention_mask.expand(input_ids.shape[0], *attention_mask.shape[1:])
    out = model(input_ids=input_ids, attention_mask=attention_mask, position_ids=position_ids,
                use_cache=False)
    return out.logits
