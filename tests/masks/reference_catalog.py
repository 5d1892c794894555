"""Brute-force references for the attention-gym catalogue masks, written from the spec
(``shared/reference/attn_gym_spec.md`` §1-§3) one ``(b, q, k)`` triple at a time.

Deliberately naive Python over plain lists: no code shared with ``dlmkit.masks``.
"""

from __future__ import annotations


def causal_ref(q_len, kv_len, offset=0, align="top_left"):
    shift = offset + (kv_len - q_len if align == "bottom_right" else 0)
    return lambda b, q, k: k <= q + shift


def sliding_window_ref(q_len, kv_len, window, align="top_left"):
    shift = kv_len - q_len if align == "bottom_right" else 0

    def allowed(b, q, k):
        qq = q + shift
        return k <= qq and qq - k <= window

    return allowed


def dilated_sliding_window_ref(window, dilation):
    return lambda b, q, k: abs(q - k) <= window and abs(q - k) % dilation == 0


def global_sliding_window_ref(window, is_global_rows):
    """``is_global_rows``: list of lists [batch][seq] of 0/1 (one row broadcasts)."""
    def allowed(b, q, k):
        g = is_global_rows[b if len(is_global_rows) > 1 else 0]
        return abs(q - k) <= window or bool(g[q]) or bool(g[k])

    return allowed


def prefix_lm_ref(prefix_lengths):
    """``prefix_lengths``: list [batch] (one entry broadcasts)."""
    def allowed(b, q, k):
        P = prefix_lengths[b if len(prefix_lengths) > 1 else 0]
        return k < P or q >= k

    return allowed


def _doc_of(offsets, i):
    """Document whose half-open range ``[off[d], off[d+1])`` contains ``i``."""
    for d in range(len(offsets) - 1):
        if offsets[d] <= i < offsets[d + 1]:
            return d
    raise IndexError(i)


def _pick(rows, b):
    return rows[b if len(rows) > 1 else 0]


def document_offsets_ref(inner, q_offsets_rows, kv_offsets_rows=None):
    """``inner(b, q_local, k_local) -> bool``; offsets as lists of rows."""
    def allowed(b, q, k):
        qo = _pick(q_offsets_rows, b)
        ko = _pick(kv_offsets_rows or q_offsets_rows, b)
        dq, dk = _doc_of(qo, q), _doc_of(ko, k)
        return dq == dk and inner(b, q - qo[dq], k - ko[dk])

    return allowed


def document_ids_ref(inner, q_ids_rows, kv_ids_rows=None):
    """Documents by id; local index = number of earlier positions with the same id."""
    def allowed(b, q, k):
        qi = _pick(q_ids_rows, b)
        ki = _pick(kv_ids_rows or q_ids_rows, b)
        if qi[q] != ki[k]:
            return False
        lq = sum(1 for i in range(q) if qi[i] == qi[q])
        lk = sum(1 for i in range(k) if ki[i] == ki[k])
        return inner(b, lq, lk)

    return allowed


def packed_causal_document_ref(offsets_rows):
    def allowed(b, q, k):
        off = _pick(offsets_rows, b)
        return off[_doc_of(off, q)] <= k <= q

    return allowed


def shared_prefix_ref(offsets_rows, prefix_rows):
    def allowed(b, q, k):
        off, pid = _pick(offsets_rows, b), _pick(prefix_rows, b)
        d = _doc_of(off, q)
        p = pid[d]
        return off[d] <= k <= q or (d != p and off[p] <= k < off[p + 1])

    return allowed


def batchify_ref(inner, nq, nkv):
    return lambda b, q, k: q // nq == k // nkv and inner(b, q % nq, k % nkv)


def flamingo_ref(intervals_rows, image_tokens):
    def allowed(b, q, k):
        spans = _pick(intervals_rows, b)
        start, end = spans[k // image_tokens]
        return start <= q < end

    return allowed


def ancestor_sets(parents):
    """Node -> set of nodes on its root path (itself included), by walking parents."""
    out = []
    for i in range(len(parents)):
        path, node = set(), i
        while node != -1:
            path.add(node)
            node = parents[node] if node > 0 else -1
        out.append(path)
    return out


def jetspec_tree_ref(prefix_length, parents):
    sets = ancestor_sets(parents)
    n = len(parents)

    def allowed(b, q, k):
        return k < prefix_length or (prefix_length <= k < prefix_length + n
                                     and (k - prefix_length) in sets[q])

    return allowed


def jetspec_training_ref(prefix_length, block_size, anchors_rows=None):
    P, Bk = prefix_length, block_size

    def allowed(b, q, k):
        visible = P if anchors_rows is None else _pick(anchors_rows, b)[q // Bk]
        if k < P:
            return k < visible
        return q // Bk == (k - P) // Bk and (k - P) % Bk <= q % Bk

    return allowed
