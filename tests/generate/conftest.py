import json

import pytest
import torch

from .helpers import TOK, tiny_model


@pytest.fixture(autouse=True)
def one_thread():
    """The sampler tests run many tiny forwards; on a shared 2-core machine a second intra-op
    thread only adds contention (measured ~40x slower per tiny matmul under load)."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


@pytest.fixture(scope="module")
def exported(tmp_path_factory):
    """``exported(strategy, block_size=None, meta=True)``: the tiny model saved as `dlmkit
    train` exports it (``meta=False``: a plain Hugging Face directory, no dlmkit.json)."""
    def save(strategy, block_size=None, meta=True):
        path = tmp_path_factory.mktemp(strategy)
        tiny_model().save_pretrained(path)
        TOK.save_pretrained(path)
        if meta:
            (path / "dlmkit.json").write_text(json.dumps({
                "strategy": strategy, "block_size": block_size, "task": "reverse",
                "mask_token_id": TOK.mask_token_id, "options": {}, "max_new_tokens": 8}))
        return path

    return save
