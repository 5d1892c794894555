"""Where a mask is built: ``device`` when given, else the device of its ``valid`` /
``doc_ids`` (``mask_device``). The factories resolve it before defining their closures; on a
GPU a CUDA ``valid`` with ``device=None`` once produced CPU index tensors and a device-mismatch
error (tests/cuda/test_mask_devices.py checks that case where a GPU exists)."""

from __future__ import annotations

import torch

from dlmkit.masks import bidirectional, block_diffusion, canvas_encoder, hybrid, idlm
from dlmkit.masks.causal import padded_causal
from dlmkit.masks.checks import mask_device


def test_explicit_device_wins_over_the_tensors():
    assert mask_device("meta", torch.ones(2)) == torch.device("meta")


def test_first_tensor_argument_gives_the_device():
    meta = torch.ones(2, device="meta")
    assert mask_device(None, None, 3, meta, torch.ones(2)) == torch.device("meta")


def test_nothing_to_go_by_is_none():
    assert mask_device(None, None, 4) is None


def test_factories_build_on_the_valid_device():
    valid = torch.ones(2, 8, dtype=torch.long)
    valid[1, 6:] = 0
    for mask in (bidirectional(8, valid), padded_causal(8, valid), canvas_encoder(8, valid),
                 block_diffusion(8, 4, valid), idlm(8, 4, valid), hybrid(8, 4, valid)):
        assert mask.device == valid.device, mask.name
        assert mask.block_mask(4).kv_indices.device == valid.device, mask.name
