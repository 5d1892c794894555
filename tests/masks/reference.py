"""Brute-force references written from the specifications, one (b, q, kv) triple at a time.

Deliberately naive Python: they share no code with ``dlmkit.masks``.
"""

from __future__ import annotations

import torch


def grid(batch: int, q_len: int, kv_len: int, allowed) -> torch.Tensor:
    out = torch.zeros(batch, q_len, kv_len, dtype=torch.bool)
    for b in range(batch):
        for q in range(q_len):
            for k in range(kv_len):
                out[b, q, k] = bool(allowed(b, q, k))
    return out


def with_padding(valid, seq_len: int, base):
    """Padded keys blocked in every copy; padded queries see only themselves."""
    if valid is None:
        return base

    def allowed(b, q, k):
        if q == k:
            return True
        return bool(valid[b][q % seq_len]) and bool(valid[b][k % seq_len]) and base(b, q, k)

    return allowed


def causal_ref(q_len, kv_len, offset):
    return lambda b, q, k: k <= q + offset


def block_diffusion_ref(L, S):
    def allowed(b, q, k):
        q_noisy, k_noisy = q < L, k < L
        bq, bk = (q % L) // S, (k % L) // S
        if q_noisy and k_noisy:
            return bq == bk
        if q_noisy and not k_noisy:
            return bk < bq
        if not q_noisy and not k_noisy:
            return bk <= bq
        return False

    return allowed


def idlm_ref(L, S):
    def allowed(b, q, k):
        q_noisy, k_noisy = q < L, k < L
        bq, bk = (q % L) // S, (k % L) // S
        if q_noisy and k_noisy:
            return bq == bk and k <= q
        if q_noisy and not k_noisy:
            return bk < bq
        if not q_noisy and not k_noisy:
            return k <= q
        return False

    return allowed
