"""Per-sample seeds: every random draw of a sample's corruption is a function of
``(config seed, optimizer step, global sample index)`` only.

So the noise a sample gets does not depend on the number of ranks, the micro-batch split or
gradient accumulation, and resuming at step ``s`` reproduces step ``s``'s noise exactly.
Validation noise depends on ``(seed, sample index)`` only — never on the training step — so
validation losses are comparable from one evaluation to the next.

Mixing: a 63-bit variant of the splitmix64 finaliser (xor-shifts and odd multiplications
modulo 2^63, each a bijection of ``[0, 2^63)``), applied in a chain
``mix(mix(mix(seed) ^ step) ^ index)``. For a fixed ``(seed, step)`` the map from sample index
to seed is therefore a bijection: seeds of different samples of a step never collide.
Across steps they are pseudo-independent 63-bit values. Validation uses a step value outside
the training range, so its seeds never coincide with a training seed of the same sample.
"""

from __future__ import annotations

from collections.abc import Iterable

import torch

_BITS = 63
_MASK = (1 << _BITS) - 1
_MAX_STEP = 1 << 62  # training steps live below this; validation uses a value above
_VALIDATION_STEP = _MAX_STEP | 0x5EED_0F_7A11D


def _mix(x: int) -> int:
    """Bijective avalanche mix of a 63-bit integer (splitmix64-style, modulo 2^63)."""
    x = (x + 0x1E3779B97F4A7C15) & _MASK  # golden-ratio increment: mix(0) is not 0
    x ^= x >> 31
    x = (x * 0x3F58476D1CE4E5B9) & _MASK
    x ^= x >> 27
    x = (x * 0x14D049BB133111EB) & _MASK
    x ^= x >> 31
    return x


def _check(name: str, value: object, limit: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value < limit:
        raise ValueError(f"{name} must be an int in [0, {limit}), got {value!r}")
    return value


def _chain(seed: int, step: int, sample_index: int) -> int:
    return _mix(_mix(_mix(seed) ^ step) ^ sample_index)


def sample_seed(seed: int, step: int, sample_index: int) -> int:
    """Seed in ``[0, 2^63)`` for the training noise of global sample ``sample_index`` at
    optimizer step ``step`` of a run configured with ``seed`` (all non-negative ints)."""
    return _chain(
        _check("seed", seed, 1 << _BITS),
        _check("step", step, _MAX_STEP),
        _check("sample_index", sample_index, 1 << _BITS),
    )


def validation_seed(seed: int, sample_index: int) -> int:
    """Seed in ``[0, 2^63)`` for the validation noise of sample ``sample_index``; it does not
    depend on the training step and differs from every training seed of that sample."""
    return _chain(
        _check("seed", seed, 1 << _BITS),
        _VALIDATION_STEP,
        _check("sample_index", sample_index, 1 << _BITS),
    )


def _generators(seeds: Iterable[int], device: torch.device | str) -> list[torch.Generator]:
    gens = []
    for s in seeds:
        g = torch.Generator(device=device)
        g.manual_seed(s)
        gens.append(g)
    return gens


def sample_generators(
    seed: int, step: int, sample_indices: Iterable[int], device: torch.device | str = "cpu"
) -> list[torch.Generator]:
    """One ``torch.Generator`` per row, seeded by :func:`sample_seed`, in the order of
    ``sample_indices`` (the global indices of the rows of a micro-batch). Pass the list as a
    corruption's ``generator`` so row ``b`` draws only from its own sample's stream."""
    return _generators((sample_seed(seed, step, int(i)) for i in sample_indices), device)


def validation_generators(
    seed: int, sample_indices: Iterable[int], device: torch.device | str = "cpu"
) -> list[torch.Generator]:
    """Like :func:`sample_generators` for validation rows (:func:`validation_seed`)."""
    return _generators((validation_seed(seed, int(i)) for i in sample_indices), device)
