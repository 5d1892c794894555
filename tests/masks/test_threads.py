"""The BlockMask builder runs its small index ops on one thread and restores the count."""

import pytest
import torch

from dlmkit.masks import Mask, idlm
from dlmkit.masks.threads import single_threaded


@pytest.fixture
def two_threads():
    before = torch.get_num_threads()
    torch.set_num_threads(2)
    yield
    torch.set_num_threads(before)


def _recording_mask(seen: list[int]) -> Mask:
    def intervals():
        seen.append(torch.get_num_threads())
        q = torch.arange(64).view(1, 64, 1)
        return torch.zeros_like(q), q + 1

    return Mask.from_rule(lambda b, q, kv: kv <= q, 64, 64, intervals=intervals)


def test_structured_build_is_single_threaded_and_restores(two_threads):
    seen: list[int] = []
    block = _recording_mask(seen).block_mask(16)
    assert seen == [1]
    assert torch.get_num_threads() == 2
    assert int(block.kv_num_blocks.sum()) == 4  # the diagonal tiles of a causal 4x4 grid


def test_rule_fallback_keeps_every_thread(two_threads):
    seen: list[int] = []

    def rule(b, q, kv):
        seen.append(torch.get_num_threads())
        return kv <= q

    Mask.from_rule(rule, 64, 64).block_mask(16)
    assert seen and set(seen) == {2}


def test_count_restored_after_an_error(two_threads):
    def intervals():
        raise RuntimeError("boom")

    with pytest.raises(RuntimeError, match="boom"):
        Mask.from_rule(lambda b, q, kv: kv <= q, 64, 64, intervals=intervals).block_mask(16)
    assert torch.get_num_threads() == 2


def test_nested_scopes(two_threads):
    with single_threaded():
        with single_threaded():
            assert torch.get_num_threads() == 1
        assert torch.get_num_threads() == 1
    assert torch.get_num_threads() == 2
    idlm(32, 4).block_mask(16)
    assert torch.get_num_threads() == 2
