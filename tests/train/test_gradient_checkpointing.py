"""``model.gradient_checkpointing``: every strategy's losses and gradients equal the plain run's,
and the layers really are recomputed in the backward."""

from __future__ import annotations

import pytest
import torch

from dlmkit import strategies
from dlmkit.train import ConfigError
from dlmkit.train.distributed import World
from dlmkit.train.recipe import accumulate_gradients, build_components

from .helpers import config

CPU = World(rank=0, world_size=1, local_rank=0, device=torch.device("cpu"))


def one_step(name: str, *extra: str):
    cfg = config("data.num_train=16", "data.num_validation=8", *extra, strategy=name)
    c = build_components(cfg, CPU)
    # transformers checkpoints a layer's forward (its own hooks stay outside), so count calls
    # of the modules inside the layers; pre-hooks, since a recompute stops early once it has
    # rebuilt the saved tensors.
    from transformers.modeling_layers import GradientCheckpointingLayer

    calls = []
    for layer in c.model.modules():
        if isinstance(layer, GradientCheckpointingLayer):
            for child in layer.children():
                child.register_forward_pre_hook(lambda *a: calls.append(1))
    loss, _ = accumulate_gradients(0, c.step_context(cfg, CPU))
    grads = {n: p.grad.clone() for n, p in c.model.named_parameters() if p.grad is not None}
    return c.model, loss, grads, len(calls)


@pytest.mark.parametrize("name", strategies.names())
def test_checkpointing_gives_identical_losses_and_gradients(name):
    torch.set_num_threads(1)
    plain, loss, grads, plain_calls = one_step(name)
    model, ckpt_loss, ckpt_grads, ckpt_calls = one_step(name, "model.gradient_checkpointing=true")
    assert plain_calls > 0 and ckpt_calls > plain_calls  # the layers ran again in the backward
    assert ckpt_loss == loss
    assert grads.keys() == ckpt_grads.keys() and len(grads) > 0
    for key, grad in grads.items():
        torch.testing.assert_close(ckpt_grads[key], grad, rtol=0, atol=0, msg=key)


def test_bad_value():
    with pytest.raises(ConfigError, match="model.gradient_checkpointing must be true or false"):
        config("model.gradient_checkpointing=yes please")
