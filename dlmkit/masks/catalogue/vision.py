"""Flamingo-style vision cross-attention: text queries attend to the images covering them.

    flamingo(6, [[1, 4], [3, 6]], image_tokens=2)
               img0  img1
    q0 (text)  . .   . .      <- covered by no image: an empty row (see below)
    q1         # #   . .
    q2         # #   . .
    q3         # #   # #
    q4         . .   # #
    q5         . .   # #

Keys are ``n_images * image_tokens`` image tokens, image ``i`` owning keys
``[i * T, (i + 1) * T)``. Text query ``q`` attends to every token of image ``i`` iff
``start_i <= q < end_i`` (``image_intervals[i] = (start_i, end_i)``, half-open).

**Rows covered by no image** (text before the first image, gaps) attend to nothing; this is
the pattern's meaning, not a bug, so it is kept and defined:

* ``flex_attention`` with ``.block_mask()`` returns 0 for such rows (LSE ``-inf``);
* SDPA with the boolean ``.dense()`` mask returns 0 as well (torch >= 2.5 CPU/CUDA);
* the additive form ``.additive()`` stays finite: softmax of an all-blocked row is the uniform
  average of the values, never NaN. Multiply the attention output by
  :func:`flamingo_covered_rows` (Flamingo's convention: no image, no cross-attention update)
  to get the same zeros as the other backends.
"""

from __future__ import annotations

import torch

from ..checks import check_positive_int
from ..core import Mask


def _check_image_intervals(image_intervals, q_len: int) -> torch.Tensor:
    """``[batch or 1, n_images, 2]`` int64."""
    if isinstance(image_intervals, (list, tuple)):
        try:
            image_intervals = torch.tensor(image_intervals, dtype=torch.int64)
        except (TypeError, ValueError):
            raise TypeError(f"image_intervals must be ints [n_images, 2], "
                            f"got {image_intervals!r}") from None
    if not isinstance(image_intervals, torch.Tensor):
        raise TypeError(f"image_intervals must be an int tensor [n_images, 2] or "
                        f"[batch, n_images, 2], got {type(image_intervals).__name__}")
    if image_intervals.is_floating_point() or image_intervals.dtype == torch.bool:
        raise TypeError(f"image_intervals must hold integers, got dtype {image_intervals.dtype}")
    if image_intervals.dim() == 2:
        image_intervals = image_intervals.unsqueeze(0)
    if (image_intervals.dim() != 3 or image_intervals.shape[-1] != 2
            or image_intervals.shape[1] < 1 or image_intervals.shape[0] < 1):
        raise ValueError(f"image_intervals must have shape [n_images >= 1, 2] or "
                         f"[batch, n_images, 2], got {tuple(image_intervals.shape)}")
    image_intervals = image_intervals.to(torch.int64)
    start, end = image_intervals[..., 0], image_intervals[..., 1]
    if bool((start < 0).any()) or bool((end > q_len).any()) or bool((end < start).any()):
        raise ValueError(f"image_intervals must satisfy 0 <= start <= end <= q_len={q_len}, "
                         f"got {image_intervals.tolist()}")
    return image_intervals


def flamingo(q_len: int, image_intervals, image_tokens: int, *, device=None) -> Mask:
    """Vision cross-attention mask ``[batch, 1, q_len, n_images * image_tokens]``.

    attend iff ``start[img(kv)] <= q < end[img(kv)]`` with ``img(kv) = kv // image_tokens``.

    Args:
        q_len: number of text queries (> 0).
        image_intervals: ``[n_images, 2]`` (or ``[batch, n_images, 2]``, one layout per row)
            half-open text ranges ``(start, end)`` each image is visible to, with
            ``0 <= start <= end <= q_len``. Ranges may overlap or leave gaps.
        image_tokens: ``T``, tokens per image (> 0).

    Rows covered by no image are fully blocked; see the module docstring for what every
    backend returns there (0 from flex and boolean SDPA, finite from the additive form).
    """
    q_len = check_positive_int("q_len", q_len)
    T = check_positive_int("image_tokens", image_tokens)
    spans = _check_image_intervals(image_intervals, q_len)
    device = spans.device if device is None else torch.device(device)
    spans = spans.to(device)
    batch, n_images = spans.shape[0], spans.shape[1]
    kv_len = n_images * T
    start, end = spans[..., 0].contiguous(), spans[..., 1].contiguous()
    last_image = n_images - 1

    def rule(b, q, kv):
        image = (kv // T).clamp(0, last_image)
        return (q >= start[b, image]) & (q < end[b, image]) & (kv < kv_len)

    def intervals():
        q = torch.arange(q_len, device=device).view(1, q_len, 1)
        covered = (q >= start.unsqueeze(1)) & (q < end.unsqueeze(1))  # [batch, q_len, n_img]
        first = (torch.arange(n_images, device=device) * T).view(1, 1, n_images)
        lo = torch.where(covered, first, kv_len)
        hi = torch.where(covered, first + T, kv_len)
        return lo, hi

    return Mask(rule, q_len, kv_len, batch, intervals=intervals,
                name=f"flamingo_{n_images}x{T}", device=device)


def flamingo_covered_rows(q_len: int, image_intervals) -> torch.Tensor:
    """bool ``[batch or 1, q_len]``: True where a text query sees at least one image.

    Multiply the cross-attention output by ``covered[..., None]`` (broadcast over heads) to
    turn the additive form's uniform average on uncovered rows into the 0 that flex and
    boolean SDPA produce.
    """
    q_len = check_positive_int("q_len", q_len)
    spans = _check_image_intervals(image_intervals, q_len)
    q = torch.arange(q_len, device=spans.device).view(1, q_len, 1)
    covered = (q >= spans[..., 0].unsqueeze(1)) & (q < spans[..., 1].unsqueeze(1))
    return covered.any(-1)


def _example(seq_len: int, block_size: int) -> Mask:
    # Four images, each visible from where it appears to the next one; text before the
    # first image sees none (documented empty rows).
    n = 4
    cut = [max(1, seq_len * i // (n + 1)) for i in range(1, n + 1)] + [seq_len]
    spans = [[cut[i], cut[i + 1]] for i in range(n)]
    return flamingo(seq_len, spans, block_size)


EXAMPLES = {"flamingo": _example}
