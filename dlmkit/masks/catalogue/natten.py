"""Neighbourhood attention (NATTEN) on a 2-D canvas, in three token layouts.

Every token is a pixel ``(y, x)`` of a ``canvas_h x canvas_w`` canvas. A query attends to the
keys inside a ``window_h x window_w`` window centred on it, where ``window = 2 * (kernel // 2)
+ 1``; near an edge the window is shifted (not shrunk) so that it stays inside the canvas, and
every query sees the same number of keys. Along an axis shorter than the window, the window is
the whole axis.

Layouts (how a token index maps to ``(y, x)``)::

    canvas 4 wide x 2 high
    layout="row"                 layout="tiled", tile 2x2     layout="morton"
    0 1 2 3                      0 1 4 5                      0 1 4 5
    4 5 6 7                      2 3 6 7                      2 3 6 7

* ``row``: row-major, ``y = i // canvas_w``, ``x = i % canvas_w``. attention-gym's
  ``generate_natten`` clamps the row with the *width* and the column with the *height*; on a
  non-square canvas its windows are wrong (6x3 canvas, 3x3 kernel: the last row gets 6 keys
  instead of 9). Here each axis uses its own size.
* ``tiled``: tiles of ``tile_h x tile_w`` pixels, tiles row-major over the tile grid, pixels
  row-major inside a tile. The canvas must divide into whole tiles (checked).
* ``morton``: Z-order. Both sides must be powers of two (checked). With ``m = log2(min(canvas_h,
  canvas_w))`` the low ``2m`` bits of the index interleave ``x`` (even bits) and ``y`` (odd
  bits) -- the classic Morton code on a square canvas -- and the remaining high bits extend the
  longer axis (i.e. square Morton tiles laid out along the long side).

Even kernel sizes: like attention-gym (and NATTEN's odd-window convention) the window is
``2 * (kernel // 2) + 1`` wide, so an even ``kernel`` of 4 gives a window of 5. Pass odd sizes
to get exactly what you ask for.
"""

from __future__ import annotations

import torch

from ..checks import check_positive_int
from ..core import Mask

LAYOUTS = ("row", "tiled", "morton")


def _window_start(pos, size: int, width: int, left: int):
    """First key coordinate of a ``width``-wide window centred (``left`` before) on ``pos`` and
    shifted to stay inside ``[0, size)``; 0 when the axis is shorter than the window."""
    return (pos - left).clamp(min=0).clamp(max=max(size - width, 0))


def _in_window(qpos, kpos, size: int, width: int, left: int):
    start = _window_start(qpos, size, width, left)
    return (kpos >= start) & (kpos < start + width)


