import json

import pytest

from tests.generate.conftest import one_thread  # noqa: F401 (autouse: one intra-op thread)
from tests.generate.helpers import TOK, tiny_model


@pytest.fixture(scope="module")
def policy(tmp_path_factory):
    """``policy(strategy, block_size=None, **options)``: an untrained tiny model exported as
    `dlmkit train` exports it (the rl loop's starting point)."""
    def save(strategy, block_size=None, **options):
        path = tmp_path_factory.mktemp(strategy)
        tiny_model().save_pretrained(path)
        TOK.save_pretrained(path)
        (path / "dlmkit.json").write_text(json.dumps({
            "strategy": strategy, "block_size": block_size, "task": "addition",
            "mask_token_id": TOK.mask_token_id,
            "options": {**({"block_size": block_size} if block_size else {}), **options},
            "max_new_tokens": 4}))
        return path

    return save
