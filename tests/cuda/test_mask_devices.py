"""Every mask factory given a CUDA ``valid`` (or ``doc_ids``) and no ``device`` builds on
CUDA, equal to the build with ``device="cuda"`` (the first GPU run found CPU index tensors
here: block_diffusion's encoder masks stopped with a device mismatch)."""

import pytest
import torch

from dlmkit.masks import bidirectional, block_diffusion, canvas, canvas_encoder, hybrid, idlm
from dlmkit.masks.causal import padded_causal

L, S = 64, 8


def _valid():
    valid = torch.ones(2, L, dtype=torch.long, device="cuda")
    valid[1, L // 2:] = 0
    return valid


FACTORIES = {
    "bidirectional": lambda valid, **kw: bidirectional(L, valid, **kw),
    "padded_causal": lambda valid, **kw: padded_causal(L, valid, **kw),
    "canvas_encoder": lambda valid, **kw: canvas_encoder(L, valid, **kw),
    "canvas_encoder_sliding": lambda valid, **kw: canvas_encoder(L, valid, 16, **kw),
    "canvas": lambda valid, **kw: canvas(8, 16, L, S, valid=valid, **kw),
    "block_diffusion": lambda valid, **kw: block_diffusion(L, S, valid, **kw),
    "idlm": lambda valid, **kw: idlm(L, S, valid, **kw),
    "hybrid": lambda valid, **kw: hybrid(L, S, valid, **kw),
    "block_diffusion_packed": lambda valid, **kw: block_diffusion(
        L, S, valid, doc_ids=torch.tensor([[0] * 20 + [1] * (L - 20)] * 2, device="cuda"), **kw),
}


@pytest.mark.parametrize("name", FACTORIES)
def test_cuda_valid_without_device_builds_on_cuda(name):
    implicit = FACTORIES[name](_valid())
    explicit = FACTORIES[name](_valid(), device="cuda")
    assert implicit.device.type == "cuda"
    a, b = implicit.block_mask(16), explicit.block_mask(16)
    assert a.kv_indices.device.type == "cuda"
    assert torch.equal(a.to_dense(), b.to_dense())
    assert torch.equal(implicit.dense(), explicit.dense())
