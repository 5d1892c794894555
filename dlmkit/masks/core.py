"""``Mask``: one attention rule, rendered for every backend.

A mask is a vectorised *rule* ``rule(b, q, kv) -> bool`` over broadcastable integer index
tensors (True = may attend), for ``batch`` rows (1 = the same for every row) of ``q_len``
queries and ``kv_len`` keys. Structured masks also supply *row intervals*: for every query row
a short union of allowed key ranges. From those the tile map, the ``BlockMask`` and even the
dense forms are built without evaluating the rule on the whole token grid:

* ``.dense()`` / ``.additive(dtype)`` fill whole allowed tiles with one ``fill_`` and evaluate
  the rule only on tiles that are partially allowed, so the cost is the size of the output;
* ``.block_mask(block_size)`` builds both KV- and Q-side lists from the tile map in O(tiles);
* ``.mask_mod`` is the rule in FlexAttention's ``(b, h, q_idx, kv_idx)`` form.

A pattern whose tile map has a closed form cheaper than its row intervals (e.g. a dilated
window: one interval per visible key) may pass ``tiles=(q_block, kv_block) -> tile map``
instead; it is used for the ``BlockMask`` and the dense forms alike. ``BlockMask``s are memoised
per block size, so a mask kept in a :class:`MaskCache` is rendered once.

Rules must be written with tensor ops only (they run under ``torch.vmap`` in ``create_mask``
and inside compiled kernels), must not compare bool with bool and must not use integer ``abs``
(both miscompile in some Inductor/ptxas versions): compare integer ids and write two bounds.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from .blocks import block_mask_from_tiles
from .checks import broadcast_batch, check_block_size, check_positive_int
from .threads import single_threaded
from .tiles import (
    FULL,
    PARTIAL,
    RowIntervals,
    cdiv,
    intersect_intervals,
    normalize_intervals,
    tile_map_from_intervals,
    tile_map_from_rule,
    union_intervals,
)

Rule = Callable[[torch.Tensor, torch.Tensor, torch.Tensor], torch.Tensor]

# Dense rendering works tile by tile; 128 keeps the number of Python-level fills small while
# the partially allowed tiles (evaluated through the rule) stay a thin band.
_DENSE_TILE = 128
# Fallback dense rendering (rules without intervals) evaluates this many grid entries at once.
_ROW_CHUNK_ELEMENTS = 1 << 22


class Mask:
    """An immutable attention pattern over ``[batch, q_len, kv_len]``.

    Build one with a factory (``causal``, ``block_diffusion``, ...) or with
    :meth:`Mask.from_rule`. Combine with ``&`` and ``|``.
    """

    def __init__(
        self,
        rule: Rule,
        q_len: int,
        kv_len: int,
        batch: int = 1,
        *,
        intervals: Callable[[], RowIntervals] | None = None,
        tiles: Callable[[int, int], torch.Tensor] | None = None,
        name: str = "mask",
        device: torch.device | str | None = None,
    ) -> None:
        self.q_len = check_positive_int("q_len", q_len)
        self.kv_len = check_positive_int("kv_len", kv_len)
        self.batch = check_positive_int("batch", batch)
        self.name = name
        self.device = torch.device(device if device is not None else "cpu")
        if not callable(rule):
            raise TypeError(f"rule must be callable rule(b, q, kv) -> bool, got {rule!r}")
        if self.batch == 1:
            # Every row is the same: data captured by the rule has one row, so never index
            # it with the caller's batch index (FlexAttention passes real b values).
            self._rule = lambda b, q, kv: rule(torch.zeros_like(b), q, kv)
        else:
            self._rule = rule
        self._interval_fn = intervals
        self._intervals: RowIntervals | None = None
        self._tiles_fn = tiles
        self._block_masks: dict[tuple[int, int], object] = {}

    # ------------------------------------------------------------------ construction
    @classmethod
    def from_rule(
        cls,
        rule: Rule,
        q_len: int,
        kv_len: int,
        batch: int | None = None,
        *,
        intervals: Callable[[], RowIntervals] | None = None,
        tiles: Callable[[int, int], torch.Tensor] | None = None,
        name: str | None = None,
        device: torch.device | str | None = None,
    ) -> Mask:
        """Wrap a user rule ``rule(b, q, kv) -> bool tensor`` (broadcasting index tensors).

        ``b`` indexes per-row data captured by the rule (e.g. ``valid[b, kv] > 0``). Optional
        ``intervals() -> (lo, hi)`` of shape ``[batch or 1, q_len, K]`` describe each row as a
        union of half-open key ranges; with them the tile map is computed in O(tiles), without
        them ``.block_mask()`` evaluates the rule one tile-row at a time. ``tiles(q_block,
        kv_block)`` may instead give the exact tile map ``[batch or 1, n_q, n_kv]`` directly.
        """
        return cls(rule, q_len, kv_len, 1 if batch is None else batch, intervals=intervals,
                   tiles=tiles, name=name or getattr(rule, "__name__", "mask"), device=device)

    # ------------------------------------------------------------------ structure
    @property
    def has_intervals(self) -> bool:
        return self._interval_fn is not None

    @property
    def structured(self) -> bool:
        """True when the tile map comes from the block structure (intervals or closed form)
        rather than from evaluating the rule."""
        return self._interval_fn is not None or self._tiles_fn is not None

    def row_intervals(self) -> RowIntervals | None:
        """Normalised ``(lo, hi)`` ``[batch or 1, q_len, K]``, or None for a plain rule."""
        if self._interval_fn is None:
            return None
        if self._intervals is None:
            lo, hi = self._interval_fn()
            if lo.dim() != 3 or lo.shape != hi.shape or lo.shape[1] != self.q_len:
                raise ValueError(
                    f"{self.name}: intervals must be two [batch, q_len={self.q_len}, K] tensors, "
                    f"got {tuple(lo.shape)} and {tuple(hi.shape)}"
                )
            self._intervals = normalize_intervals(lo.long(), hi.long(), self.kv_len)
        return self._intervals

    def tile_map(self, block_size=128) -> torch.Tensor:
        """int8 ``[batch, n_q_tiles, n_kv_tiles]``: 0 empty, 1 partial, 2 full."""
        q_block, kv_block = check_block_size(block_size)
        if not self.structured:
            # Rule evaluation on [q_block, kv_len] slabs: large ops, worth every thread.
            return tile_map_from_rule(self._rule, self.batch, self.q_len, self.kv_len,
                                      q_block, kv_block, self.device)
        # The structured path is a chain of small index ops: one thread keeps it fast on a
        # busy machine (see threads.py).
        with single_threaded():
            if self._tiles_fn is not None:
                tiles = self._tiles_fn(q_block, kv_block)
                expected = (cdiv(self.q_len, q_block), cdiv(self.kv_len, kv_block))
                if tiles.dim() != 3 or tuple(tiles.shape[1:]) != expected:
                    raise ValueError(f"{self.name}: tiles() must return [batch, {expected[0]}, "
                                     f"{expected[1]}], got {tuple(tiles.shape)}")
                return tiles.to(torch.int8).expand(self.batch, *expected)
            tiles = tile_map_from_intervals(*self.row_intervals(), self.q_len, self.kv_len,
                                            q_block, kv_block)
            return tiles.expand(self.batch, *tiles.shape[1:])

    # ------------------------------------------------------------------ renderers
    @property
    def mask_mod(self) -> Callable:
        """FlexAttention ``mask_mod(b, h, q_idx, kv_idx) -> bool``."""
        rule = self._rule

        def mask_mod(b, h, q_idx, kv_idx):
            return rule(b, q_idx, kv_idx)

        mask_mod.__name__ = self.name
        return mask_mod

    def block_mask(self, block_size=128):
        """FlexAttention ``BlockMask`` with ``B = batch``, ``H = 1`` (broadcast over heads).

        Equal, list for list, to ``create_block_mask(self.mask_mod, batch, None, q_len, kv_len,
        BLOCK_SIZE=block_size)``, but built from the tile map without the token grid.
        """
        size = check_block_size(block_size)
        if size not in self._block_masks:
            self._block_masks[size] = block_mask_from_tiles(
                self.tile_map(size).contiguous(), self.q_len, self.kv_len, size, self.mask_mod)
        return self._block_masks[size]

    def dense(self) -> torch.Tensor:
        """bool ``[batch, 1, q_len, kv_len]``, True = may attend."""
        return self._render(torch.bool, True, False)

    def additive(self, dtype: torch.dtype = torch.float32) -> torch.Tensor:
        """``[batch, 1, q_len, kv_len]`` of ``dtype``: 0 allowed, ``finfo(dtype).min`` blocked.

        The blocked value is finite, so eager ``softmax(scores + mask)`` never yields NaN.
        """
        if not isinstance(dtype, torch.dtype) or not dtype.is_floating_point:
            raise TypeError(f"dtype must be a floating torch.dtype, got {dtype!r}")
        return self._render(dtype, 0.0, torch.finfo(dtype).min)

    def _render(self, dtype: torch.dtype, allow, block) -> torch.Tensor:
        out = torch.full((self.batch, 1, self.q_len, self.kv_len), block, dtype=dtype,
                         device=self.device)
        grid = out[:, 0]
        # A small mask is cheapest as one vectorised rule call; a large structured one tile by
        # tile (whole tiles filled, the rule only on partial tiles), which costs O(output).
        if self.structured and out.numel() > _ROW_CHUNK_ELEMENTS:
            self._render_by_tiles(grid, allow)
        else:
            self._render_by_rows(grid, allow)
        return out

    def _render_by_rows(self, grid: torch.Tensor, allow) -> None:
        rows = max(1, _ROW_CHUNK_ELEMENTS // (self.kv_len * self.batch))
        b = torch.arange(self.batch, device=self.device).view(-1, 1, 1)
        kv = torch.arange(self.kv_len, device=self.device).view(1, 1, -1)
        for start in range(0, self.q_len, rows):
            q = torch.arange(start, min(start + rows, self.q_len), device=self.device)
            allowed = self._rule(b, q.view(1, -1, 1), kv)
            grid[:, start:start + q.numel()].masked_fill_(allowed, allow)

    def _render_by_tiles(self, grid: torch.Tensor, allow) -> None:
        t = _DENSE_TILE
        tiles = self.tile_map(t)
        for kind in (FULL, PARTIAL):
            for b, i, j0, j1 in _tile_runs(tiles == kind):
                r0, r1 = i * t, min((i + 1) * t, self.q_len)
                c0, c1 = j0 * t, min(j1 * t, self.kv_len)
                view = grid[b, r0:r1, c0:c1]
                if kind == FULL:
                    view.fill_(allow)
                    continue
                q = torch.arange(r0, r1, device=self.device).view(1, -1, 1)
                kv = torch.arange(c0, c1, device=self.device).view(1, 1, -1)
                bi = torch.full((1, 1, 1), b, dtype=torch.long, device=self.device)
                view.masked_fill_(self._rule(bi, q, kv)[0], allow)

    # ------------------------------------------------------------------ combinators
    def _combine(self, other: Mask, op: str) -> Mask:
        if not isinstance(other, Mask):
            return NotImplemented
        if (self.q_len, self.kv_len) != (other.q_len, other.kv_len):
            raise ValueError(
                f"cannot combine masks of shapes ({self.q_len}, {self.kv_len}) and "
                f"({other.q_len}, {other.kv_len}): q_len and kv_len must match"
            )
        batch = broadcast_batch(self.batch, other.batch)
        r1, r2 = self._rule, other._rule
        intervals = None
        if self.has_intervals and other.has_intervals:
            merge = intersect_intervals if op == "&" else union_intervals

            def intervals():
                return merge(self.row_intervals(), other.row_intervals(), self.kv_len)

        if op == "&":
            def rule(b, q, kv):
                return r1(b, q, kv) & r2(b, q, kv)
        else:
            def rule(b, q, kv):
                return r1(b, q, kv) | r2(b, q, kv)
        return Mask(rule, self.q_len, self.kv_len, batch, intervals=intervals,
                    name=f"({self.name} {op} {other.name})", device=self.device)

    def __and__(self, other: Mask) -> Mask:
        return self._combine(other, "&")

    def __or__(self, other: Mask) -> Mask:
        return self._combine(other, "|")

    # ------------------------------------------------------------------ pictures
    def render(self, path, *, batch_index: int = 0, title: str | None = None):
        """Write a PNG picture of row ``batch_index`` to ``path``; returns the path."""
        from .render import render_png

        return render_png(self, path, batch_index=batch_index, title=title)

    def __str__(self) -> str:
        from .render import render_text

        return render_text(self)

    def __repr__(self) -> str:
        return (f"Mask(name={self.name!r}, batch={self.batch}, q_len={self.q_len}, "
                f"kv_len={self.kv_len}, structured={self.structured})")


def _tile_runs(selected: torch.Tensor) -> list[tuple[int, int, int, int]]:
    """Maximal runs of True along the last axis of ``[batch, n_q, n_kv]``: (b, i, j0, j1)."""
    padded = torch.nn.functional.pad(selected.to(torch.int8), (1, 1))
    step = padded[..., 1:] - padded[..., :-1]
    starts = (step == 1).nonzero().tolist()
    ends = (step == -1).nonzero().tolist()
    return [(b, i, j0, end[2]) for (b, i, j0), end in zip(starts, ends)]
