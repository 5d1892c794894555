"""Video-diffusion masks: Sliding-Tile Attention (STA) and Sparse VideoGen (SVG) heads.

* :func:`sta` -- 2-D or 3-D sliding-tile attention over a tile-major vision sequence followed by
  text tokens.
* :func:`svg_spatial`, :func:`svg_temporal` -- the two head patterns of Sparse VideoGen over
  ``[prompt | frame 0 | frame 1 | ...]``.

All three supply row intervals (a few contiguous key runs per query), so ``.block_mask()`` is
O(q_len * runs + tiles) and never evaluates the token grid.
"""

from __future__ import annotations

import math

import torch

from ..checks import check_int, check_positive_int
from ..core import Mask
from .natten import _in_window, _window_start


def _check_shape(name: str, value, dims: int | None = None) -> tuple[int, ...]:
    if isinstance(value, torch.Size):
        value = tuple(value)
    if not isinstance(value, (tuple, list)):
        raise TypeError(f"{name} must be a tuple of 2 (h, w) or 3 (t, h, w) ints, "
                        f"got {type(value).__name__} {value!r}")
    if len(value) not in (2, 3) or (dims is not None and len(value) != dims):
        wanted = f"{dims}" if dims is not None else "2 (h, w) or 3 (t, h, w)"
        raise ValueError(f"{name} must have {wanted} entries, got {len(value)}: {value!r}")
    return tuple(check_positive_int(f"{name}[{i}]", v) for i, v in enumerate(value))


