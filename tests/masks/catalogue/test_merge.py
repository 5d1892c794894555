import math

import pytest
import torch
from torch.nn.attention.flex_attention import AuxRequest, flex_attention

from dlmkit.masks.catalogue.document import shared_prefix
from dlmkit.masks.catalogue.merge import merge_attention
from dlmkit.masks.causal import causal
from dlmkit.masks.core import Mask


def masked_attention(q, k, v, allowed):
    """Reference: output and natural-log LSE; rows with no key -> 0 and -inf."""
    scores = (q @ k.transpose(-1, -2)) / math.sqrt(q.shape[-1])
    scores = scores.masked_fill(~allowed, float("-inf"))
    lse = torch.logsumexp(scores, -1)
    probs = torch.exp(scores - torch.where(torch.isfinite(lse), lse, 0).unsqueeze(-1))
    return probs @ v, lse


def test_split_keys_merge_to_full_attention():
    g = torch.Generator().manual_seed(0)
    q = torch.randn(2, 3, 9, 8, generator=g, dtype=torch.float64)
    k = torch.randn(2, 3, 14, 8, generator=g, dtype=torch.float64)
    v = torch.randn(2, 3, 14, 8, generator=g, dtype=torch.float64)
    allowed = causal(9, 14, align="bottom_right").dense()  # [1, 1, 9, 14]
    allowed = allowed.clone()
    allowed[..., 4, :] = False  # a row that sees nothing at all
    allowed[..., 6, :6] = False  # a row that sees nothing of the first part
    full_out, full_lse = masked_attention(q, k, v, allowed)
    split = 6
    a = masked_attention(q, k[..., :split, :], v[..., :split, :], allowed[..., :split])
    b = masked_attention(q, k[..., split:, :], v[..., split:, :], allowed[..., split:])
    assert torch.isneginf(a[1][..., 6]).all() and torch.isneginf(a[1][..., 4]).all()
    out, lse = merge_attention(*a, *b)
    assert torch.isfinite(out).all()
    torch.testing.assert_close(out, full_out, rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(lse, full_lse, rtol=1e-12, atol=1e-12)
    assert torch.isneginf(lse[..., 4]).all() and torch.equal(out[..., 4, :],
                                                             torch.zeros_like(out[..., 4, :]))
    # symmetric in its two arguments
    out2, lse2 = merge_attention(*b, *a)
    torch.testing.assert_close(out2, out, rtol=1e-12, atol=1e-12)


def test_shared_prefix_split_attention_with_flex():
    # packed [prefix | cont1 | cont2]: attention = (prefix part) merged with (own doc part)
    offsets = torch.tensor([0, 4, 7, 11])
    full_mask = shared_prefix(offsets, torch.tensor([0, 0, 0]))
    g = torch.Generator().manual_seed(1)
    q, k, v = (torch.randn(1, 2, 11, 8, generator=g) for _ in range(3))
    aux = AuxRequest(lse=True)
    full_out, full_aux = flex_attention(q, k, v, block_mask=full_mask.block_mask(4),
                                        return_aux=aux)
    start = offsets[torch.searchsorted(offsets[1:], torch.arange(11), right=True)]

    def own(b, qq, kv):
        return (kv >= start[qq.clamp(0, 10)]) & (kv <= qq)

    def prefix(b, qq, kv):
        return (kv < 4) & (qq >= 4)

    parts = []
    for rule in (own, prefix):
        mask = Mask.from_rule(rule, 11, 11)
        parts.extend(flex_attention(q, k, v, block_mask=mask.block_mask(4), return_aux=aux))
    out, lse = merge_attention(parts[0], parts[1].lse, parts[2], parts[3].lse)
    torch.testing.assert_close(out, full_out, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(lse, full_aux.lse, rtol=1e-5, atol=1e-5)


def test_low_precision_inputs_keep_dtype():
    g = torch.Generator().manual_seed(2)
    out = torch.randn(2, 5, 4, generator=g).to(torch.bfloat16)
    lse = torch.randn(2, 5, generator=g)
    merged, merged_lse = merge_attention(out, lse, out, lse)
    assert merged.dtype == torch.bfloat16 and merged_lse.dtype == torch.float32
    torch.testing.assert_close(merged, out)
    torch.testing.assert_close(merged_lse, lse + math.log(2))


def test_bad_input():
    out, lse = torch.zeros(2, 3, 4), torch.zeros(2, 3)
    with pytest.raises(ValueError, match="other_out"):
        merge_attention(out, lse, torch.zeros(2, 3, 5), lse)
    with pytest.raises(ValueError, match="lse"):
        merge_attention(out, torch.zeros(2, 4), out, lse)
    with pytest.raises(TypeError, match="out"):
        merge_attention(out.long(), lse, out, lse)
    with pytest.raises(TypeError, match="other_lse"):
        merge_attention(out, lse, out, [0.0])
