"""Sliding-window masks: causal, dilated (symmetric) and Longformer global + window.

    sliding_window(6, 2)        dilated_sliding_window(6, 2, 2)   global_sliding_window(6, 1, g)
                                                                   g = [1, 0, 0, 0, 0, 0]
    q0  # . . . . .             q0  # . # . . .                   q0  # # # # # #
    q1  # # . . . .             q1  . # . # . .                   q1  # # # . . .
    q2  # # # . . .             q2  # . # . # .                   q2  # # # # . .
    q3  . # # # . .             q3  . # . # . #                   q3  # . # # # .
    q4  . . # # # .             q4  . . # . # .                   q4  # . . # # #
    q5  . . . # # #             q5  . . . # . #                   q5  # . . . # #

``window`` is an *inclusive* distance: the causal window of query ``q`` is keys
``q - window .. q`` (``window + 1`` keys, fewer at the start). The dilated and global windows
are symmetric (bidirectional); AND them with :func:`~dlmkit.masks.causal.causal` for a causal
variant.
"""

from __future__ import annotations

import torch

from ..causal import ALIGNMENTS
from ..checks import check_int, check_positive_int
from ..core import Mask
from ..tiles import FULL, cdiv


def sliding_window(q_len: int, window: int, kv_len: int | None = None, *,
                   align: str = "top_left", device=None) -> Mask:
    """Causal sliding window: attend iff ``q' - window <= kv <= q'``.

    ``q' = q`` for ``align="top_left"`` and ``q + kv_len - q_len`` for ``"bottom_right"``
    (the last query sees the last key: decoding against a KV cache). ``window`` counts keys
    *before* the query's own position, so each row sees up to ``window + 1`` keys::

        sliding_window(5, 1)
        q0  # . . . .
        q1  # # . . .
        q2  . # # . .
        q3  . . # # .
        q4  . . . # #

    Args:
        q_len: number of queries (> 0).
        window: inclusive look-back distance (>= 0; 0 = only the diagonal).
        kv_len: number of keys (> 0), defaults to ``q_len``. Shapes that would leave a
            row with no key (``kv_len < q_len - window`` top-left, ``kv_len < q_len``
            bottom-right) are rejected.
        align: ``"top_left"`` or ``"bottom_right"``.
    """
    q_len = check_positive_int("q_len", q_len)
    kv_len = q_len if kv_len is None else check_positive_int("kv_len", kv_len)
    window = check_int("window", window, minimum=0)
    if align not in ALIGNMENTS:
        raise ValueError(f"align must be one of {ALIGNMENTS}, got {align!r}")
    shift = kv_len - q_len if align == "bottom_right" else 0
    if shift < 0:
        raise ValueError(
            f"sliding_window: align='bottom_right' needs kv_len >= q_len, got q_len={q_len}, "
            f"kv_len={kv_len} (query 0 would see no key)")
    if q_len - 1 + shift - window >= kv_len:
        raise ValueError(
            f"sliding_window: with q_len={q_len}, kv_len={kv_len}, window={window} the last "
            f"queries see no key; use kv_len >= q_len - window or align='bottom_right'")
    w = window

    def rule(b, q, kv):
        return (kv <= q + shift) & (kv >= q + shift - w)

    def intervals():
        q = torch.arange(q_len, device=device).view(1, q_len, 1)
        return q + shift - w, q + shift + 1

    return Mask(rule, q_len, kv_len, 1, intervals=intervals,
                name=f"sliding_window_{w}", device=device)


def _dilated_tiles(window: int, dilation: int, n: int, device):
    """Closed-form tile map of a dilated window over ``n x n``, O(tiles) (its row intervals
    have ``2 * (window // dilation) + 1`` singleton slots per row)."""

    def tiles(q_block: int, kv_block: int) -> torch.Tensor:
        w, d = window, dilation
        i = torch.arange(cdiv(n, q_block), device=device).view(-1, 1)
        j = torch.arange(cdiv(n, kv_block), device=device).view(1, -1)
        q_end, kv_end = (i + 1) * q_block, (j + 1) * kv_block
        # Differences q - kv inside tile (i, j) are every integer in [low, high].
        low = i * q_block - (kv_end.clamp(max=n) - 1)
        high = q_end.clamp(max=n) - 1 - j * kv_block
        a, b = low.clamp(min=-w), high.clamp(max=w)
        touched = (a <= b) & (torch.div(b, d, rounding_mode="floor") * d >= a)
        unpadded = (q_end <= n) & (kv_end <= n)
        every = (low >= -w) & (high <= w) & ((low == high) | (d == 1))
        out = touched.to(torch.int8)
        out[touched & every & unpadded] = FULL
        return out.unsqueeze(0)

    return tiles


