"""Chunk-causal video/action masks over tagged token streams (see
:mod:`dlmkit.masks.catalogue.tags`).

``chunk_causal(tags)`` — self-attention over one stream of global, clean and noised tokens.
Query ``q`` may attend key ``k`` iff

* ``k`` is GLOBAL (every token sees every global token; a GLOBAL query sees *only* globals);
* both CLEAN and ``chunk[k] <= chunk[q]`` (clean: own and earlier chunks, bidirectional inside
  its chunk);
* both NOISED and ``chunk[k] == chunk[q]`` (noised: its own chunk only);
* ``q`` NOISED, ``k`` CLEAN and ``chunk[k] < chunk[q]`` (**strictly** earlier clean chunks: a
  noised token never sees the clean copy of its own chunk);
* never CLEAN -> NOISED. ``frame`` plays no role here.

``expert_cross(q_tags, kv_tags, window)`` — an expert stream (action/proprio tokens, tagged with
their chunk) cross-attending the main stream. Expert query ``q`` of chunk ``c`` sees

* every GLOBAL key;
* CLEAN keys with ``first_frame(c) - window <= frame[k] < first_frame(c)``: the window is
  **measured from the first frame of the query's chunk** (``first_frame(c)`` = the smallest
  frame of chunk ``c`` among the main stream's video tokens) and the lower bound is
  **inclusive**, so exactly ``window`` latent frames before the chunk are visible;
  ``window=None`` means unlimited, ``window=0`` no clean frames;
* NOISED keys of its own chunk (never noised frames of other chunks).

A GLOBAL expert query sees only global keys. A row can have nothing visible only when the main
stream has no GLOBAL token (no clean frame in the window, no noised frame of its chunk, or a
GLOBAL query). Softmax needs at least one key, and any key the rules forbid would pass its
value through with weight 1 (the old fallback, "the first main-stream key of the chunk", was
often the clean copy of the query's own chunk). So such a row attends only ``sink``: the index
of a main-stream key the caller guarantees carries no information (a learned null / register
token, say). Without a ``sink`` such a layout is a ValueError naming the row — the caller
adds a GLOBAL token (visible to every query, so no row is empty) or passes ``sink``. An empty
row whose output is zero is not an option: the eager backend's additive mask would turn it
into uniform attention over every key, SDPA's bool mask into NaN. Every query chunk must occur
among the main stream's video tokens.

``expert_self(q_tags)`` — expert tokens attend expert tokens of the same chunk (block-diagonal).

Row intervals are derived exactly from the runs of constant ``(kind, chunk, frame)``: the rule
is evaluated once per (query run, key run) pair and adjacent allowed key runs are merged, so a
row holds as many intervals as its allowed set has pieces (3 for the usual
``[globals | clean chunks | noised chunks]`` layout) and ``.block_mask()`` stays O(tiles).

Masks are cached in an LRU :class:`~dlmkit.masks.cache.MaskCache` keyed by the layout (the exact
run-length encoding of the tags, which covers slots, chunk size and lengths, plus rule name,
window and device); each cached mask memoises its ``BlockMask`` per block size. Pass
``cache=None`` to build afresh. Padded layouts (``valid``) follow :mod:`dlmkit.masks.padding`
and are not cached.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from ..cache import MaskCache
from ..checks import check_int
from ..core import Mask
from ..padding import self_attention_mask
from .tags import KIND_CLEAN, KIND_GLOBAL, KIND_NOISED, Slot, TokenTags, window_tags

CACHE = MaskCache(max_entries=64)


def _check_tags(name: str, tags) -> TokenTags:
    if not isinstance(tags, TokenTags):
        raise TypeError(f"{name} must be a TokenTags (see window_tags), got {type(tags).__name__}")
    return tags


def _check_window(window) -> int | None:
    return None if window is None else check_int("window", window, minimum=0)


def _run_intervals(rule: Callable, q_tags: TokenTags, kv_tags: TokenTags):
    """Exact row intervals ``[1, q_len, K]`` of a rule that depends on the tags only."""
    device = q_tags.device
    q_start, q_end = q_tags.runs()
    k_start, k_end = kv_tags.runs()
    zero = torch.zeros(1, 1, dtype=torch.long, device=device)
    allowed = rule(zero, q_start.view(-1, 1), k_start.view(1, -1))
    allowed = allowed.expand(q_start.numel(), k_start.numel())
    blank = torch.zeros_like(allowed[:, :1])
    opens = allowed & ~torch.cat([blank, allowed[:, :-1]], 1)
    closes = allowed & ~torch.cat([allowed[:, 1:], blank], 1)
    k = max(1, int(opens.sum(1).max()))
    lo = torch.full((q_start.numel(), k), kv_tags.length, dtype=torch.long, device=device)
    hi = lo.clone()
    for marks, bounds, out in ((opens, k_start, lo), (closes, k_end, hi)):
        rows, cols = marks.nonzero(as_tuple=True)
        out[rows, (marks.cumsum(1) - 1)[rows, cols]] = bounds[cols]
    run_of_row = torch.repeat_interleave(torch.arange(q_start.numel(), device=device),
                                         q_end - q_start)
    return lo[run_of_row].unsqueeze(0), hi[run_of_row].unsqueeze(0)


def _build(cache: MaskCache | None, key: tuple, build: Callable[[], Mask]) -> Mask:
    return build() if cache is None else cache.get(key, build)


def _self_mask(kind: str, rule: Callable, tags: TokenTags, valid, cache: MaskCache | None
               ) -> Mask:
    """A self-attention mask over one tagged stream: padded masks are built fresh (their key
    would be the padding itself), unpadded ones are cached by layout."""
    L = tags.length
    name = f"{kind}_{L}"

    def intervals():
        return _run_intervals(rule, tags, tags)

    if valid is not None:
        return self_attention_mask(name, rule, intervals, L, 1, valid, tags.device)
    return _build(cache, (kind, tags.key()), lambda: Mask(
        rule, L, L, 1, intervals=intervals, name=name, device=tags.device))


def chunk_causal(tags: TokenTags, valid=None, *, cache: MaskCache | None = CACHE) -> Mask:
    """Chunk-causal self-attention mask ``[batch, 1, L, L]`` over one tagged stream.

    Args:
        tags: the layout (``window_tags(...)`` or a ``TokenTags``).
        valid: optional ``[batch, L]`` padding mask (1 = real token).
        cache: LRU cache keyed by the layout, or None.
    """
    tags = _check_tags("tags", tags)
    kind, chunk, L = tags.kind, tags.chunk, tags.length

    def rule(b, q, kv):
        qi, ki = q.clamp(0, L - 1), kv.clamp(0, L - 1)
        kq, kk, cq, ck = kind[qi], kind[ki], chunk[qi], chunk[ki]
        sees_global = kk == KIND_GLOBAL
        clean = (kq == KIND_CLEAN) & (kk == KIND_CLEAN) & (ck <= cq)
        noised = (kq == KIND_NOISED) & (kk == KIND_NOISED) & (ck == cq)
        noised_sees_clean = (kq == KIND_NOISED) & (kk == KIND_CLEAN) & (ck < cq)
        return (q < L) & (kv < L) & (sees_global | clean | noised | noised_sees_clean)

    return _self_mask("chunk_causal", rule, tags, valid, cache)


def _first_by_chunk(chunk: torch.Tensor, values: torch.Tensor, size: int) -> torch.Tensor:
    """Smallest ``values`` per chunk id ``0 .. size-1`` (``-1`` where the chunk is absent)."""
    big = torch.iinfo(torch.int64).max
    out = torch.full((size,), big, dtype=torch.int64, device=chunk.device)
    out.scatter_reduce_(0, chunk.long(), values.long(), "amin")
    return torch.where(out == big, -1, out)


def expert_cross(q_tags: TokenTags, kv_tags: TokenTags, window: int | None = None, *,
                 sink: int | None = None, cache: MaskCache | None = CACHE) -> Mask:
    """Expert -> main-stream cross-attention mask ``[1, 1, len(q_tags), len(kv_tags)]``.

    Args:
        q_tags: expert tokens (their ``chunk`` matters; GLOBAL ones see only globals).
        kv_tags: the main stream (globals, clean and noised video tokens).
        window: clean latent frames visible before the query chunk's first frame (inclusive
            lower bound ``first_frame - window``), None = unlimited, must be >= 0.
        sink: index into ``kv_tags`` of a key that carries no information, attended (alone)
            by rows with nothing visible; None: such rows are an error (see the module).
        cache: LRU cache keyed by the layout, or None.
    """
    q_tags = _check_tags("q_tags", q_tags)
    kv_tags = _check_tags("kv_tags", kv_tags).to(q_tags.device)
    window = _check_window(window)
    if sink is not None:
        sink = check_int("sink", sink, minimum=0)
        if sink >= kv_tags.length:
            raise ValueError(f"sink must index a key of kv_tags [0, {kv_tags.length}), "
                             f"got {sink}")
    key = ("expert_cross", q_tags.key(), kv_tags.key(), window, sink)
    return _build(cache, key, lambda: _expert_cross(q_tags, kv_tags, window, sink))


def _expert_cross(q_tags: TokenTags, kv_tags: TokenTags, window: int | None,
                  sink: int | None) -> Mask:
    Lq, Lk, device = q_tags.length, kv_tags.length, q_tags.device
    q_kind, q_chunk = q_tags.kind, q_tags.chunk
    k_kind, k_chunk, k_frame = kv_tags.kind, kv_tags.chunk, kv_tags.frame
    video = k_kind != KIND_GLOBAL
    q_video = q_kind != KIND_GLOBAL
    size = 1 + max(int(k_chunk.max()), int(q_chunk.max()), 0)
    first_frame = _first_by_chunk(k_chunk[video], k_frame[video], size)
    missing = q_video & (first_frame[q_chunk.clamp(min=0).long()] < 0)
    if bool(missing.any()):
        at = int(missing.nonzero()[0])
        present = sorted(set(k_chunk[video].tolist()))
        raise ValueError(f"expert_cross: q_tags chunk {int(q_chunk[at])} (position {at}) has "
                         f"no video tokens in kv_tags; kv_tags chunks are {present}")
    q_first = torch.where(q_video, first_frame[q_chunk.clamp(min=0).long()], 0)

    def base(b, q, kv):
        qi, ki = q.clamp(0, Lq - 1), kv.clamp(0, Lk - 1)
        kk, ck, fk = k_kind[ki], k_chunk[ki], k_frame[ki]
        expert = q_kind[qi] != KIND_GLOBAL
        ff = q_first[qi]
        clean = expert & (kk == KIND_CLEAN) & (fk < ff)
        if window is not None:
            clean = clean & (fk >= ff - window)
        noised = expert & (kk == KIND_NOISED) & (ck == q_chunk[qi])
        return (q < Lq) & (kv < Lk) & ((kk == KIND_GLOBAL) | clean | noised)

    lo, hi = _run_intervals(base, q_tags, kv_tags)
    empty = (hi <= lo).all(-1)[0]  # rows with nothing visible
    name = f"expert_cross_{Lq}x{Lk}_w{window}"
    if not bool(empty.any()):
        return Mask(base, Lq, Lk, 1, intervals=lambda: (lo, hi), name=name, device=device)
    if sink is None:
        at = int(empty.nonzero()[0])
        kind = {KIND_GLOBAL: "GLOBAL", KIND_CLEAN: "CLEAN", KIND_NOISED: "NOISED"}
        raise ValueError(
            f"expert_cross: query {at} ({kind.get(int(q_kind[at]), int(q_kind[at]))}, chunk "
            f"{int(q_chunk[at])}) may see no key of kv_tags (no GLOBAL token, no clean frame in "
            f"the window, no noised frame of its chunk); add a GLOBAL token to kv_tags, or pass "
            f"sink= the index of a key that carries no information (e.g. a null token)")
    fallback = torch.where(empty, sink, -1)
    lo = torch.cat([lo, torch.where(empty, sink, Lk).view(1, Lq, 1)], -1)
    hi = torch.cat([hi, torch.where(empty, sink + 1, Lk).view(1, Lq, 1)], -1)

    def rule(b, q, kv):
        return base(b, q, kv) | ((q < Lq) & (kv == fallback[q.clamp(0, Lq - 1)]))

    name += f"_sink{sink}"
    return Mask(rule, Lq, Lk, 1, intervals=lambda: (lo, hi), name=name, device=device)


def expert_self(q_tags: TokenTags, valid=None, *, cache: MaskCache | None = CACHE) -> Mask:
    """Expert self-attention ``[batch, 1, L, L]``: same chunk only, bidirectional."""
    q_tags = _check_tags("q_tags", q_tags)
    chunk, L = q_tags.chunk, q_tags.length

    def rule(b, q, kv):
        qi, ki = q.clamp(0, L - 1), kv.clamp(0, L - 1)
        return (q < L) & (kv < L) & (chunk[qi] == chunk[ki])

    return _self_mask("expert_self", rule, q_tags, valid, cache)


def _example_slots(seq_len: int, block_size: int):
    """Globals, then clean and noised copies of 4 frames; ``block_size`` tokens per frame."""
    frames, per_frame = 4, max(1, min(block_size, seq_len // 10))
    glob = max(1, seq_len - 2 * frames * per_frame)
    return [Slot(KIND_GLOBAL, 1, glob), Slot(KIND_CLEAN, frames, per_frame),
            Slot(KIND_NOISED, frames, per_frame)]


def _example_expert(seq_len: int, block_size: int) -> TokenTags:
    return window_tags([Slot(KIND_NOISED, 4, 2)], chunk_size=2)


EXAMPLES = {
    "chunk_causal": lambda seq_len, block_size: chunk_causal(
        window_tags(_example_slots(seq_len, block_size), chunk_size=2), cache=None),
    "expert_cross": lambda seq_len, block_size: expert_cross(
        _example_expert(seq_len, block_size),
        window_tags(_example_slots(seq_len, block_size), chunk_size=2), window=1, cache=None),
    "expert_self": lambda seq_len, block_size: expert_self(
        _example_expert(seq_len, block_size), cache=None),
}
