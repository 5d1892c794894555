"""Argument checks shared by corruptions and losses.

Every failure names the argument, the value received and what is allowed, so a wrong call is
fixed from the message alone.
"""

from __future__ import annotations

import math

import torch


def check_ids(name: str, ids: object) -> torch.Tensor:
    """Require an integer tensor of shape ``[B, L]``."""
    if not isinstance(ids, torch.Tensor):
        raise TypeError(f"{name} must be a torch.Tensor [B, L] of token ids, got {type(ids)!r}")
    if ids.dim() != 2:
        raise ValueError(f"{name} must have shape [B, L], got shape {tuple(ids.shape)}")
    if ids.is_floating_point() or ids.is_complex() or ids.dtype == torch.bool:
        raise TypeError(f"{name} must hold integer token ids, got dtype {ids.dtype}")
    return ids


def check_same_shape(name: str, t: object, like: torch.Tensor, like_name: str) -> torch.Tensor:
    """Require a tensor with exactly the shape of ``like``."""
    if not isinstance(t, torch.Tensor):
        raise TypeError(f"{name} must be a torch.Tensor, got {type(t)!r}")
    if t.shape != like.shape:
        raise ValueError(
            f"{name} must have the shape of {like_name} {tuple(like.shape)}, got {tuple(t.shape)}"
        )
    return t


def check_local(name: str, t: object) -> None:
    """Reject a ``DTensor`` (tensor-parallel output) with a message that says what to do.

    Why not accept it: the losses are row-chunked custom autograd over plain tensors; with the
    vocabulary sharded, each log-softmax would need an all-reduce of the max and the sum of
    exponentials over the tensor-parallel group, which they do not do — torch fails deep
    inside (``got mixed torch.Tensor and DTensor``) or, for a replicated DTensor, computes on a
    layout the chunking does not know. Gathering silently would cost the memory tensor
    parallelism exists to save, so the caller chooses.
    """
    try:
        from torch.distributed.tensor import DTensor
    except ImportError:  # a torch build without distributed support has no DTensor
        return
    if isinstance(t, DTensor):
        raise TypeError(
            f"{name} is a DTensor (placements {tuple(t.placements)}, e.g. vocab-sharded logits "
            "from tensor parallelism); dlmkit losses take plain local tensors: pass "
            f"{name}.full_tensor() (gathers the vocabulary on every rank), or let the LM "
            "head return replicated local logits (ColwiseParallel(output_layouts=Replicate(), "
            "use_local_output=True))"
        )


def check_logits(name: str, logits: object, target_ids: torch.Tensor) -> torch.Tensor:
    """Require float logits ``[B, L, V]`` matching ``target_ids [B, L]`` (a plain tensor)."""
    if not isinstance(logits, torch.Tensor):
        raise TypeError(f"{name} must be a torch.Tensor [B, L, V], got {type(logits)!r}")
    check_local(name, logits)
    if logits.dim() != 3 or logits.shape[:2] != target_ids.shape:
        raise ValueError(
            f"{name} must have shape [B, L, V] with [B, L] = {tuple(target_ids.shape)} "
            f"(target_ids), got {tuple(logits.shape)}"
        )
    if not logits.is_floating_point():
        raise TypeError(f"{name} must be a floating-point tensor, got dtype {logits.dtype}")
    return logits


def check_open_unit(name: str, value: float) -> float:
    """Require a real number strictly between 0 and 1."""
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0.0 < value < 1.0:
        raise ValueError(f"{name} must be a number in the open interval (0, 1), got {value!r}")
    return float(value)


def check_unit_from_zero(name: str, value: object) -> float:
    """Require a real number in ``[0, 1)``."""
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0.0 <= value < 1.0:
        raise ValueError(f"{name} must be a number in [0, 1), got {value!r}")
    return float(value)


def check_positive_int(name: str, value: object, minimum: int = 1) -> int:
    """Require an int >= ``minimum``."""
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise ValueError(f"{name} must be an int >= {minimum}, got {value!r}")
    return value


def check_optional_block_size(value: object) -> int | None:
    """``None`` (one unit per row) or an int >= 1."""
    return None if value is None else check_positive_int("block_size", value)


def check_vocab(vocab_size: object, mask_token_id: object | None = None, minimum: int = 3) -> int:
    """Require ``vocab_size >= minimum`` and, if given, ``0 <= mask_token_id < vocab_size``."""
    check_positive_int("vocab_size", vocab_size, minimum)
    if mask_token_id is not None:
        if isinstance(mask_token_id, bool) or not isinstance(mask_token_id, int):
            raise TypeError(f"mask_token_id must be an int, got {mask_token_id!r}")
        if not 0 <= mask_token_id < vocab_size:
            raise ValueError(
                f"mask_token_id must lie in the vocabulary [0, {vocab_size}), got {mask_token_id}"
            )
    return vocab_size


def check_mask_token(mask_token_id: object) -> int:
    """Require a non-negative int token id (the vocabulary is not known here)."""
    if isinstance(mask_token_id, bool) or not isinstance(mask_token_id, int):
        raise TypeError(f"mask_token_id must be an int, got {mask_token_id!r}")
    if mask_token_id < 0:
        raise ValueError(f"mask_token_id must be >= 0, got {mask_token_id}")
    return mask_token_id


def check_denominator(name: str, value: object) -> None:
    """A global denominator: ``None``, a finite number >= 0, or a tensor with one element."""
    if value is None:
        return
    if isinstance(value, torch.Tensor):
        if value.numel() != 1:
            raise ValueError(f"{name} must be a single number, got a tensor of shape "
                             f"{tuple(value.shape)}")
        return
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise TypeError(f"{name} must be None, a number or a 1-element tensor, got {value!r}")
    if not math.isfinite(value) or value < 0:
        raise ValueError(f"{name} must be a finite number >= 0, got {value!r}")
