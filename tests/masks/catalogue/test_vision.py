import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from torch.nn.attention.flex_attention import AuxRequest, flex_attention

from dlmkit.masks.catalogue.vision import flamingo, flamingo_covered_rows
from tests.masks.compare import (
    assert_dense_equals,
    assert_matches_create_block_mask,
    assert_matches_create_mask,
    full_check,
)
from tests.masks.reference import grid
from tests.masks.reference_catalog import flamingo_ref
from tests.masks.strategies import block_sizes


@settings(max_examples=30, deadline=None)
@given(data=st.data(), q_len=st.integers(1, 13), n_images=st.integers(1, 4),
       tokens=st.integers(1, 4), batch=st.integers(1, 3))
def test_matches_reference_and_torch(data, q_len, n_images, tokens, batch):
    rows = []
    for _ in range(batch):
        spans = []
        for _ in range(n_images):
            a = data.draw(st.integers(0, q_len))
            spans.append([a, data.draw(st.integers(a, q_len))])
        rows.append(spans)
    mask = flamingo(q_len, torch.tensor(rows[0] if batch == 1 else rows), tokens)
    assert mask.has_intervals and mask.kv_len == n_images * tokens
    expected = grid(batch, q_len, n_images * tokens, flamingo_ref(rows, tokens))
    assert_dense_equals(mask, expected)
    assert_matches_create_mask(mask)
    for bs in (data.draw(block_sizes), data.draw(block_sizes)):
        assert_matches_create_block_mask(mask, bs)
    covered = flamingo_covered_rows(q_len, torch.tensor(rows))
    assert torch.equal(covered, expected.any(-1))


def test_fully_covered_layout_has_no_empty_rows():
    # the usual Flamingo layout: each image visible until the next one, first at 0
    mask = flamingo(10, [[0, 4], [4, 7], [7, 10]], 3)
    expected = grid(1, 10, 9, flamingo_ref([[[0, 4], [4, 7], [7, 10]]], 3))
    full_check(mask, expected, block_sizes=(4, (2, 3), 128))


def test_rows_without_image_convention():
    # rows 0 and 5 see no image: flex and boolean SDPA give 0 (flex LSE -inf), the additive
    # form is finite (uniform average), and flamingo_covered_rows zeroes it to match.
    spans = [[1, 3], [2, 5]]
    mask = flamingo(6, spans, 2)
    covered = flamingo_covered_rows(6, spans)
    assert covered.tolist() == [[False, True, True, True, True, False]]
    g = torch.Generator().manual_seed(0)
    q = torch.randn(1, 2, 6, 8, generator=g, dtype=torch.float64)
    k = torch.randn(1, 2, 4, 8, generator=g, dtype=torch.float64)
    v = torch.randn(1, 2, 4, 8, generator=g, dtype=torch.float64)
    flex, aux = flex_attention(q, k, v, block_mask=mask.block_mask(2),
                               return_aux=AuxRequest(lse=True))
    sdpa = torch.nn.functional.scaled_dot_product_attention(q, k, v, attn_mask=mask.dense())
    empty = ~covered[0]
    assert torch.equal(flex[:, :, empty], torch.zeros_like(flex[:, :, empty]))
    assert torch.isneginf(aux.lse[:, :, empty]).all()
    torch.testing.assert_close(sdpa, flex, rtol=1e-9, atol=1e-9)
    for dtype in (torch.float64, torch.float32, torch.bfloat16):
        add = torch.nn.functional.scaled_dot_product_attention(
            q.to(dtype), k.to(dtype), v.to(dtype), attn_mask=mask.additive(dtype))
        assert torch.isfinite(add).all(), dtype
        scores = q.to(dtype) @ k.to(dtype).transpose(-1, -2) + mask.additive(dtype)
        assert torch.isfinite(torch.softmax(scores, -1)).all(), dtype
    add = torch.nn.functional.scaled_dot_product_attention(
        q, k, v, attn_mask=mask.additive(torch.float64))
    torch.testing.assert_close(add * covered[:, None, :, None], flex, rtol=1e-9, atol=1e-9)


def test_large_shape():
    spans = torch.tensor([[0, 70], [50, 200], [200, 300], [299, 300]])
    assert_matches_create_block_mask(flamingo(300, spans, 33), (64, 128))


def test_bad_input():
    with pytest.raises(ValueError, match="image_intervals"):
        flamingo(6, [[0, 7]], 2)
    with pytest.raises(ValueError, match="image_intervals"):
        flamingo(6, [[3, 2]], 2)
    with pytest.raises(ValueError, match="image_intervals"):
        flamingo(6, [0, 3], 2)
    with pytest.raises(TypeError, match="image_intervals"):
        flamingo(6, torch.tensor([[0.0, 3.0]]), 2)
    with pytest.raises(ValueError, match="image_tokens"):
        flamingo(6, [[0, 3]], 0)
    with pytest.raises(ValueError, match="q_len"):
        flamingo(0, [[0, 0]], 2)
