"""The training strategies of the families (:mod:`dlmkit.families`): ``get(name)`` -> the
strategy class of a dLLM family, ``names()`` lists them."""

from __future__ import annotations

from dlmkit import families
from dlmkit.families.strategy import Strategy


def names() -> list[str]:
    return families.names()


def get(name: str) -> type[Strategy]:
    return families.get(name).strategy


__all__ = ["Strategy", "get", "names"]
