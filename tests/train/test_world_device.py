"""``init_world`` names the GPU by index: ``train.device=cuda`` (no index) must become this
process's ``cuda:LOCAL_RANK`` before ``torch.cuda.set_device``, which rejects an index-less
device on torch 2.11 (found on the first CUDA run: every recipe run with ``train.device=cuda``
stopped there). Runs without a GPU: ``set_device`` is replaced by a recorder."""

from __future__ import annotations

import pytest
import torch

from dlmkit.train.distributed import init_world


@pytest.mark.parametrize("spec,local_rank,expected", [
    ("cuda", "0", "cuda:0"), ("cuda", "1", "cuda:1"), ("cuda:3", "1", "cuda:3")])
def test_cuda_without_an_index_is_this_ranks_gpu(monkeypatch, spec, local_rank, expected):
    calls = []
    monkeypatch.setattr(torch.cuda, "set_device", calls.append)
    monkeypatch.setenv("LOCAL_RANK", local_rank)
    monkeypatch.delenv("WORLD_SIZE", raising=False)
    world = init_world(spec)
    assert world.device == torch.device(expected)
    assert calls == [torch.device(expected)]
    assert calls[0].index is not None


def test_cpu_is_left_alone(monkeypatch):
    calls = []
    monkeypatch.setattr(torch.cuda, "set_device", calls.append)
    assert init_world("cpu").device == torch.device("cpu") and calls == []
