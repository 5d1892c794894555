"""Request bodies of the OpenAI-compatible endpoints, validated strictly: an unknown field, a
wrong type (``"max_tokens": "8"``) or a value out of range is a 400, never coerced or ignored.

dlmkit's own sampler options travel in one extension field, ``dlmkit`` (an object of
:class:`~dlmkit.generate.SamplerConfig` options such as ``steps``, ``threshold``, ``factor``,
``remasking``, ``cache``, ``block_size``); they are checked by the same code that checks
``dlmkit generate``'s options (:meth:`dlmkit.generate.LoadedModel.config`).
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

# Choices per request: each is one more row of the batch, so the cap keeps one request from
# taking a whole batch.
MAX_CHOICES = 16
MAX_STOPS = 4  # as OpenAI's API


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)


class _Sampling(_Strict):
    """Fields shared by both endpoints."""

    model: str
    max_tokens: int | None = Field(default=None, ge=1)
    temperature: float | None = Field(default=None, ge=0)
    seed: int | None = Field(default=None, ge=0, lt=1 << 63)
    stop: str | list[str] | None = None
    stream: bool = False
    n: int = Field(default=1, ge=1, le=MAX_CHOICES)
    dlmkit: dict[str, Any] | None = None

    def stop_strings(self) -> list[str]:
        """``stop`` as a list; an empty string or more than :data:`MAX_STOPS` is a ValueError."""
        stops = [self.stop] if isinstance(self.stop, str) else list(self.stop or [])
        if len(stops) > MAX_STOPS:
            raise ValueError(f"stop: at most {MAX_STOPS} sequences, got {len(stops)}")
        if any(s == "" for s in stops):
            raise ValueError("stop: an empty string would end every response at once; give "
                             "non-empty sequences")
        return stops


class CompletionRequest(_Sampling):
    """``POST /v1/completions``. ``prompt``: a text (rendered as one user message with the
    chat template, as ``dlmkit generate --prompt`` renders it) or a list of token ids (used
    as given)."""

    prompt: str | list[int]


class Message(_Strict):
    role: Literal["system", "user", "assistant"]
    content: str


class ChatRequest(_Sampling):
    """``POST /v1/chat/completions``: ``messages`` rendered with the chat template training
    used, ending with the assistant header."""

    messages: list[Message] = Field(min_length=1)
