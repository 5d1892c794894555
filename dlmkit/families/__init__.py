"""The family registry: one :class:`Family` record per dLLM family, each from its own folder.

``get(name)`` -> the :class:`Family`, ``names()`` lists them, ``sampling_class(name)`` -> the
options class of that family's sampler, ``training_help(name)`` its training options with help,
``plain_causal()`` / ``drafting()`` the families with those roles, ``register(family)`` adds one
from outside this tree. Adding a family is one folder and one line below
(docs/adding_a_family.md).
"""

from __future__ import annotations

import dataclasses

from dlmkit.families.family import Drafting, Family
from dlmkit.families.options import describe as describe_options
from dlmkit.families.strategy import Strategy

from . import ar, bd3lm, block_diffusion, dflash, hybrid, idlm, mdlm, scdd

_REGISTRY: dict[str, Family] = {f.name: f for f in (
    mdlm.FAMILY,
    scdd.FAMILY,
    hybrid.FAMILY,
    idlm.FAMILY,
    bd3lm.FAMILY,
    ar.FAMILY,
    dflash.FAMILY,
    block_diffusion.FAMILY,
)}

# The family `dlmkit train` trains with no config (the embedded default, docs/training.md).
DEFAULT = "bd3lm"


def names() -> list[str]:
    return list(_REGISTRY)


def get(name: str) -> Family:
    if name not in _REGISTRY:
        raise ValueError(f"unknown strategy {name!r}; valid: {', '.join(_REGISTRY)}")
    return _REGISTRY[name]


def sampling_class(sampler: str):
    """The options class of ``sampler`` (a family's name)."""
    if sampler not in _REGISTRY:
        raise ValueError(f"sampler must be one of {tuple(_REGISTRY)}, got {sampler!r}")
    return _REGISTRY[sampler].sampling


def register(family: Family) -> None:
    """Add a family defined outside dlmkit's tree (your own package, a notebook, a test) for
    this process: training, ``generate``, ``eval``, ``serve`` and ``rl`` then take it like a
    built-in one. A family of dlmkit's own tree is one line in the tuple above instead."""
    if not isinstance(family, Family):
        raise TypeError(f"register() takes a dlmkit.families.Family, got "
                        f"{type(family).__name__}")
    if family.name in _REGISTRY:
        raise ValueError(f"a family named {family.name!r} is already registered")
    _REGISTRY[family.name] = family


def training_help(name: str) -> str:
    """The training options (``strategy.<option>``) of family ``name``: each with its
    default, what it accepts and its help, for ``dlmkit train --help`` / ``--print-config``."""
    family = get(name)
    if isinstance(family.training, dict):  # a strategy written before options were typed
        listed = ", ".join(f"{k}={v!r}" for k, v in family.training.items()) or "none"
        return f"strategy.<option> of {name} (no help recorded): {listed}"
    return describe_options(family.training, family=name)


def sampler_options() -> list[str]:
    """Every option some family's sampler takes, each once, in the order the option classes
    declare them (the common options first)."""
    return list(dict.fromkeys(f.name for family in _REGISTRY.values()
                              for f in dataclasses.fields(family.sampling)))


def plain_causal() -> str:
    """The sampler that decodes a plain causal LM (a model directory without dlmkit.json)."""
    return next(n for n, f in _REGISTRY.items() if f.plain_causal)


def drafting() -> tuple[str, Drafting]:
    """``(sampler, Drafting)`` of the family whose drafter decodes a target (``--draft``)."""
    return next((n, f.drafting) for n, f in _REGISTRY.items() if f.drafting is not None)


__all__ = ["DEFAULT", "Drafting", "Family", "Strategy", "drafting", "get", "names", "plain_causal",
           "register", "sampler_options", "sampling_class", "training_help"]