class _Canvas:
    """Token index <-> pixel coordinates for one layout (tensor ops only)."""

    def __init__(self, h: int, w: int, layout: str, tile_h: int, tile_w: int) -> None:
        self.h, self.w, self.layout = h, w, layout
        self.tile_h, self.tile_w = tile_h, tile_w
        if layout == "morton":
            bits_h, bits_w = h.bit_length() - 1, w.bit_length() - 1
            self.bits = min(bits_h, bits_w)
            self.long_axis_x = bits_w > bits_h

    def coords(self, i):
        """``(y, x)`` of token index tensor ``i``."""
        if self.layout == "row":
            return i // self.w, i % self.w
        if self.layout == "tiled":
            per_tile = self.tile_h * self.tile_w
            tile, inner = i // per_tile, i % per_tile
            tiles_x = self.w // self.tile_w
            y = (tile // tiles_x) * self.tile_h + inner // self.tile_w
            x = (tile % tiles_x) * self.tile_w + inner % self.tile_w
            return y, x
        m = self.bits
        x = torch.zeros_like(i)
        y = torch.zeros_like(i)
        for bit in range(m):
            x = x | (((i >> (2 * bit)) & 1) << bit)
            y = y | (((i >> (2 * bit + 1)) & 1) << bit)
        high = (i >> (2 * m)) << m
        if self.long_axis_x:
            x = x | high
        else:
            y = y | high
        return y, x

    def index(self, y, x):
        """Token index of pixel ``(y, x)`` (inverse of :meth:`coords`; row and tiled only)."""
        if self.layout == "row":
            return y * self.w + x
        tiles_x = self.w // self.tile_w
        tile = (y // self.tile_h) * tiles_x + x // self.tile_w
        inner = (y % self.tile_h) * self.tile_w + x % self.tile_w
        return tile * (self.tile_h * self.tile_w) + inner


def _check_layout_args(layout, canvas_w, canvas_h, tile_w, tile_h) -> tuple[int, int]:
    if layout not in LAYOUTS:
        raise ValueError(f"layout must be one of {LAYOUTS}, got {layout!r}")
    if layout != "tiled":
        if tile_w is not None or tile_h is not None:
            raise ValueError(f"tile_w/tile_h are only used with layout='tiled', got layout="
                             f"{layout!r} with tile_w={tile_w!r}, tile_h={tile_h!r}")
        if layout == "morton":
            for name, size in (("canvas_w", canvas_w), ("canvas_h", canvas_h)):
                if size & (size - 1):
                    raise ValueError(f"layout='morton' needs power-of-two canvas sides, got "
                                     f"{name}={size}; use layout='tiled' or 'row'")
        return 1, 1
    if tile_w is None:
        raise ValueError("layout='tiled' needs tile_w (and optionally tile_h, default tile_w)")
    tile_w = check_positive_int("tile_w", tile_w)
    tile_h = tile_w if tile_h is None else check_positive_int("tile_h", tile_h)
    for name, size, tname, tile in (("canvas_w", canvas_w, "tile_w", tile_w),
                                    ("canvas_h", canvas_h, "tile_h", tile_h)):
        if size % tile:
            raise ValueError(f"layout='tiled' needs {name} divisible by {tname}, got "
                             f"{name}={size}, {tname}={tile}")
    return tile_h, tile_w


def natten(canvas_w: int, canvas_h: int, kernel_w: int, kernel_h: int | None = None, *,
           layout: str = "row", tile_w: int | None = None, tile_h: int | None = None,
           device=None) -> Mask:
    """Neighbourhood attention over a ``canvas_h x canvas_w`` canvas (``canvas_w * canvas_h``
    tokens); the argument order follows attention-gym's ``generate_natten``.

    ``natten(4, 3, 3)`` -- row layout, 4 wide x 3 high. Query 0 (corner ``(0, 0)``) has its
    window shifted inside the canvas; query 7 (``(1, 3)``, right edge) likewise::

        query 0        query 7
        # # # .        . # # #
        # # # .        . # # #
        # # # .        . # # #

    Args:
        canvas_w, canvas_h: canvas width and height in pixels (> 0).
        kernel_w: window width; kernel_h: window height (default ``kernel_w``). The window is
            ``2 * (kernel // 2) + 1`` wide (even sizes round up by one, see the module notes).
        layout: ``"row"``, ``"tiled"`` or ``"morton"`` (see the module notes).
        tile_w, tile_h: tile size for ``layout="tiled"`` (``tile_h`` defaults to ``tile_w``);
            the canvas must be a whole number of tiles.

    The row and tiled layouts supply row intervals (a window is a few contiguous runs per
    query), so ``.block_mask()`` is O(q_len * kernel_h + tiles); the Morton layout evaluates
    the rule one tile-row at a time (memory O(block * tokens)).
    """
    canvas_w = check_positive_int("canvas_w", canvas_w)
    canvas_h = check_positive_int("canvas_h", canvas_h)
    kernel_w = check_positive_int("kernel_w", kernel_w)
    kernel_h = kernel_w if kernel_h is None else check_positive_int("kernel_h", kernel_h)
    th, tw = _check_layout_args(layout, canvas_w, canvas_h, tile_w, tile_h)
    canvas = _Canvas(canvas_h, canvas_w, layout, th, tw)
    n = canvas_w * canvas_h
    rad_h, rad_w = kernel_h // 2, kernel_w // 2
    win_h, win_w = 2 * rad_h + 1, 2 * rad_w + 1

    def rule(b, q, kv):
        qy, qx = canvas.coords(q)
        ky, kx = canvas.coords(kv)
        inside = (q < n) & (kv < n)
        return (inside & _in_window(qy, ky, canvas_h, win_h, rad_h)
                & _in_window(qx, kx, canvas_w, win_w, rad_w))

    intervals = None
    if layout in ("row", "tiled"):
        def intervals():
            return _natten_intervals(canvas, n, win_h, rad_h, win_w, rad_w, device)

    tiles = f"_{tw}x{th}" if layout == "tiled" else ""
    name = f"natten_{layout}{tiles}_{canvas_w}x{canvas_h}_k{kernel_w}x{kernel_h}"
    return Mask(rule, n, n, 1, intervals=intervals, name=name, device=device)


def _natten_intervals(canvas: _Canvas, n: int, win_h, rad_h, win_w, rad_w, device):
    """Row intervals: one run per (window row, tile column touched) -- the pixels of a window
    row inside one tile are contiguous in both the row and the tiled layout."""
    q = torch.arange(n, device=device)
    qy, qx = canvas.coords(q)
    rows = min(win_h, canvas.h)
    y0 = _window_start(qy, canvas.h, win_h, rad_h)
    x0 = _window_start(qx, canvas.w, win_w, rad_w)
    span = min(win_w, canvas.w)
    x1 = x0 + span  # exclusive
    ky = y0.unsqueeze(-1) + torch.arange(rows, device=device)  # [n, rows]
    if canvas.layout == "row":
        lo = ky * canvas.w + x0.unsqueeze(-1)
        hi = ky * canvas.w + x1.unsqueeze(-1)
        return lo.unsqueeze(0), hi.unsqueeze(0)
    tw = canvas.tile_w
    cols = min(canvas.w // tw, (span + tw - 2) // tw + 1)  # tile columns a run can touch
    c = (x0 // tw).view(n, 1, 1) + torch.arange(cols, device=device).view(1, 1, cols)
    seg_lo = torch.maximum(x0.view(n, 1, 1), c * tw)
    seg_hi = torch.minimum(x1.view(n, 1, 1), (c + 1) * tw)
    seg_hi = torch.maximum(seg_hi, seg_lo)  # unused tile columns become empty runs
    ky = ky.unsqueeze(-1).expand(n, rows, cols)
    start = canvas.index(ky, seg_lo.clamp(max=canvas.w - 1).expand(n, rows, cols))
    lo = start.reshape(1, n, rows * cols)
    hi = (start + (seg_hi - seg_lo)).reshape(1, n, rows * cols)
    return lo, hi


EXAMPLES = {
    "natten": lambda seq_len, block_size: _example(seq_len, "row"),
    "natten_tiled": lambda seq_len, block_size: _example(seq_len, "tiled"),
    "natten_morton": lambda seq_len, block_size: _example(seq_len, "morton"),
}


def _example(seq_len: int, layout: str) -> Mask:
    """A square power-of-two canvas (multiple of 8) with about ``seq_len`` pixels, 13x13
    kernel (smaller on tiny canvases), 8x8 tiles."""
    side = 8
    while (2 * side) ** 2 <= seq_len:
        side *= 2
    kernel = min(13, side - 1)
    tiles = {"tile_w": 8} if layout == "tiled" else {}
    return natten(side, side, kernel, layout=layout, **tiles)
