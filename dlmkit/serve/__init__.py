"""OpenAI-compatible serving with batching across requests (``dlmkit serve``; docs/serving.md).

Modules: :mod:`.schemas` (request bodies), :mod:`.batching` (the decoding thread that batches
concurrent requests), :mod:`.app` (the ASGI app and its errors). Needs the ``serve`` extra
(fastapi, uvicorn).
"""

from .app import APIError, Service, create_app
from .batching import Batcher

__all__ = ["APIError", "Batcher", "Service", "create_app"]
