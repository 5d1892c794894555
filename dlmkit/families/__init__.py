"""The family registry: one :class:`Family` record per dLLM family, each from its own folder.

``get(name)`` -> the :class:`Family`, ``names()`` lists them, ``sampling_class(name)`` -> the
options class of that family's sampler, ``training_help(name)`` its training options with help,
``plain_causal()`` / ``drafting()`` the families with those roles, ``register(family)`` adds one
from outside this tree for one process. Adding a family is one folder and one line below
(docs/adding_a_family.md); an installed package adds one to every dlmkit command through the
``dlmkit.families`` entry-point group (:data:`ENTRY_POINTS`).
"""

from __future__ import annotations

import dataclasses
import warnings

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

# Installed packages declare families here (pyproject.toml:
# [project.entry-points."dlmkit.families"] NAME = "package.module:FAMILY", or the module that
# holds FAMILY); they are loaded the first time the registry is read.
ENTRY_POINTS = "dlmkit.families"
_plugins_loaded = False


def _registry() -> dict[str, Family]:
    """The registry, with the installed packages' families added on first use."""
    global _plugins_loaded
    if not _plugins_loaded:
        _plugins_loaded = True
        load_entry_points()
    return _REGISTRY


def load_entry_points() -> list[str]:
    """Register the families that installed packages declare in the ``dlmkit.families``
    entry-point group; returns their names. One that cannot be loaded, is not a
    :class:`Family` (or a module with ``FAMILY``) or takes a name already registered is skipped
    with a warning naming it: a broken plugin does not stop the other commands."""
    from importlib.metadata import entry_points

    added = []
    for point in entry_points(group=ENTRY_POINTS):
        where = f"entry point {point.name!r} ({point.value}) of group {ENTRY_POINTS!r}"
        try:
            family = point.load()
        except Exception as err:  # noqa: BLE001 - reported, the other families still load
            warnings.warn(f"dlmkit: skipped the family of {where}: loading it raised "
                          f"{type(err).__name__}: {err}", stacklevel=2)
            continue
        family = getattr(family, "FAMILY", family)
        if not isinstance(family, Family):
            warnings.warn(f"dlmkit: skipped {where}: it is a {type(family).__name__}, not a "
                          "dlmkit.families.Family (or a module with FAMILY)", stacklevel=2)
            continue
        if family.name in _REGISTRY:
            warnings.warn(f"dlmkit: skipped {where}: a family named {family.name!r} is "
                          "already registered", stacklevel=2)
            continue
        _REGISTRY[family.name] = family
        added.append(family.name)
    return added


def names() -> list[str]:
    return list(_registry())


def get(name: str) -> Family:
    registry = _registry()
    if name not in registry:
        raise ValueError(f"unknown strategy {name!r}; valid: {', '.join(registry)}")
    return registry[name]


def sampling_class(sampler: str):
    """The options class of ``sampler`` (a family's name)."""
    registry = _registry()
    if sampler not in registry:
        raise ValueError(f"sampler must be one of {tuple(registry)}, got {sampler!r}")
    return registry[sampler].sampling


def register(family: Family) -> None:
    """Add a family defined outside dlmkit's tree (your own package, a notebook, a test) for
    this process: training, ``generate``, ``eval``, ``serve`` and ``rl`` then take it like a
    built-in one. A family of dlmkit's own tree is one line in the tuple above instead."""
    if not isinstance(family, Family):
        raise TypeError(f"register() takes a dlmkit.families.Family, got "
                        f"{type(family).__name__}")
    if family.name in _registry():
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
    return list(dict.fromkeys(f.name for family in _registry().values()
                              for f in dataclasses.fields(family.sampling)))


def plain_causal() -> str:
    """The sampler that decodes a plain causal LM (a model directory without dlmkit.json)."""
    return next(n for n, f in _registry().items() if f.plain_causal)


def drafting() -> tuple[str, Drafting]:
    """``(sampler, Drafting)`` of the family whose drafter decodes a target (``--draft``)."""
    return next((n, f.drafting) for n, f in _registry().items() if f.drafting is not None)


__all__ = ["DEFAULT", "ENTRY_POINTS", "Drafting", "Family", "Strategy", "drafting", "get",
           "load_entry_points", "names", "plain_causal", "register", "sampler_options",
           "sampling_class", "training_help"]
