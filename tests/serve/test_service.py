"""The request -> config step of the server (no HTTP): checked configs are reused by option
set, and reuse never lets a request through that the checks would refuse."""

from __future__ import annotations

import pytest

from dlmkit.serve import Service
from dlmkit.serve.app import APIError
from dlmkit.serve.schemas import CompletionRequest


def _service(export, strategy):
    from dlmkit.generate import load

    return Service(load(export(strategy)), sampler=None, options={}, model_id="tiny",
                   max_batch=4, wait_ms=0, max_queue=4)


def _request(**fields):
    return CompletionRequest.model_validate({"model": "tiny", "prompt": "rev abc", **fields})


def test_configs_are_reused_per_option_set(export):
    service = _service(export, "bd3lm")
    ids = service.encode("rev abc")
    fast, _ = service.configure(_request(max_tokens=8, dlmkit={"threshold": 0.9}), ids)
    plain, _ = service.configure(_request(max_tokens=8), ids)
    again, _ = service.configure(_request(max_tokens=8, dlmkit={"threshold": 0.9}), ids)
    assert fast.threshold == 0.9 and plain.threshold is None
    assert again is fast  # the same options: the checked config, not a new one
    longer, _ = service.configure(_request(max_tokens=12, dlmkit={"threshold": 0.9}), ids)
    assert longer.max_new_tokens == 12 and fast.max_new_tokens == 8


def test_a_reused_config_does_not_let_an_equal_value_of_another_type_through(export):
    """``True == 1`` in Python: a cache keyed on values alone would hand ``steps: true`` the
    config checked for ``steps: 1``."""
    service = _service(export, "bd3lm")
    ids = service.encode("rev abc")
    config, _ = service.configure(_request(max_tokens=8, dlmkit={"steps": 1}), ids)
    assert config.steps == 1
    with pytest.raises(APIError, match="steps") as refused:
        service.configure(_request(max_tokens=8, dlmkit={"steps": True}), ids)
    assert refused.value.status == 400
    with pytest.raises(APIError, match="threshold"):  # an error is not cached either
        service.configure(_request(max_tokens=8, dlmkit={"threshold": 2}), ids)
    with pytest.raises(APIError, match="threshold"):
        service.configure(_request(max_tokens=8, dlmkit={"threshold": 2}), ids)


def test_a_started_server_keeps_what_it_loaded_out_of_full_collections(serve):
    """A full collection walks every object of the process (~460k with torch, transformers
    and a model loaded): one stalled all requests in flight for ~0.4 s at 64 clients. The
    server freezes what it loaded when it starts."""
    import gc

    serve("ar")
    assert gc.get_freeze_count() > 0
