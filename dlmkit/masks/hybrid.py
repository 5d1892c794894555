"""The hybrid AR + diffusion training mask (Nemotron-Labs-Diffusion) over ``[x_t | x_0]``.

One forward pass gives both losses: the noisy half is block-bidirectional and sees the clean
tokens of strictly earlier blocks (the block-diffusion rows of :func:`block_diffusion`), the
clean half is token-causal (the clean rows of :func:`idlm`), so its logits are next-token
predictions.

    hybrid(4, 2)
    x_t  # # . . | . . . .
    x_t  # # . . | . . . .
    x_t  . . # # | # # . .
    x_t  . . # # | # # . .
    x_0  . . . . | # . . .
    x_0  . . . . | # # . .
    x_0  . . . . | # # # .
    x_0  . . . . | # # # #
"""

from __future__ import annotations

import torch

from .checks import check_positive_int, mask_device
from .core import Mask
from .diffusion import block_diffusion, idlm


def _rows(length: int, first: int, last: int, device) -> Mask:
    """Selects query rows ``[first, last)`` (all keys), blocks the others."""

    def rule(b, q, kv):
        return (q >= first) & (q < last) & (kv >= 0)

    def intervals():
        q = torch.arange(length, device=device).view(1, length, 1)
        inside = (q >= first) & (q < last)
        return torch.zeros_like(q), torch.where(inside, length, 0)

    return Mask(rule, length, length, intervals=intervals, name=f"rows_{first}_{last}",
                device=device)


def hybrid(seq_len: int, block_size: int, valid=None, *, doc_ids=None, device=None) -> Mask:
    """Hybrid mask ``[batch, 1, 2L, 2L]``; arguments as in :func:`block_diffusion`."""
    L = check_positive_int("seq_len", seq_len)
    check_positive_int("block_size", block_size)
    device = mask_device(device, valid, doc_ids)
    noisy = block_diffusion(L, block_size, valid, doc_ids=doc_ids, device=device)
    clean = idlm(L, block_size, valid, doc_ids=doc_ids, device=device)
    mask = (noisy & _rows(2 * L, 0, L, device)) | (clean & _rows(2 * L, L, 2 * L, device))
    mask.name = f"hybrid_{L}_{block_size}"
    return mask


EXAMPLES = {"hybrid": lambda seq_len, block_size: hybrid(seq_len, block_size)}