def sta(canvas, kernel, tile, text_len: int = 0, *, seq_len: int | None = None,
        device=None) -> Mask:
    """Sliding-Tile Attention (2-D ``(h, w)`` or 3-D ``(t, h, w)``) with trailing text.

    The first ``V = prod(canvas)`` tokens are vision tokens in *tile-major* order (tile ``i //
    prod(tile)``; tiles row-major over the tile grid, t-major in 3-D), then ``text_len`` text
    tokens, then optional padding up to ``seq_len``. Per axis the window is ``kt = kernel /
    tile`` tiles wide: ``kt // 2`` tiles before the query's tile and ``kt - 1 - kt // 2`` after,
    shifted to stay on the tile grid (a kernel wider than the canvas covers the whole axis).

    * vision query -> vision keys in its tile window, and every text key;
    * text (or padding) query -> every vision and text key;
    * padding keys (``>= V + text_len``) are never attended.

    ``sta((6, 2), (4, 2), (2, 2), text_len=1)`` -- three 2x2 tiles stacked vertically, a
    kernel two tiles high (window ``[centre - 1, centre]``): tiles 0 and 1 see tiles {0, 1},
    tile 2 sees {1, 2}; every vision row sees the text token, the text row sees everything::

        tile0    # # # # # # # # . . . . #
                 (4 rows alike)
        tile1    # # # # # # # # . . . . #
                 (4 rows alike)
        tile2    . . . . # # # # # # # # #
                 (4 rows alike)
        text     # # # # # # # # # # # # #

    Args:
        canvas, kernel, tile: tuples of the same length (2 or 3) of positive ints; every
            canvas and kernel side must be a multiple of the tile side.
        text_len: number of text tokens after the vision tokens (>= 0).
        seq_len: total length (default ``V + text_len``; may be larger for padding).
    """
    canvas = _check_shape("canvas", canvas)
    kernel = _check_shape("kernel", kernel, len(canvas))
    tile = _check_shape("tile", tile, len(canvas))
    text_len = check_int("text_len", text_len, minimum=0)
    axes = "thw"[-len(canvas):]
    for a, c, k, t in zip(axes, canvas, kernel, tile):
        if c % t:
            raise ValueError(f"canvas[{a}]={c} must be a multiple of tile[{a}]={t}")
        if k % t:
            raise ValueError(f"kernel[{a}]={k} must be a multiple of tile[{a}]={t}")
    vision = math.prod(canvas)
    used = vision + text_len
    seq_len = used if seq_len is None else check_int("seq_len", seq_len, minimum=used)
    numel = math.prod(tile)
    grid = [c // t for c, t in zip(canvas, tile)]
    widths = [k // t for k, t in zip(kernel, tile)]
    lefts = [w // 2 for w in widths]

    def tile_coords(i):
        t = i // numel
        coords = []
        for n in reversed(grid[1:]):
            coords.append(t % n)
            t = t // n
        coords.append(t)
        return coords[::-1]

    def rule(b, q, kv):
        window = (q < vision) & (kv < vision)
        for qc, kc, n, width, left in zip(tile_coords(q), tile_coords(kv), grid, widths, lefts):
            window = window & _in_window(qc, kc, n, width, left)
        text_key = (kv >= vision) & (kv < used)
        return window | ((q < vision) & text_key) | ((q >= vision) & (kv < used))

    def intervals():
        return _sta_intervals(grid, widths, lefts, numel, vision, used, seq_len, device)

    dims = "x".join(map(str, canvas))
    name = (f"sta_{dims}_k{'x'.join(map(str, kernel))}_t{'x'.join(map(str, tile))}"
            f"_text{text_len}")
    return Mask(rule, seq_len, seq_len, 1, intervals=intervals, name=name, device=device)


def _sta_intervals(grid, widths, lefts, numel, vision, used, seq_len, device):
    """Per query tile: one run of tiles along the last axis per window position on the other
    axes, plus the text run; text/padding rows get ``[0, used)``."""
    n_tiles = math.prod(grid)
    tile_ids = torch.arange(n_tiles, device=device)
    coords, rest = [], tile_ids
    for n in reversed(grid):
        coords.append(rest % n)
        rest = rest // n
    coords = coords[::-1]
    starts = [_window_start(c, n, w, left)
              for c, n, w, left in zip(coords, grid, widths, lefts)]
    spans = [min(w, n) for w, n in zip(widths, grid)]
    # Tile id of the first window tile for every combination of the outer axes' offsets.
    first = torch.zeros(n_tiles, 1, dtype=torch.long, device=device)
    for axis in range(len(grid) - 1):
        pos = starts[axis].unsqueeze(-1) + torch.arange(spans[axis], device=device)
        first = (first.unsqueeze(-1) * grid[axis] + pos.unsqueeze(1)).flatten(1)
    first = first * grid[-1] + starts[-1].unsqueeze(-1)
    lo_tiles = first * numel
    hi_tiles = (first + spans[-1]) * numel
    text_lo = torch.full((n_tiles, 1), vision, device=device)
    text_hi = torch.full((n_tiles, 1), used, device=device)
    lo = torch.cat([lo_tiles, text_lo], -1).repeat_interleave(numel, 0)
    hi = torch.cat([hi_tiles, text_hi], -1).repeat_interleave(numel, 0)
    k = lo.shape[-1]
    rest_rows = seq_len - vision
    if rest_rows:
        lo_rest = torch.full((rest_rows, k), seq_len, device=device)
        hi_rest = torch.full((rest_rows, k), seq_len, device=device)
        lo_rest[:, 0], hi_rest[:, 0] = 0, used
        lo, hi = torch.cat([lo, lo_rest]), torch.cat([hi, hi_rest])
    return lo.unsqueeze(0), hi.unsqueeze(0)


# ---------------------------------------------------------------- Sparse VideoGen
def _svg_args(prompt_len, num_frames, tokens_per_frame, width):
    prompt_len = check_int("prompt_len", prompt_len, minimum=0)
    num_frames = check_positive_int("num_frames", num_frames)
    tokens_per_frame = check_positive_int("tokens_per_frame", tokens_per_frame)
    if isinstance(width, bool) or not isinstance(width, (int, float)) or not width > 0:
        raise (TypeError if not isinstance(width, (int, float)) or isinstance(width, bool)
               else ValueError)(f"width must be a positive number, got {width!r}")
    return prompt_len, num_frames, tokens_per_frame, width


def svg_spatial(prompt_len: int = 226, num_frames: int = 13, tokens_per_frame: int = 1350,
                width: float = 2, attn_sink: bool = False, round_width: int = 128, *,
                device=None) -> Mask:
    """Sparse VideoGen *spatial* head over ``[prompt | num_frames frames]``.

    Length ``prompt_len + num_frames * tokens_per_frame``. Prompt rows and prompt columns are
    open (plus the first frame's columns when ``attn_sink``); video tokens otherwise see a band
    ``abs(q - kv) < band`` with ``band = floor(width * tokens_per_frame / round_width) *
    round_width`` -- roughly ``width`` neighbouring frames, rounded down to kernel tiles. If
    ``round_width > width * tokens_per_frame`` the band vanishes (video rows see only the
    prompt), as in attention-gym; a configuration that would leave rows empty is rejected.

    ``svg_spatial(2, 3, 2, width=1, round_width=2)`` -- band 2::

        P P f f f f f f
        # # # # # # # #   prompt rows
        # # # # # # # #
        # # # # . . . .   video rows: prompt + abs(q - kv) < 2
        # # # # # . . .
        # # . # # # . .
        ...
    """
    prompt_len, num_frames, tokens_per_frame, width = _svg_args(
        prompt_len, num_frames, tokens_per_frame, width)
    round_width = check_positive_int("round_width", round_width)
    if not isinstance(attn_sink, bool):
        raise TypeError(f"attn_sink must be a bool, got {type(attn_sink).__name__}")
    band = int(width * tokens_per_frame // round_width) * round_width
    sink = prompt_len + (tokens_per_frame if attn_sink else 0)
    n = prompt_len + num_frames * tokens_per_frame
    if band == 0 and sink == 0:
        raise ValueError(
            f"svg_spatial: band floor(width*tokens_per_frame/round_width)*round_width = 0 "
            f"(width={width}, tokens_per_frame={tokens_per_frame}, round_width={round_width}) "
            f"with prompt_len=0 and attn_sink=False leaves every row empty")

    def rule(b, q, kv):
        inside = (q < n) & (kv < n)
        near = (q - kv < band) & (kv - q < band)
        return inside & ((q < prompt_len) | (kv < sink) | near)

    def intervals():
        q = torch.arange(n, device=device)
        prompt_row = q < prompt_len
        lo = torch.stack([torch.zeros_like(q), torch.where(prompt_row, n, q - band + 1)], -1)
        hi = torch.stack([torch.where(prompt_row, n, sink), torch.where(prompt_row, n, q + band)],
                         -1)
        return lo.unsqueeze(0), hi.unsqueeze(0)

    name = f"svg_spatial_p{prompt_len}_f{num_frames}x{tokens_per_frame}_band{band}"
    if attn_sink:
        name += "_sink"
    return Mask(rule, n, n, 1, intervals=intervals, name=name, device=device)


def svg_temporal(prompt_len: int = 226, num_frames: int = 13, tokens_per_frame: int = 1350,
                 width: float = 2, *, device=None) -> Mask:
    """Sparse VideoGen *temporal* head over ``[prompt | num_frames frames]``.

    Prompt rows and columns are open; a video query at in-frame position ``i = (q - P) %
    tokens_per_frame`` sees, in *every* frame, the keys whose in-frame position ``j`` has
    ``abs(i - j) < floor(width * tokens_per_frame / num_frames)`` (not circular). Meant for the
    SVG head-wise layout in which each frame's tokens are contiguous.

    ``svg_temporal(1, 2, 3, width=2)`` -- band ``floor(2 * 3 / 2) = 3``; with ``width=1``
    the band is 1 and each video token sees the prompt and itself in every frame::

        P f0 f0 f0 f1 f1 f1
        #  #  #  #  #  #  #    prompt row
        #  #  .  .  #  .  .    f0 token 0 (width=1)
        #  .  #  .  .  #  .
        #  .  .  #  .  .  #

    A configuration whose band is 0 with ``prompt_len=0`` (every video row empty) is rejected.
    """
    prompt_len, num_frames, tokens_per_frame, width = _svg_args(
        prompt_len, num_frames, tokens_per_frame, width)
    band = int(width * tokens_per_frame // num_frames)
    n = prompt_len + num_frames * tokens_per_frame
    tpf = tokens_per_frame
    if band == 0 and prompt_len == 0:
        raise ValueError(
            f"svg_temporal: band floor(width*tokens_per_frame/num_frames) = 0 (width={width}, "
            f"tokens_per_frame={tpf}, num_frames={num_frames}) with prompt_len=0 leaves every "
            f"row empty")

    def rule(b, q, kv):
        inside = (q < n) & (kv < n)
        # (x - P) % tpf with x >= P only matters; clamp keeps the modulo argument >= 0.
        qi = (q - prompt_len).clamp(min=0) % tpf
        ki = (kv - prompt_len).clamp(min=0) % tpf
        near = (qi - ki < band) & (ki - qi < band)
        return inside & ((q < prompt_len) | (kv < prompt_len) | near)

    def intervals():
        q = torch.arange(n, device=device)
        prompt_row = (q < prompt_len).unsqueeze(-1)
        i = ((q - prompt_len).clamp(min=0) % tpf).unsqueeze(-1)
        frame = prompt_len + torch.arange(num_frames, device=device) * tpf
        lo = frame + (i - band + 1).clamp(min=0)
        hi = frame + (i + band).clamp(max=tpf)
        lo = torch.where(prompt_row, n, lo)
        hi = torch.where(prompt_row, n, hi)
        head_lo = torch.zeros(n, 1, dtype=torch.long, device=device)
        head_hi = torch.where(prompt_row, n, prompt_len)
        return (torch.cat([head_lo, lo], -1).unsqueeze(0),
                torch.cat([head_hi, hi], -1).unsqueeze(0))

    name = f"svg_temporal_p{prompt_len}_f{num_frames}x{tpf}_band{band}"
    return Mask(rule, n, n, 1, intervals=intervals, name=name, device=device)


EXAMPLES = {
    "sta_2d": lambda seq_len, block_size: _sta_example(seq_len, 2),
    "sta_3d": lambda seq_len, block_size: _sta_example(seq_len, 3),
    "svg_spatial": lambda seq_len, block_size: _svg_example(seq_len, svg_spatial),
    "svg_temporal": lambda seq_len, block_size: _svg_example(seq_len, svg_temporal),
}


def _sta_example(seq_len: int, dims: int) -> Mask:
    """``seq_len`` tokens: tiles of 4x4 (2-D) / 2x4x4 (3-D), halved while fewer than 16 fit, a
    3-tile kernel per axis, about 1/16 of the tokens text (the rest of a canvas made of whole
    tiles)."""
    tile = (4, 4) if dims == 2 else (2, 4, 4)
    text = max(1, seq_len // 16)
    while math.prod(tile) > 1 and (seq_len - text) // math.prod(tile) < 16:
        tile = tuple(max(1, t // 2) for t in tile)
    numel = math.prod(tile)
    tiles = max(1, (seq_len - text) // numel)
    if dims == 2:
        side = max(1, math.isqrt(tiles))
        grid = (side, max(1, tiles // side))
    else:
        side = max(1, round(tiles ** (1 / 3)))
        rest = max(1, tiles // side)
        hw = max(1, math.isqrt(rest))
        grid = (side, hw, max(1, rest // hw))
    canvas = tuple(g * t for g, t in zip(grid, tile))
    kernel = tuple(3 * t for t in tile)
    return sta(canvas, kernel, tile, text_len=max(0, seq_len - math.prod(canvas)))


def _svg_example(seq_len: int, factory) -> Mask:
    """13 frames plus a 1/64 prompt (Sparse VideoGen's frame count)."""
    prompt = max(1, seq_len // 64)
    frames = 13
    per_frame = max(1, (seq_len - prompt) // frames)
    return factory(prompt, frames, per_frame, width=2)
