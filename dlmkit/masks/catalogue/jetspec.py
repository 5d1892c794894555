"""JetSpec speculative-decoding masks: tree verification and multi-block draft training.

Tree verification, ``jetspec_tree(2, [-1, 0, 0, 1])`` (prefix ``P = 2`` cached keys, then the
flattened tree; node 0 is the root, nodes 1 and 2 its children, node 3 a child of 1)::

           prefix  tree
           p0 p1   n0 n1 n2 n3
    n0     #  #    #  .  .  .
    n1     #  #    #  #  .  .
    n2     #  #    #  .  #  .
    n3     #  #    #  #  .  #

Draft training, ``jetspec_training(2, 2, 2, anchors=[1, 2])`` (two sampled blocks of two
tokens; block ``j`` sees the prefix before its anchor, then itself causally)::

           prefix  block0 block1
    b0 t0  #  .    #  .   .  .
    b0 t1  #  .    #  #   .  .
    b1 t0  #  #    .  .   #  .
    b1 t1  #  #    .  .   #  #
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from ..checks import check_int, check_positive_int, int_rows
from ..core import Mask


def _check_parents(parent_indices) -> list[int]:
    if isinstance(parent_indices, torch.Tensor):
        if parent_indices.dim() != 1:
            raise ValueError(f"parent_indices must be 1-D, got shape "
                             f"{tuple(parent_indices.shape)}")
        if parent_indices.is_floating_point() or parent_indices.dtype == torch.bool:
            raise TypeError(f"parent_indices must hold integers, got dtype "
                            f"{parent_indices.dtype}")
        parent_indices = parent_indices.tolist()
    if not isinstance(parent_indices, Sequence) or isinstance(parent_indices, str):
        raise TypeError(f"parent_indices must be a sequence of ints, "
                        f"got {type(parent_indices).__name__}")
    parents = [check_int(f"parent_indices[{i}]", p) for i, p in enumerate(parent_indices)]
    if not parents:
        raise ValueError("parent_indices must list at least the root, got []")
    if parents[0] != -1:
        raise ValueError(f"parent_indices[0] must be -1 (node 0 is the root), got {parents[0]}")
    for i, p in enumerate(parents[1:], start=1):
        if p == -1 or p < -1:
            raise ValueError(
                f"parent_indices[{i}] = {p}: the tree must have a single root (node 0); "
                f"every other node needs a parent in [0, {i})")
        if p >= i:
            raise ValueError(
                f"parent_indices[{i}] = {p}: nodes must come after their parent "
                f"(parent-before-child order), so the parent must be in [0, {i})")
    return parents


def tree_ancestor_matrix(parent_indices, *, device="cpu") -> torch.Tensor:
    """bool ``[N, N]``: ``A[i, j]`` iff node ``j`` is on the root-to-``i`` path (``i``
    included). ``parent_indices[0] == -1`` (the single root); every other parent precedes
    its child. Row sums minus one are the depths."""
    parents = _check_parents(parent_indices)
    n = len(parents)
    ancestors = torch.eye(n, dtype=torch.bool)
    for i in range(1, n):
        ancestors[i] |= ancestors[parents[i]]
    return ancestors.to(device)


def _euler_tour(parents: list[int]) -> tuple[list[int], list[int], list[int]]:
    """Pre-order entry/exit times and depths: ``j`` is an ancestor of ``i`` (or ``i``) iff
    ``tin[j] <= tin[i] < tout[j]``."""
    n = len(parents)
    children: list[list[int]] = [[] for _ in range(n)]
    depth = [0] * n
    for i in range(1, n):
        children[parents[i]].append(i)
        depth[i] = depth[parents[i]] + 1
    tin, tout = [0] * n, [0] * n
    clock, stack = 0, [(0, False)]
    while stack:
        node, done = stack.pop()
        if done:
            tout[node] = clock
            continue
        tin[node] = clock
        clock += 1
        stack.append((node, True))
        stack.extend((child, False) for child in reversed(children[node]))
    return tin, tout, depth


def jetspec_tree(prefix_length: int, parent_indices, *, device="cpu") -> Mask:
    """Tree-causal verification mask ``[1, 1, N, P + N]``.

    Query ``q`` (tree node ``q``) attends to key ``kv`` iff ``kv < P`` (cached prefix) or
    ``kv - P`` is an ancestor of ``q`` or ``q`` itself.

    Args:
        prefix_length: ``P >= 0`` cached prefix keys.
        parent_indices: ``N`` parents in parent-before-child order; ``parent_indices[0]`` is
            ``-1`` (the root) and every other entry is in ``[0, node)``. A second root
            (another ``-1``) is rejected: forests are not trees.
        device: where the tree tables live (default CPU).

    The rule looks ancestry up in O(N) Euler-tour tables (no ``N x N`` matrix); the row
    intervals hold the prefix plus one slot per ancestor (``max depth + 2`` slots).
    """
    P = check_int("prefix_length", prefix_length, minimum=0)
    parents = _check_parents(parent_indices)
    n = len(parents)
    tin_list, tout_list, depth_list = _euler_tour(parents)
    tin = torch.tensor(tin_list, device=device)
    tout = torch.tensor(tout_list, device=device)
    device = tin.device
    kv_len, last = P + n, n - 1

    def rule(b, q, kv):
        node = (kv - P).clamp(0, last)
        entry = tin[q.clamp(0, last)]
        ancestor = (tin[node] <= entry) & (entry < tout[node])
        inside = q <= last
        # torch.where, not (kv < P) | (...): the OR form hits an Inductor CPU vectorisation
        # bug (VecMask<int> vs VecMask<float> in a ternary) under torch.compile(torch 2.13).
        return torch.where(kv < P, inside, ancestor & (kv < kv_len) & inside)

    def intervals():
        depth = max(depth_list) + 1
        parent = torch.tensor(parents, device=device).clamp(min=0)
        node = torch.arange(n, device=device)
        steps = [node]
        for _ in range(depth - 1):  # walk up; the root is its own parent after the clamp
            steps.append(parent[steps[-1]])
        chain = torch.stack(steps, 1)  # [n, depth]; repeats of the root merge when normalised
        lo = torch.cat([torch.zeros(n, 1, dtype=chain.dtype, device=device), chain + P], 1)
        hi = torch.cat([torch.full((n, 1), P, dtype=chain.dtype, device=device),
                        chain + P + 1], 1)
        return lo.unsqueeze(0), hi.unsqueeze(0)

    return Mask(rule, n, kv_len, 1, intervals=intervals,
                name=f"jetspec_tree_p{P}_n{n}", device=device)


def jetspec_training(prefix_length: int, block_size: int, num_blocks: int, anchors=None, *,
                     device=None) -> Mask:
    """Multi-block draft-head training mask ``[batch, 1, n * Bk, P + n * Bk]``.

    Queries are ``n`` sampled blocks of ``Bk`` tokens (``[anchor, future_1, ...]``); keys are
    the verified prefix (``P`` tokens) followed by the same blocks. Query ``q`` in block
    ``j = q // Bk`` attends to key ``kv`` iff

    * ``kv < visible_j`` (prefix; ``visible_j = P`` without anchors, ``anchors[j]`` with), or
    * ``kv - P`` is in block ``j`` and ``(kv - P) % Bk <= q % Bk`` (causal inside the block).

    Blocks never see each other.

    Args:
        prefix_length: ``P >= 0``.
        block_size: ``Bk > 0``.
        num_blocks: ``n > 0``.
        anchors: optional ints ``[n]`` or ``[batch, n]`` in ``[0, P]``: block ``j`` sees only
            prefix keys ``kv < anchors[j]`` (the prefix before its own anchor position).
            ``None`` = every block sees the whole prefix (attention-gym's behaviour).
    """
    P = check_int("prefix_length", prefix_length, minimum=0)
    Bk = check_positive_int("block_size", block_size)
    n = check_positive_int("num_blocks", num_blocks)
    q_len, kv_len = n * Bk, P + n * Bk
    if anchors is None:
        visible = torch.full((1, n), P, dtype=torch.int64)
    else:
        anchors = int_rows("anchors (one per block)", anchors, n)
        if bool((anchors < 0).any()) or bool((anchors > P).any()):
            raise ValueError(f"anchors must be in [0, prefix_length={P}], "
                             f"got {anchors.tolist()}")
        visible = anchors.to(torch.int64)
    if device is not None:
        visible = visible.to(device)
    device = visible.device
    batch, last_block = visible.shape[0], n - 1

    def rule(b, q, kv):
        j = (q // Bk).clamp(0, last_block)
        prefix = kv < visible[b, j]
        own = (kv >= P + j * Bk) & (kv <= P + q)
        return (prefix | own) & (q < q_len)

    def intervals():
        q = torch.arange(q_len, device=device)
        j = q // Bk
        prefix_hi = visible[:, j]  # [batch, q_len]
        lo = torch.stack([torch.zeros_like(prefix_hi), (P + j * Bk).expand_as(prefix_hi)], -1)
        hi = torch.stack([prefix_hi, (P + q + 1).expand_as(prefix_hi)], -1)
        return lo, hi

    name = f"jetspec_training_p{P}_block{Bk}_n{n}" + ("" if anchors is None else "_anchored")
    return Mask(rule, q_len, kv_len, batch, intervals=intervals, name=name, device=device)


def _example_tree(seq_len: int, block_size: int) -> Mask:
    # A complete binary tree of about seq_len / 2 nodes after a prefix of the same size.
    nodes = max(1, min(seq_len // 2, 4096))
    parents = [-1] + [(i - 1) // 2 for i in range(1, nodes)]
    return jetspec_tree(seq_len - nodes, parents)


def _example_training(seq_len: int, block_size: int) -> Mask:
    n = max(1, seq_len // (2 * block_size))
    prefix = max(0, seq_len - n * block_size)
    anchors = torch.linspace(0, prefix, n + 2)[1:-1].long() if n else None
    return jetspec_training(prefix, block_size, n, anchors)


EXAMPLES = {
    "jetspec_tree": _example_tree,
    "jetspec_training": lambda seq_len, block_size: jetspec_training(
        seq_len // 2, block_size, max(1, seq_len // (2 * block_size))),
    "jetspec_training_anchored": _example_training,
}
