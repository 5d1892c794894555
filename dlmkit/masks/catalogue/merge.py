"""Merge two attention results over disjoint key sets by their log-sum-exp.

Split-prefix attention computes ``softmax(s) @ V`` over a shared prefix once and over each
continuation separately; the exact full result is recovered from the two partial outputs and
their LSEs::

    lse   = log(exp(lse_a) + exp(lse_b))
    out   = exp(lse_a - lse) * out_a + exp(lse_b - lse) * out_b

A row that saw no key in one part has LSE ``-inf`` there and that part gets weight 0; a row
that saw no key in either part merges to output 0 and LSE ``-inf`` (the convention of
``flex_attention``), never NaN.
"""

from __future__ import annotations

import torch


def _check(name: str, value) -> torch.Tensor:
    if not isinstance(value, torch.Tensor):
        raise TypeError(f"{name} must be a torch.Tensor, got {type(value).__name__}")
    if not value.is_floating_point():
        raise TypeError(f"{name} must be floating point, got dtype {value.dtype}")
    return value


def merge_attention(out: torch.Tensor, lse: torch.Tensor, other_out: torch.Tensor,
                    other_lse: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Merge ``(out, lse)`` and ``(other_out, other_lse)`` computed over disjoint keys.

    Args:
        out, other_out: attention outputs ``[..., q_len, head_dim]`` (same shape).
        lse, other_lse: natural-log sum-exp of the scaled scores per query, ``[..., q_len]``
            (``out.shape[:-1]``), ``-inf`` for rows that attended to nothing.

    Returns:
        ``(merged_out, merged_lse)``: ``merged_out`` in ``out``'s dtype, ``merged_lse`` in
        float32 (or float64 when an input is float64). The arithmetic runs in that precision.
    """
    out, lse = _check("out", out), _check("lse", lse)
    other_out, other_lse = _check("other_out", other_out), _check("other_lse", other_lse)
    if out.shape != other_out.shape:
        raise ValueError(f"out and other_out must have the same shape, got "
                         f"{tuple(out.shape)} and {tuple(other_out.shape)}")
    if out.dim() < 1 or lse.shape != out.shape[:-1] or other_lse.shape != out.shape[:-1]:
        raise ValueError(f"lse and other_lse must have shape out.shape[:-1] = "
                         f"{tuple(out.shape[:-1])}, got {tuple(lse.shape)} and "
                         f"{tuple(other_lse.shape)}")
    wide = torch.float64 if torch.float64 in (out.dtype, lse.dtype, other_out.dtype,
                                              other_lse.dtype) else torch.float32
    a, b = lse.to(wide), other_lse.to(wide)
    top = torch.maximum(a, b)
    top = torch.where(torch.isfinite(top), top, torch.zeros_like(top))  # both -inf rows
    wa, wb = torch.exp(a - top), torch.exp(b - top)
    total = wa + wb
    merged_lse = top + torch.log(total)  # log(0) = -inf for rows with no key at all
    safe = torch.where(total > 0, total, torch.ones_like(total))
    merged = (out.to(wide) * (wa / safe).unsqueeze(-1)
              + other_out.to(wide) * (wb / safe).unsqueeze(-1))
    return merged.to(out.dtype), merged_lse
