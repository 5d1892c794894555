"""Brute-force references for the canvas/video masks (NATTEN, STA, Sparse VideoGen, VSA),
written from the specification one (q, kv) pair at a time in plain Python.

They share no code with ``dlmkit.masks``: coordinates are decoded by enumerating the layout,
windows by the centre-clamp formulation of the spec.
"""

from __future__ import annotations

import math

import torch


def _centre_window(q: int, n: int, left: int, right: int) -> tuple[int, int]:
    """Spec: centre = q clamped to [left, n-1-right]; window = [centre-left, centre+right].
    (When the kernel is larger than the axis, torch.clamp semantics: the max wins.)"""
    lo_c, hi_c = left, n - 1 - right
    centre = q if lo_c <= q <= hi_c else (lo_c if q < lo_c else hi_c)
    if lo_c > hi_c:
        centre = hi_c
    return centre - left, centre + right


# ---------------------------------------------------------------- NATTEN
def natten_layout(w: int, h: int, layout: str, tile_w: int = 1, tile_h: int = 1):
    """List: token index -> (y, x), built by enumerating the layout."""
    coords = []
    if layout == "row":
        for y in range(h):
            for x in range(w):
                coords.append((y, x))
    elif layout == "tiled":
        for ty in range(h // tile_h):
            for tx in range(w // tile_w):
                for iy in range(tile_h):
                    for ix in range(tile_w):
                        coords.append((ty * tile_h + iy, tx * tile_w + ix))
    elif layout == "morton":
        # Sort pixels by their Z-order key: interleave the low bits (x even, y odd), then the
        # remaining bits of the longer side on top.
        m = min(h, w).bit_length() - 1

        def key(y, x):
            code = 0
            for bit in range(m):
                code |= ((x >> bit) & 1) << (2 * bit)
                code |= ((y >> bit) & 1) << (2 * bit + 1)
            high = (x >> m) if w > h else (y >> m)
            return code | (high << (2 * m))

        pixels = [(y, x) for y in range(h) for x in range(w)]
        coords = sorted(pixels, key=lambda p: key(*p))
    else:
        raise AssertionError(layout)
    return coords


def natten_ref(w: int, h: int, kw: int, kh: int, layout: str = "row", tile_w=1, tile_h=1):
    coords = natten_layout(w, h, layout, tile_w, tile_h)
    rw, rh = kw // 2, kh // 2

    def allowed(b, q, k):
        (qy, qx), (ky, kx) = coords[q], coords[k]
        y0, y1 = _centre_window(qy, h, rh, rh)
        x0, x1 = _centre_window(qx, w, rw, rw)
        return y0 <= ky <= y1 and x0 <= kx <= x1

    return allowed


# ---------------------------------------------------------------- STA
def sta_ref(canvas, kernel, tile, text_len: int = 0):
    dims = len(canvas)
    n_tiles = [c // t for c, t in zip(canvas, tile)]
    kt = [k // t for k, t in zip(kernel, tile)]
    tile_numel = math.prod(tile)
    vision = math.prod(canvas)

    def tile_coords(i):
        t = i // tile_numel
        out = []
        for n in reversed(n_tiles):
            out.append(t % n)
            t //= n
        return list(reversed(out))

    def window(q, k):
        qc, kc = tile_coords(q), tile_coords(k)
        for a in range(dims):
            left = kt[a] // 2
            right = kt[a] // 2 if kt[a] % 2 else kt[a] // 2 - 1
            lo, hi = _centre_window(qc[a], n_tiles[a], left, right)
            if not lo <= kc[a] <= hi:
                return False
        return True

    def allowed(b, q, k):
        if q < vision and k < vision:
            return window(q, k)
        if q < vision:
            return vision <= k < vision + text_len
        return k < vision + text_len

    return allowed


# ---------------------------------------------------------------- Sparse VideoGen
def svg_spatial_ref(prompt_len, tokens_per_frame, width, attn_sink, round_width):
    band = (width * tokens_per_frame) // round_width * round_width
    sink = prompt_len + (tokens_per_frame if attn_sink else 0)

    def allowed(b, q, k):
        return q < prompt_len or k < sink or abs(q - k) < band

    return allowed


def svg_temporal_ref(prompt_len, num_frames, tokens_per_frame, width):
    band = (width * tokens_per_frame) // num_frames

    def allowed(b, q, k):
        if q < prompt_len or k < prompt_len:
            return True
        return abs((q - prompt_len) % tokens_per_frame - (k - prompt_len) % tokens_per_frame) < band

    return allowed


# ---------------------------------------------------------------- VSA
def vsa_ref(topk, tile_numel, vbs=None):
    """``topk``: nested list [batch][q_tile] -> iterable of kv tile ids."""

    def allowed(b, q, k):
        tile = k // tile_numel
        if tile not in set(topk[b][q // tile_numel]):
            return False
        return vbs is None or k % tile_numel < vbs[tile]

    return allowed


def vsa_metadata_ref(shape, tile):
    """(perm, variable sizes, non_pad positions) by enumeration.

    Tiles in t-major order; in each tile the real voxels (row-major) fill the first slots.
    ``perm[i]`` = original row-major index of the i-th real token in tiled order.
    """
    T, H, W = shape
    tt, th, tw = tile
    nt, nh, nw = (-(-s // t) for s, t in zip(shape, tile))
    numel = tt * th * tw
    perm, sizes, non_pad = [], [], []
    for a in range(nt):
        for b in range(nh):
            for c in range(nw):
                slot = 0
                tile_id = (a * nh + b) * nw + c
                for t in range(a * tt, min((a + 1) * tt, T)):
                    for h in range(b * th, min((b + 1) * th, H)):
                        for w in range(c * tw, min((c + 1) * tw, W)):
                            perm.append((t * H + h) * W + w)
                            non_pad.append(tile_id * numel + slot)
                            slot += 1
                sizes.append(slot)
    return perm, sizes, non_pad


def dense_attention(q, k, v, allowed: torch.Tensor):
    """Masked softmax attention in float64 (``allowed`` broadcastable bool)."""
    scores = (q.double() @ k.double().transpose(-1, -2)) / math.sqrt(q.shape[-1])
    scores = scores.masked_fill(~allowed, float("-inf"))
    return torch.softmax(scores, -1) @ v.double()
