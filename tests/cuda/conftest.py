"""CUDA tests: ``pytest -m cuda`` selects them; without a GPU every one is skipped."""

import pytest
import torch


def pytest_collection_modifyitems(config, items):
    here = __file__.rsplit("/", 1)[0]
    skip = pytest.mark.skip(reason="needs a CUDA device")
    for item in items:
        if str(item.fspath).startswith(here):
            item.add_marker(pytest.mark.cuda)
            if not torch.cuda.is_available():
                item.add_marker(skip)
