"""Named example configurations of every mask, for ``dlmkit mask show``, benchmarks and the
gallery.

Each mask module may define ``EXAMPLES: dict[str, Callable[[int, int], Mask]]`` mapping a name
to a builder ``(seq_len, block_size) -> Mask``: a representative configuration whose total
token count grows with ``seq_len`` and whose structural block (diffusion block, window, chunk
...) is ``block_size``. This module gathers them.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable

from .core import Mask

_MODULES = (
    "causal", "bidirectional", "diffusion", "hybrid", "window", "prefix", "document", "vision",
    "natten", "video", "vsa", "jetspec", "dflash", "canvas", "chunk_causal", "decode",
)


def examples() -> dict[str, Callable[[int, int], Mask]]:
    found: dict[str, Callable[[int, int], Mask]] = {}
    for module in _MODULES:
        try:
            mod = importlib.import_module(f"{__package__}.{module}")
        except ModuleNotFoundError as err:
            if err.name != f"{__package__}.{module}":
                raise
            continue
        found.update(getattr(mod, "EXAMPLES", {}))
    return dict(sorted(found.items()))


def example(name: str, seq_len: int, block_size: int) -> Mask:
    known = examples()
    if name not in known:
        raise ValueError(f"unknown mask {name!r}; available: {', '.join(known)}")
    return known[name](seq_len, block_size)
