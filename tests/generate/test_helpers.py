"""The sampler tests' shared tiny model: each test gets its own copy."""

from __future__ import annotations

import torch

from .helpers import tiny_model


def test_a_test_that_converts_or_hooks_its_model_leaves_the_next_one_alone():
    first = tiny_model()
    first.double()
    first.register_forward_pre_hook(lambda *_: None)
    second = tiny_model()
    assert next(second.parameters()).dtype == torch.float32
    assert not second._forward_pre_hooks
    # the same weights each time (seeded)
    assert all(torch.equal(a.double(), b.double()) for a, b in
               zip(first.parameters(), second.parameters()))
