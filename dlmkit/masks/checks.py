"""Argument validation shared by every mask factory.

Every check raises ``TypeError`` (wrong kind of value) or ``ValueError`` (right kind, bad value)
with a message that names the argument, the value it got and what is allowed, so a bad call
fails at the factory and never deep inside torch.
"""

from __future__ import annotations

import numbers

import torch


def check_int(name: str, value, *, minimum: int | None = None) -> int:
    """Return ``value`` as a Python int; reject bools, floats and anything below ``minimum``."""
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        if isinstance(value, torch.Tensor) and value.dim() == 0 and not value.is_floating_point():
            value = int(value)
        else:
            raise TypeError(f"{name} must be an int, got {type(value).__name__} {value!r}")
    value = int(value)
    if minimum is not None and value < minimum:
        raise ValueError(f"{name} must be >= {minimum}, got {value}")
    return value


def check_positive_int(name: str, value) -> int:
    return check_int(name, value, minimum=1)


def check_block_size(block_size, name: str = "block_size") -> tuple[int, int]:
    """Normalise a FlexAttention block size: a positive int or a ``(q_block, kv_block)`` pair."""
    if isinstance(block_size, (tuple, list)):
        if len(block_size) != 2:
            raise ValueError(
                f"{name} must be a positive int or a (q_block, kv_block) pair, "
                f"got a sequence of length {len(block_size)}: {block_size!r}"
            )
        return (
            check_positive_int(f"{name}[0]", block_size[0]),
            check_positive_int(f"{name}[1]", block_size[1]),
        )
    try:
        size = check_positive_int(name, block_size)
    except TypeError:
        raise TypeError(
            f"{name} must be a positive int or a (q_block, kv_block) pair, "
            f"got {type(block_size).__name__} {block_size!r}"
        ) from None
    return size, size


def check_valid(valid, seq_len: int, name: str = "valid") -> torch.Tensor | None:
    """Validate a padding mask ``[batch, seq_len]`` (1/True = real token); return it as int8.

    A 1-D tensor of length ``seq_len`` is taken as a single row.
    """
    if valid is None:
        return None
    if not isinstance(valid, torch.Tensor):
        raise TypeError(f"{name} must be a torch.Tensor of shape [batch, {seq_len}], "
                        f"got {type(valid).__name__}")
    if valid.dim() == 1:
        valid = valid.unsqueeze(0)
    if valid.dim() != 2 or valid.shape[1] != seq_len:
        raise ValueError(
            f"{name} must have shape [batch, {seq_len}] (seq_len={seq_len}), "
            f"got {tuple(valid.shape)}"
        )
    if valid.shape[0] < 1:
        raise ValueError(f"{name} must have at least one row, got shape {tuple(valid.shape)}")
    if valid.is_floating_point() or valid.is_complex():
        if not bool(((valid == 0) | (valid == 1)).all()):
            raise ValueError(f"{name} must hold only 0/1 (or bool) values")
    elif valid.dtype != torch.bool and not bool(((valid == 0) | (valid == 1)).all()):
        raise ValueError(f"{name} must hold only 0/1 (or bool) values")
    return valid.to(torch.int8)


def mask_device(device, *tensors) -> torch.device | None:
    """The device a mask is built on: ``device`` when given, else that of the first tensor
    argument (``valid``, ``doc_ids``). Resolved before a factory defines its closures, so that
    the index tensors they build land beside the padding rows they are compared with (a CUDA
    ``valid`` with ``device=None`` must not give CPU ``arange``s)."""
    if device is not None:
        return torch.device(device)
    for tensor in tensors:
        if isinstance(tensor, torch.Tensor):
            return tensor.device
    return None


def int_rows(name: str, value, width: int | None = None) -> torch.Tensor:
    """Integer data given per batch row: a sequence or tensor ``[width]`` (one row, shared) or
    ``[batch, width]``; returns int64 ``[batch, width]``. ``width=None`` accepts any width >= 1.
    """
    shape = "[n]" if width is None else f"[{width}]"
    if isinstance(value, (list, tuple)):
        try:
            value = torch.tensor(value, dtype=torch.int64)
        except (TypeError, ValueError, RuntimeError):
            raise TypeError(f"{name} must be a sequence of ints or an integer tensor "
                            f"{shape} / [batch, ...], got {value!r:.80}") from None
    if not isinstance(value, torch.Tensor):
        raise TypeError(f"{name} must be an integer torch.Tensor of shape {shape} or "
                        f"[batch, {shape[1:-1]}], got {type(value).__name__}")
    if value.is_floating_point() or value.dtype == torch.bool or value.is_complex():
        raise TypeError(f"{name} must hold integers, got dtype {value.dtype}")
    if value.dim() == 1:
        value = value.unsqueeze(0)
    if value.dim() != 2 or value.shape[0] < 1 or value.shape[1] < 1 or \
            (width is not None and value.shape[1] != width):
        raise ValueError(f"{name} must have shape [batch, {shape[1:-1]}] (or {shape} for one "
                         f"row shared by the batch), got {tuple(value.shape)}")
    return value.to(torch.int64)


def check_ids(name: str, ids, seq_len: int, *, minimum: int = 0) -> torch.Tensor:
    """Validate an integer id tensor ``[batch, seq_len]`` (e.g. document ids); return int64."""
    if not isinstance(ids, torch.Tensor):
        raise TypeError(f"{name} must be an integer torch.Tensor of shape [batch, {seq_len}], "
                        f"got {type(ids).__name__}")
    ids = int_rows(name, ids, seq_len)
    if ids.numel() and int(ids.min()) < minimum:
        raise ValueError(f"{name} must be >= {minimum}, got minimum {int(ids.min())}")
    return ids


def broadcast_batch(*batches: int) -> int:
    """Common batch size of several masks/data tensors (1 broadcasts)."""
    out = 1
    for b in batches:
        if b == 1 or b == out:
            continue
        if out != 1:
            raise ValueError(f"batch sizes {batches} do not broadcast (each must be 1 or equal)")
        out = b
    return out
