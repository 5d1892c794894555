"""Random draws for corruptions, from one generator or one generator per row.

A corruption takes ``generator``: a single ``torch.Generator`` for the whole batch, or a
sequence of ``B`` generators where row ``b`` draws only from ``generator[b]``. The second form
makes a sample's noise a function of its own seed, so it does not change when samples are
regrouped into other micro-batches or ranks (see :mod:`dlmkit.data.seeds`).

Draw layout, per row: first ``row_cols`` uniforms (per-row scalars such as ``t``), then an
``[L, pos_cols]`` block, position-major. With per-row generators, position ``i``'s numbers are
therefore the same whatever the padded length ``L`` is, so padding a sample differently in
another batch leaves its noise on real positions unchanged. Uniforms are float64 in ``[0, 1)``,
so comparisons against probabilities and ``floor(u * V)`` are exact to ~2^-53.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

Generators = torch.Generator | Sequence[torch.Generator]


def check_generator(generator: object, batch: int) -> None:
    """Require one ``torch.Generator`` or a sequence of exactly ``batch`` of them."""
    if isinstance(generator, torch.Generator):
        return
    if isinstance(generator, Sequence) and not isinstance(generator, (str, bytes)):
        if len(generator) != batch:
            raise ValueError(
                f"generator must be one torch.Generator or a list of one per row "
                f"(B = {batch}), got a list of length {len(generator)}"
            )
        for g in generator:
            if not isinstance(g, torch.Generator):
                raise TypeError(f"generator list entries must be torch.Generator, got {g!r}")
        return
    raise TypeError(
        "generator must be a torch.Generator or a list of one torch.Generator per row "
        f"(every random number comes from it; the global RNG is never used), got {generator!r}"
    )


def _rand(shape: tuple[int, ...], g: torch.Generator) -> torch.Tensor:
    return torch.rand(shape, generator=g, device=g.device, dtype=torch.float64)


def draw(
    generator: Generators, batch: int, length: int, row_cols: int, pos_cols: int,
    device: torch.device,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Draw per-row and per-position uniforms.

    Returns ``(row [B, row_cols], pos [B, L, pos_cols])``, float64 on ``device``.
    """
    check_generator(generator, batch)
    if isinstance(generator, torch.Generator):
        row = _rand((batch, row_cols), generator)
        pos = _rand((batch, length, pos_cols), generator)
    else:
        rows, poss = [], []
        for g in generator:
            rows.append(_rand((row_cols,), g))
            poss.append(_rand((length, pos_cols), g))
        row = torch.stack(rows) if rows else torch.empty(0, row_cols, dtype=torch.float64)
        pos = torch.stack(poss) if poss else torch.empty(0, length, pos_cols, dtype=torch.float64)
    return row.to(device), pos.to(device)


def draw_rows(generator: Generators, batch: int, cols: int, device: torch.device) -> torch.Tensor:
    """Draw ``[B, cols]`` per-row uniforms (row ``b`` from ``generator[b]`` for a list)."""
    return draw(generator, batch, 0, cols, 0, device)[0]


def uniform(generator: Generators, shape: Sequence[int], device: torch.device) -> torch.Tensor:
    """float64 uniforms ``[0, 1)`` of ``shape`` on ``device``; with a list, row ``b`` (index
    ``b`` of dimension 0) is drawn from ``generator[b]`` alone, so its numbers do not depend on
    how many other rows share the batch (the samplers' batch invariance)."""
    shape = tuple(shape)
    if isinstance(generator, torch.Generator):
        return _rand(shape, generator).to(device)
    check_generator(generator, shape[0])
    if not generator:
        return torch.empty(shape, dtype=torch.float64, device=device)
    return torch.stack([_rand(shape[1:], g) for g in generator]).to(device)


def select(generator: Generators, rows: Sequence[int] | torch.Tensor) -> Generators:
    """The generators of ``rows`` (a list's entries; a single generator is shared)."""
    if isinstance(generator, torch.Generator):
        return generator
    if isinstance(rows, torch.Tensor):
        rows = rows.tolist()
    return [generator[int(r)] for r in rows]


def for_row(generator: Generators, row: int) -> torch.Generator:
    """The generator row ``row`` draws from (a single generator serves every row)."""
    return generator if isinstance(generator, torch.Generator) else generator[row]


def block_values(pos_u: torch.Tensor, block_size: int) -> torch.Tensor:
    """Per-block uniforms read at each block's first position, broadcast back over the block.

    ``pos_u [B, L]`` -> ``[B, L]`` where position ``i`` gets ``pos_u[:, (i // S) * S]``.
    Taking the block's value from its first position keeps it independent of ``L``.
    """
    length = pos_u.shape[1]
    starts = (torch.arange(length, device=pos_u.device) // block_size) * block_size
    return pos_u[:, starts]
