"""FlexAttention with our BlockMask equals SDPA with our dense mask, forward and backward,
through a tiny Hugging Face model, for every dLLM mask family (and their padded forms)."""

import copy

import pytest
import torch

from dlmkit.masks import bidirectional, block_diffusion, causal, hybrid, idlm
from dlmkit.models import build_model, forward_logits

L, BLOCK, BATCH = 256, 16, 2


def _valid(padding: str) -> torch.Tensor | None:
    if padding == "none":
        return None
    valid = torch.ones(BATCH, L, dtype=torch.long)
    if padding == "right":
        valid[1, 3 * L // 4:] = 0
    elif padding == "left":
        valid[1, : L // 4] = 0
    else:  # "all": a row with no real token
        valid[1] = 0
    return valid


FAMILIES = {
    "bidirectional": lambda valid, device: bidirectional(L, valid, device=device),
    "causal": lambda valid, device: causal(L, device=device),
    "block_diffusion": lambda valid, device: block_diffusion(L, BLOCK, valid, device=device),
    "idlm": lambda valid, device: idlm(L, BLOCK, valid, device=device),
    "hybrid": lambda valid, device: hybrid(L, BLOCK, valid, device=device),
    "block_diffusion_packed": lambda valid, device: block_diffusion(
        L, BLOCK, valid, doc_ids=torch.tensor([[0] * 100 + [1] * (L - 100)] * BATCH),
        device=device),
}
# Every (rule, dtype) is one more flex compile: fp32 for every family, bf16 autocast for the
# two families the GPU speed claims are about; every padding.
BF16_FAMILIES = ("idlm", "block_diffusion")
CASES = [(name, padding, dtype) for name in FAMILIES
         for padding in (("none",) if name == "causal" else ("none", "right", "left", "all"))
         for dtype in (("fp32", "bf16") if name in BF16_FAMILIES else ("fp32",))]


@pytest.fixture(scope="module")
def models():
    torch.manual_seed(0)
    sdpa = build_model("tiny-llama", 300, attention="sdpa").cuda()
    flex = copy.deepcopy(sdpa)
    flex.set_attn_implementation("flex_attention")
    return sdpa, flex


def _run(model, ids, mask, positions, autocast: bool):
    model.zero_grad(set_to_none=True)
    with torch.autocast("cuda", dtype=torch.bfloat16, enabled=autocast):
        logits = forward_logits(model, ids, mask, positions)
    weights = torch.linspace(-1, 1, logits.shape[-1], device=logits.device)
    (logits.float() * weights).mean().backward()
    grads = torch.cat([p.grad.flatten().float() for p in model.parameters()])
    return logits.float().detach(), grads


@pytest.mark.parametrize("name,padding,dtype", CASES)
def test_flex_equals_sdpa(models, name, padding, dtype):
    autocast = dtype == "bf16"
    sdpa, flex = models
    device = torch.device("cuda")
    valid = _valid(padding)
    mask = FAMILIES[name](None if valid is None else valid.to(device), device)
    tokens = mask.q_len
    g = torch.Generator().manual_seed(1)
    ids = torch.randint(0, 300, (BATCH, tokens), generator=g).cuda()
    positions = (torch.arange(tokens) % L).expand(BATCH, tokens).cuda()
    s_logits, s_grads = _run(sdpa, ids, mask, positions, autocast)
    f_logits, f_grads = _run(flex, ids, mask, positions, autocast)
    assert torch.isfinite(f_logits).all() and torch.isfinite(f_grads).all()
    tol = 2e-2 if autocast else 1e-4
    assert (f_logits - s_logits).abs().max() <= tol * s_logits.abs().max()
    assert (f_grads - s_grads).norm() <= (1e-2 if autocast else 1e-3) * s_grads.norm()


def test_batch_one_block_mask_broadcasts_over_the_batch(models):
    """An unpadded mask has batch 1; the model's batch of 2 must broadcast over it."""
    _, flex = models
    mask = idlm(L, BLOCK, device="cuda")
    assert mask.block_mask(128).kv_num_blocks.shape[0] == 1
    ids = torch.randint(0, 300, (BATCH, 2 * L), device="cuda")
    positions = (torch.arange(2 * L, device="cuda") % L).expand(BATCH, 2 * L)
    with torch.no_grad():
        both = forward_logits(flex, ids, mask, positions)
        first = forward_logits(flex, ids[:1], mask, positions[:1])
    torch.testing.assert_close(both[:1], first, rtol=1e-4, atol=1e-4)
