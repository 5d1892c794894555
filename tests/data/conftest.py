"""Fixtures for the data tests."""

from __future__ import annotations

import pytest

from tests.data.helpers import build_hf_tokenizer


@pytest.fixture(scope="session")
def hf_tokenizer_dir(tmp_path_factory):
    """A saved HF tokenizer directory with a pad token, no mask token, no generation tags."""
    path = tmp_path_factory.mktemp("hf_tok")
    build_hf_tokenizer(pad=True).save_pretrained(str(path))
    return path
