"""Brute-force references for the dLLM and chunk-causal masks, written from the specifications
(nemo_dllm_spec.md §3.2-3.3, dllm_landscape.md §A.2), one (b, q, kv) triple at a time, in plain
Python on lists. They share no code with ``dlmkit.masks``."""

from __future__ import annotations

GLOBAL, NOISED, CLEAN = 0, 1, 2


def dflash_ref(anchors, keep, ctx_len, bs, causal=False, window=None, ctx_doc=None,
               anchor_doc=None):
    def allowed(b, q, k):
        j, o = divmod(q, bs)
        if k < ctx_len:
            a = anchors[b][j]
            if not keep[b][j] or k >= a:
                return False
            if window is not None and (a + o) - k >= window:
                return False
            if ctx_doc is not None and ctx_doc[b][k] != anchor_doc[b][j]:
                return False
            return True
        kj, ko = divmod(k - ctx_len, bs)
        return kj == j and (not causal or ko <= o)

    return allowed


def canvas_ref(prefix, response, enc_len, bs, window=None):
    def allowed(b, j, k):
        p, r = prefix[b], response[b]
        if j >= r:
            return k == enc_len + j
        qb = j // bs
        if k < enc_len:
            rel = k - p
            eb = rel // bs if rel >= 0 else -1
            keep = qb > eb and rel < r
            if window is not None:
                keep = keep and k >= p + qb * bs - window + 1
            return keep
        c = k - enc_len
        return c // bs == qb and c < r

    return allowed


def ranks(doc_row):
    """Index of every position inside its document (documents = equal ids)."""
    seen, out = {}, []
    for d in doc_row:
        out.append(seen.get(d, 0))
        seen[d] = out[-1] + 1
    return out


def packed_ref(L, S, docs, family):
    """block_diffusion / idlm over [x_t | x_0] with document ids, blocks counted per document."""
    rank = [ranks(row) for row in docs]

    def allowed(b, q, k):
        qn, kn = q < L, k < L
        lq, lk = q % L, k % L
        if docs[b][lq] != docs[b][lk]:
            return False
        bq, bk = rank[b][lq] // S, rank[b][lk] // S
        if qn and kn:
            return bq == bk and (family == "block_diffusion" or lk <= lq)
        if qn and not kn:
            return bk < bq
        if not qn and not kn:
            return bk <= bq if family == "block_diffusion" else lk <= lq
        return False

    return allowed


def chunk_causal_ref(kind, chunk):
    def allowed(b, q, k):
        kq, kk = kind[q], kind[k]
        if kk == GLOBAL:
            return True
        if kq == GLOBAL:
            return False
        if kq == CLEAN:
            return kk == CLEAN and chunk[k] <= chunk[q]
        if kk == NOISED:
            return chunk[k] == chunk[q]
        return chunk[k] < chunk[q]  # noised query, clean key

    return allowed


def expert_cross_ref(q_kind, q_chunk, kind, chunk, frame, window=None, sink=None):
    def first(c):
        return min(frame[i] for i in range(len(kind)) if kind[i] != GLOBAL and chunk[i] == c)

    def base(q, k):
        if kind[k] == GLOBAL:
            return True
        if q_kind[q] == GLOBAL:
            return False
        if kind[k] == NOISED:
            return chunk[k] == q_chunk[q]
        ff = first(q_chunk[q])
        return frame[k] < ff and (window is None or frame[k] >= ff - window)

    def allowed(b, q, k):
        if base(q, k):
            return True
        if any(base(q, j) for j in range(len(kind))):
            return False
        return k == sink  # a row with nothing visible attends only the declared sink

    return allowed


def expert_self_ref(chunk):
    return lambda b, q, k: chunk[q] == chunk[k]
