"""Named example configurations of every mask, for ``dlmkit mask show``, benchmarks and the
gallery.

Each mask module may define ``EXAMPLES: dict[str, Callable[[int, int], Mask]]`` mapping a name
to a builder ``(seq_len, block_size) -> Mask``: a representative configuration whose total
token count grows with ``seq_len`` and whose structural block (diffusion block, window, chunk
...) is ``block_size``. This module gathers them and says which part of the package each comes
from: ``"engine"`` (the masks the dLLM families train and decode with, in :mod:`dlmkit.masks`)
or ``"catalogue"`` (the patterns no family uses, in :mod:`dlmkit.masks.catalogue`).
"""

from __future__ import annotations

import importlib
from collections.abc import Callable

from .core import Mask

# Module paths relative to this package. They are imported by name because the package
# re-exports factories under their modules' names (``dlmkit.masks.causal`` is the function).
PARTS: dict[str, tuple[str, ...]] = {
    "engine": ("causal", "bidirectional", "diffusion", "hybrid", "dflash", "canvas", "decode"),
    "catalogue": tuple(f"catalogue.{name}" for name in (
        "window", "prefix", "document", "vision", "natten", "video", "vsa", "jetspec",
        "chunk_causal")),
}


def _check_part(part: str | None) -> None:
    if part is not None and part not in PARTS:
        raise ValueError(f"part must be one of {', '.join(map(repr, PARTS))} or None, "
                         f"got {part!r}")


def _module_examples(part: str) -> dict[str, Callable[[int, int], Mask]]:
    found: dict[str, Callable[[int, int], Mask]] = {}
    for module in PARTS[part]:
        found.update(importlib.import_module(f"{__package__}.{module}").EXAMPLES)
    return found


def examples(part: str | None = None) -> dict[str, Callable[[int, int], Mask]]:
    """Every example by name, sorted; ``part="engine"`` or ``"catalogue"`` keeps that part."""
    _check_part(part)
    found: dict[str, Callable[[int, int], Mask]] = {}
    for name in PARTS if part is None else (part,):
        found.update(_module_examples(name))
    return dict(sorted(found.items()))


def part_of(name: str) -> str:
    """``"engine"`` or ``"catalogue"``: where the example ``name`` is defined."""
    for part in PARTS:
        if name in _module_examples(part):
            return part
    raise ValueError(f"unknown mask {name!r}; available: {', '.join(examples())}")


def example(name: str, seq_len: int, block_size: int) -> Mask:
    known = examples()
    if name not in known:
        raise ValueError(f"unknown mask {name!r}; available: {', '.join(known)}")
    return known[name](seq_len, block_size)
