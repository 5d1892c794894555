"""Pictures of a mask: a PNG (matplotlib) and a terminal drawing.

Both work from the tile map when the mask is large, so drawing a 128k-token mask costs
O(cells shown), not O(q_len * kv_len).
"""

from __future__ import annotations

from pathlib import Path

import torch

from .tiles import FULL, PARTIAL, cdiv

_EXACT_LIMIT = 512  # up to this many rows/columns the PNG shows every token
_TEXT_COLUMNS = 64


def mask_picture(mask, batch_index: int, cells: int) -> tuple[torch.Tensor, int, int]:
    """A ``[rows, cols]`` float picture (1 allowed, 0.5 partly allowed, 0 blocked) and the
    number of tokens per cell along each axis."""
    if not 0 <= batch_index < mask.batch:
        raise ValueError(f"batch_index must be in [0, {mask.batch}), got {batch_index}")
    if mask.q_len <= cells and mask.kv_len <= cells:
        return mask.dense()[batch_index, 0].float(), 1, 1
    q_step, kv_step = cdiv(mask.q_len, cells), cdiv(mask.kv_len, cells)
    tiles = mask.tile_map((q_step, kv_step))[batch_index].clone()
    _judge_short_edges(mask, batch_index, tiles, q_step, kv_step)
    picture = torch.zeros(tiles.shape)
    picture[tiles == PARTIAL] = 0.5
    picture[tiles == FULL] = 1.0
    return picture, q_step, kv_step


def _judge_short_edges(mask, batch_index: int, tiles: torch.Tensor, q_step: int,
                       kv_step: int) -> None:
    """Mark FULL the cells of a short last row/column whose real tokens are all allowed.

    The tile map follows ``create_block_mask``: padding past ``q_len``/``kv_len`` counts as
    blocked, so such a cell is never FULL there; a picture judges a cell by its real tokens.
    Only PARTIAL edge cells are evaluated, O(edge cells), not the token grid."""
    n_q, n_kv = tiles.shape
    edge = set()
    if mask.q_len % q_step:
        edge.update((n_q - 1, j) for j in range(n_kv))
    if mask.kv_len % kv_step:
        edge.update((i, n_kv - 1) for i in range(n_q))
    b = torch.full((1, 1, 1), batch_index, dtype=torch.long, device=mask.device)
    for i, j in sorted(edge):
        if tiles[i, j] != PARTIAL:
            continue
        q = torch.arange(i * q_step, min((i + 1) * q_step, mask.q_len), device=mask.device)
        kv = torch.arange(j * kv_step, min((j + 1) * kv_step, mask.kv_len), device=mask.device)
        if bool(mask.mask_mod(b, 0, q.view(1, -1, 1), kv.view(1, 1, -1)).all()):
            tiles[i, j] = FULL


def render_text(mask, batch_index: int = 0, columns: int = _TEXT_COLUMNS) -> str:
    """Terminal drawing: ``#`` allowed, ``+`` partly allowed (down-sampled), ``.`` blocked."""
    picture, q_step, kv_step = mask_picture(mask, batch_index, columns)
    glyph = {1.0: "#", 0.5: "+", 0.0: "."}
    lines = [" ".join(glyph[float(v)] for v in row) for row in picture]
    header = f"{mask.name}: batch {mask.batch}, {mask.q_len} queries x {mask.kv_len} keys"
    if q_step > 1 or kv_step > 1:
        header += f" (one cell = {q_step}x{kv_step} tokens; + = partly allowed)"
    return "\n".join([header, *lines])


def render_png(mask, path, *, batch_index: int = 0, title: str | None = None,
               block_size: int | None = None) -> Path:
    """Write a PNG of the mask; small masks get token tick labels and a block grid."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    picture, q_step, kv_step = mask_picture(mask, batch_index, _EXACT_LIMIT)
    rows, cols = picture.shape
    size = max(3.0, min(10.0, 0.25 * max(rows, cols)))
    fig, ax = plt.subplots(figsize=(size * cols / max(rows, cols) + 1.5,
                                    size * rows / max(rows, cols) + 1.0))
    ax.imshow(picture.numpy(), cmap="Blues", vmin=0, vmax=1, interpolation="nearest")
    ax.set_title(title or mask.name, fontsize=9)
    ax.set_xlabel(f"key index{'' if kv_step == 1 else f' (x{kv_step})'}")
    ax.set_ylabel(f"query index{'' if q_step == 1 else f' (x{q_step})'}")
    if rows <= 64 and cols <= 64:
        ax.set_xticks(range(cols))
        ax.set_yticks(range(rows))
        ax.tick_params(labelsize=6)
        ax.set_xticks([x - 0.5 for x in range(cols + 1)], minor=True)
        ax.set_yticks([y - 0.5 for y in range(rows + 1)], minor=True)
        ax.grid(which="minor", color="#cccccc", linewidth=0.3)
        if block_size:
            for edge in range(0, max(rows, cols) + 1, block_size):
                ax.axhline(edge - 0.5, color="#d62728", linewidth=0.6)
                ax.axvline(edge - 0.5, color="#d62728", linewidth=0.6)
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path