def dilated_sliding_window(seq_len: int, window: int, dilation: int, *, device=None) -> Mask:
    """Symmetric dilated window: attend iff ``|q - kv| <= window`` and
    ``(q - kv) % dilation == 0``.

    Bidirectional (not causal), every ``dilation``-th key within distance ``window``::

        dilated_sliding_window(7, 4, 2)
        q0  # . # . # . .
        q1  . # . # . # .
        q2  # . # . # . #
        q3  . # . # . # .

    Args:
        seq_len: queries = keys (> 0).
        window: inclusive distance (>= 0).
        dilation: key stride (>= 1; 1 = plain symmetric window).

    The tile map (hence ``.block_mask()`` and ``.dense()``) is computed per tile in closed
    form, O(tiles); row intervals (one slot per visible key) are still provided for ``&``/``|``.
    """
    seq_len = check_positive_int("seq_len", seq_len)
    window = check_int("window", window, minimum=0)
    dilation = check_int("dilation", dilation, minimum=1)
    w, d = window, dilation
    steps = w // d

    def rule(b, q, kv):
        near = (kv <= q + w) & (kv >= q - w)
        if d == 1:
            return near
        # (q - kv) % d == 0 without a signed modulo of a possibly negative difference.
        return near & ((q + d * (w + 1) - kv) % d == 0)

    def intervals():
        q = torch.arange(seq_len, device=device).view(1, seq_len, 1)
        if d == 1:
            return q - w, q + w + 1
        lo = q + d * torch.arange(-steps, steps + 1, device=device).view(1, 1, -1)
        return lo, lo + 1

    return Mask(rule, seq_len, seq_len, 1, intervals=intervals,
                tiles=_dilated_tiles(w, d, seq_len, device),
                name=f"dilated_sliding_window_{w}_{d}", device=device)


def _check_global(is_global, seq_len: int) -> torch.Tensor:
    if not isinstance(is_global, torch.Tensor):
        raise TypeError(f"is_global must be a bool/0-1 torch.Tensor of shape [seq_len] or "
                        f"[batch, seq_len], got {type(is_global).__name__}")
    if is_global.dim() == 1:
        is_global = is_global.unsqueeze(0)
    if is_global.dim() != 2 or is_global.shape[1] != seq_len or is_global.shape[0] < 1:
        raise ValueError(f"is_global must have shape [{seq_len}] or [batch, {seq_len}] "
                         f"(seq_len={seq_len}), got {tuple(is_global.shape)}")
    if is_global.dtype != torch.bool and not bool(((is_global == 0) | (is_global == 1)).all()):
        raise ValueError("is_global must hold only 0/1 (or bool) values")
    return is_global.to(torch.int8)


def global_sliding_window(seq_len: int, window: int, is_global, *, device=None) -> Mask:
    """Longformer: symmetric window plus global tokens.

    Attend iff ``|q - kv| <= window`` or ``is_global[q]`` or ``is_global[kv]``: a global token
    sees everything and is seen by everyone. Global positions are *data* (``is_global``, a
    bool/0-1 tensor ``[seq_len]`` or ``[batch, seq_len]`` for one layout per row), so changing
    them does not change the rule's code::

        global_sliding_window(6, 1, torch.tensor([0, 0, 1, 0, 0, 0]))
        q0  # # # . . .
        q1  # # # . . .
        q2  # # # # # #
        q3  . . # # # .
        q4  . . # # # #
        q5  . . # . # #

    Row intervals: the window plus one slot per run of global tokens.
    """
    seq_len = check_positive_int("seq_len", seq_len)
    window = check_int("window", window, minimum=0)
    glob = _check_global(is_global, seq_len)
    device = glob.device if device is None else torch.device(device)
    glob = glob.to(device)
    batch, w, last = glob.shape[0], window, seq_len - 1

    def rule(b, q, kv):
        gq = glob[b, q.clamp(0, last)] > 0
        gk = glob[b, kv.clamp(0, last)] > 0
        return ((kv <= q + w) & (kv >= q - w)) | gq | gk

    def intervals():
        q = torch.arange(seq_len, device=device).view(1, seq_len, 1)
        # Runs of global tokens per row, padded with empty slots to the longest row.
        padded = torch.nn.functional.pad(glob, (1, 1))
        step = padded[:, 1:] - padded[:, :-1]
        starts, ends = step == 1, step == -1
        runs = max(1, int(starts.sum(1).max()))
        position = torch.arange(seq_len + 1, device=device)

        def first(selected):  # the positions of selected entries, packed to the left
            keyed = torch.where(selected, position, seq_len + 1)
            return keyed.sort(dim=1).values[:, :runs].clamp(max=seq_len)

        run_lo, run_hi = first(starts), first(ends)
        run_lo = torch.where(run_hi > run_lo, run_lo, seq_len)
        run_hi = torch.where(run_hi > run_lo, run_hi, seq_len)
        glob_row = (glob > 0).unsqueeze(-1)
        lo = torch.cat([(q - w).expand(batch, seq_len, 1),
                        run_lo.unsqueeze(1).expand(batch, seq_len, runs)], -1)
        hi = torch.cat([(q + w + 1).expand(batch, seq_len, 1),
                        run_hi.unsqueeze(1).expand(batch, seq_len, runs)], -1)
        lo = torch.where(glob_row, 0, lo)
        hi = torch.where(glob_row, seq_len, hi)
        return lo, hi

    return Mask(rule, seq_len, seq_len, batch, intervals=intervals,
                name=f"global_sliding_window_{w}", device=device)


def _every(seq_len: int, stride: int) -> torch.Tensor:
    g = torch.zeros(seq_len, dtype=torch.bool)
    g[::stride] = True
    return g


EXAMPLES = {
    "sliding_window": lambda seq_len, block_size: sliding_window(seq_len, block_size),
    "dilated_sliding_window": lambda seq_len, block_size: dilated_sliding_window(
        seq_len, block_size, 2),
    "global_sliding_window": lambda seq_len, block_size: global_sliding_window(
        seq_len, block_size, _every(seq_len, max(1, seq_len // 4))),
}
