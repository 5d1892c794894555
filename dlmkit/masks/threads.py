"""Index arithmetic on one intra-op thread.

Building a tile map or a ``BlockMask`` is a chain of ~100 small integer tensor ops (row
intervals, tile counts, cumulative sums, orderings). With more than one intra-op thread each op
is a parallel region whose pieces must all finish before the next op starts; when another
process holds one of the cores, every op waits for the thread stuck behind it. Measured on a
2-core machine with one busy process, ``idlm(16384, 4).block_mask(128)``: 136 ms median with two
threads against 11 ms with one, and splitting fewer, larger ops does not help (a single
3.3M-element op was 3x slower on two threads than on one under the same load). One thread keeps
the build within a small factor of its idle cost whatever else runs; on CUDA tensors the count
is irrelevant (it only governs CPU kernels), so the scope is harmless there.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import torch


@contextmanager
def single_threaded() -> Iterator[None]:
    """Run the enclosed CPU ops on one intra-op thread; the previous count is restored after
    (also on error). Nested scopes are free."""
    before = torch.get_num_threads()
    if before == 1:
        yield
        return
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(before)
