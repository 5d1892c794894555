"""A stand-in denoiser whose predictions are the exact conditionals of a known joint
distribution over a tiny vocabulary and length: the estimators' expectations can then be
enumerated and compared with closed forms."""

from __future__ import annotations

from itertools import product
from types import SimpleNamespace

import torch

V = 3          # real tokens 0..V-1
MASK = V       # vocab_size = V + 1


def random_joint(length: int, seed: int = 0) -> torch.Tensor:
    """A joint distribution over ``V^length`` with strongly correlated tokens (float64)."""
    g = torch.Generator().manual_seed(seed)
    table = torch.rand([V] * length, generator=g, dtype=torch.float64) ** 4 + 1e-3
    return table / table.sum()


def conditional(joint: torch.Tensor, position: int, observed: dict[int, int]) -> torch.Tensor:
    """``p(x_position = . | x_j = observed[j])`` as a ``[V]`` float64 tensor."""
    index = tuple(observed.get(j, slice(None)) for j in range(joint.dim()))
    sub = joint[index]
    free = [j for j in range(joint.dim()) if j not in observed]
    keep = free.index(position)
    marginal = sub.sum(dim=[d for d in range(sub.dim()) if d != keep]) if sub.dim() > 1 else sub
    return marginal / marginal.sum()


def log_prob(joint: torch.Tensor, seq: list[int], prompt_len: int) -> float:
    """``log p(seq[prompt_len:] | seq[:prompt_len])``."""
    prompt = {j: seq[j] for j in range(prompt_len)}
    total = 0.0
    for i in range(prompt_len, len(seq)):
        total += float(torch.log(conditional(joint, i, prompt)[seq[i]]))
        prompt[i] = seq[i]
    return total


class JointModel(torch.nn.Module):
    """``model(input_ids=...) -> .logits [B, T, V + 1]``: at each masked position the log of
    the joint's conditional given what the layout lets it see (``masked``: every unmasked
    token; ``block``: over ``[x_t | x_0]``, the clean earlier blocks and the unmasked tokens of
    its own block; ``causal``: position ``j`` predicts ``j + 1`` from ``x_{<=j}``), written at
    the row before with ``shift`` (``logit_shift``). ``scale``
    multiplies the logits (a parameter to take gradients in)."""

    def __init__(self, joint: torch.Tensor, layout: str, block_size: int | None = None,
                 shift: bool = False):
        super().__init__()
        self.joint, self.layout, self.block_size, self.shift = joint, layout, block_size, shift
        self.scale = torch.nn.Parameter(torch.ones((), dtype=torch.float64))
        self.config = SimpleNamespace(_attn_implementation="sdpa")
        self.rows = 0

    def forward(self, input_ids, attention_mask=None, position_ids=None, use_cache=False):
        B, T = input_ids.shape
        out = torch.zeros(B, T, V + 1, dtype=torch.float64)
        out[..., MASK] = -1e4
        L = self.joint.dim()
        for b in range(B):
            ids = input_ids[b].tolist()
            self.rows += 1
            for i in range(T if self.layout != "block" else L):
                if self.layout == "causal":
                    if i + 1 < T:
                        seen = {j: ids[j] for j in range(i + 1)}
                        out[b, i, :V] = torch.log(conditional(self.joint, i + 1, seen))
                    continue
                if ids[i] != MASK:
                    continue
                if self.layout == "masked":
                    seen = {j: t for j, t in enumerate(ids) if t != MASK}
                else:
                    blk = i // self.block_size
                    seen = {j: ids[L + j] for j in range(L)
                            if j // self.block_size < blk and ids[L + j] != MASK}
                    seen.update({j: ids[j] for j in range(L)
                                 if j // self.block_size == blk and ids[j] != MASK})
                row = i
                if self.shift:  # logit_shift: read from the row before (a block's first
                    # token: the clean stream's row before it)
                    row = L + i - 1 if self.layout == "block" and i % self.block_size == 0 \
                        else i - 1
                out[b, row, :V] = torch.log(conditional(self.joint, i, seen))
        return SimpleNamespace(logits=(out * self.scale).float())


def subsets(n: int):
    """Every non-empty subset of ``range(n)`` as a bool list."""
    for bits in product([False, True], repeat=n):
        if any(bits):
            yield list(bits)
