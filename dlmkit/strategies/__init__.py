"""Strategy registry: ``get(name)`` -> the class of a dLLM family, ``names()`` lists them."""

from __future__ import annotations

from .ar import ARStrategy
from .base import Strategy
from .bd3lm import BD3LMStrategy
from .block_diffusion import BlockDiffusionStrategy
from .dflash import DFlashStrategy
from .hybrid import HybridStrategy
from .idlm import IDLMStrategy
from .mdlm import MDLMStrategy
from .scdd import SCDDStrategy

_REGISTRY: dict[str, type[Strategy]] = {
    cls.name: cls for cls in (MDLMStrategy, SCDDStrategy, HybridStrategy, IDLMStrategy,
                              BD3LMStrategy, ARStrategy, DFlashStrategy, BlockDiffusionStrategy)
}


def names() -> list[str]:
    return list(_REGISTRY)


def get(name: str) -> type[Strategy]:
    if name not in _REGISTRY:
        raise ValueError(f"unknown strategy {name!r}; valid: {', '.join(_REGISTRY)}")
    return _REGISTRY[name]


__all__ = ["Strategy", "get", "names"]
