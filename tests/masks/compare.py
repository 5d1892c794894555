"""Shared checks: a dlmkit ``Mask`` against brute force and against torch's own builders."""

from __future__ import annotations

import torch
from torch.nn.attention.flex_attention import create_block_mask, create_mask

BLOCK_FIELDS = (
    "kv_num_blocks", "kv_indices", "full_kv_num_blocks", "full_kv_indices",
    "q_num_blocks", "q_indices", "full_q_num_blocks", "full_q_indices",
)


def assert_dense_equals(mask, expected: torch.Tensor) -> None:
    """``expected``: bool ``[batch, q_len, kv_len]`` from a brute-force reference."""
    dense = mask.dense()
    assert dense.dtype == torch.bool
    assert dense.shape == (mask.batch, 1, mask.q_len, mask.kv_len)
    diff = (dense[:, 0] != expected).nonzero()
    where = diff[:5].tolist()
    assert diff.numel() == 0, f"{mask.name}: dense differs from reference at (b, q, kv) {where}"


def assert_matches_create_mask(mask) -> None:
    ref = create_mask(mask.mask_mod, mask.batch, None, mask.q_len, mask.kv_len, device="cpu")
    assert torch.equal(mask.dense(), ref), f"{mask.name}: dense != create_mask(mask_mod)"


def assert_block_masks_equal(ours, theirs, context: str = "") -> None:
    assert ours.seq_lengths == theirs.seq_lengths, context
    assert tuple(ours.BLOCK_SIZE) == tuple(theirs.BLOCK_SIZE), context
    for field in BLOCK_FIELDS:
        a, b = getattr(ours, field), getattr(theirs, field)
        assert a.shape == b.shape, f"{context}: {field} shape {tuple(a.shape)} != {tuple(b.shape)}"
        assert a.dtype == b.dtype, f"{context}: {field} dtype {a.dtype} != {b.dtype}"
        assert torch.equal(a, b), f"{context}: {field} differs\nours={a}\ntorch={b}"
        # Equal values are not enough: the compiled CUDA backward reads the lists as
        # contiguous rows (transposed strides gave equal tensors and wrong dK/dV on a GPU).
        assert a.is_contiguous(), f"{context}: {field} has strides {a.stride()}, not contiguous"


def assert_matches_create_block_mask(mask, block_size) -> None:
    ours = mask.block_mask(block_size)
    theirs = create_block_mask(mask.mask_mod, mask.batch, None, mask.q_len, mask.kv_len,
                               device="cpu", BLOCK_SIZE=block_size)
    assert_block_masks_equal(ours, theirs, f"{mask.name} block_size={block_size}")


def assert_no_empty_rows(mask) -> None:
    rows = mask.dense()[:, 0].any(-1)
    assert bool(rows.all()), f"{mask.name}: fully blocked rows at {(~rows).nonzero()[:5].tolist()}"


def assert_flex_matches_sdpa(mask, block_size=16, heads=2, dim=8, seed=0) -> None:
    """Eager flex_attention with ``.block_mask()`` equals SDPA with ``.dense()`` and
    ``.additive()`` (forward, CPU)."""
    from torch.nn.attention.flex_attention import flex_attention

    g = torch.Generator().manual_seed(seed)
    q = torch.randn(mask.batch, heads, mask.q_len, dim, generator=g, dtype=torch.float64)
    k = torch.randn(mask.batch, heads, mask.kv_len, dim, generator=g, dtype=torch.float64)
    v = torch.randn(mask.batch, heads, mask.kv_len, dim, generator=g, dtype=torch.float64)
    flex = flex_attention(q, k, v, block_mask=mask.block_mask(block_size))
    sdpa_bool = torch.nn.functional.scaled_dot_product_attention(q, k, v, attn_mask=mask.dense())
    sdpa_add = torch.nn.functional.scaled_dot_product_attention(
        q, k, v, attn_mask=mask.additive(torch.float64))
    torch.testing.assert_close(flex, sdpa_bool, rtol=1e-9, atol=1e-9)
    torch.testing.assert_close(sdpa_add, sdpa_bool, rtol=1e-9, atol=1e-9)


def full_check(mask, expected: torch.Tensor, block_sizes=(1, 3, 8, (4, 2), (2, 5), 128)) -> None:
    """Brute force, create_mask and create_block_mask for several block sizes, no empty row."""
    assert_dense_equals(mask, expected)
    assert_matches_create_mask(mask)
    for bs in block_sizes:
        assert_matches_create_block_mask(mask, bs)
    assert_no_empty_rows(mask)
