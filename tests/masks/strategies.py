"""Hypothesis strategies shared by the mask tests."""

from __future__ import annotations

import torch
from hypothesis import strategies as st

block_sizes = st.one_of(
    st.integers(1, 9),
    st.tuples(st.integers(1, 9), st.integers(1, 9)),
    st.just(128),
)


@st.composite
def padding(draw, seq_len: int, max_batch: int = 3):
    """None, or a ``[batch, seq_len]`` validity mask with left/right padding, empty rows and
    (sometimes) holes, which exercise the rule fallback."""
    kind = draw(st.sampled_from(["none", "runs", "holes"]))
    if kind == "none":
        return None
    batch = draw(st.integers(1, max_batch))
    rows = []
    for _ in range(batch):
        if kind == "holes":
            rows.append(draw(st.lists(st.integers(0, 1), min_size=seq_len, max_size=seq_len)))
            continue
        start = draw(st.integers(0, seq_len))
        end = draw(st.integers(start, seq_len))
        rows.append([1 if start <= i < end else 0 for i in range(seq_len)])
    return torch.tensor(rows, dtype=torch.bool if draw(st.booleans()) else torch.int64)
