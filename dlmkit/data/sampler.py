"""Which global samples each rank reads at each step, independent of the number of ranks.

The training stream is the concatenation of per-epoch permutations of ``0..N-1`` (epoch ``e``
shuffled by a generator seeded from ``(seed, e)``). Optimizer step ``s`` consumes stream
positions ``[s*G, (s+1)*G)`` (``G`` = global batch size), so batches may straddle epochs and no
sample is dropped. Rank ``r`` of ``W`` takes the contiguous slice ``[r*G/W, (r+1)*G/W)`` of that
global batch and splits it into micro-batches in order. Hence the union over ranks of a step
is the same global batch for every world size and accumulation split, and resuming at step
``s`` is just starting the iteration at ``s``.
"""

from __future__ import annotations

from collections.abc import Iterator

import torch

__all__ = ["GlobalBatchSampler", "eval_batches"]

_EPOCH_SEED_STRIDE = 1_000_003  # keeps (seed, epoch) pairs from colliding for small values


def _int(name: str, value, minimum: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise ValueError(f"{name} must be an int >= {minimum}, got {value!r}")
    return value


class GlobalBatchSampler:
    """Deterministic, resumable data order for data-parallel training.

    Args:
        num_samples: dataset size ``N``.
        global_batch_size: samples per optimizer step over all ranks, ``G``; divisible by
            ``world_size`` and the local share by ``micro_batch_size``.
        rank, world_size: this process's data-parallel coordinates.
        micro_batch_size: rows per forward (default: the whole local share, ``G / world_size``).
        seed: shuffling seed; ``shuffle=False`` reads ``0..N-1`` in order every epoch.
        start_step: first optimizer step to yield (resume).
        num_steps: stop before this step (None: iterate forever).

    Iterating yields lists of global sample indices, one per micro-batch, step after step
    (``accumulation_steps`` micro-batches per step); usable as a ``DataLoader``'s
    ``batch_sampler``.
    """

    def __init__(
        self,
        num_samples: int,
        global_batch_size: int,
        *,
        rank: int = 0,
        world_size: int = 1,
        micro_batch_size: int | None = None,
        seed: int = 0,
        shuffle: bool = True,
        start_step: int = 0,
        num_steps: int | None = None,
    ) -> None:
        self.num_samples = _int("num_samples", num_samples, 1)
        self.global_batch_size = _int("global_batch_size", global_batch_size, 1)
        self.world_size = _int("world_size", world_size, 1)
        self.rank = _int("rank", rank, 0)
        if self.rank >= self.world_size:
            raise ValueError(f"rank must be in [0, world_size={world_size}), got {rank}")
        if global_batch_size % world_size:
            raise ValueError(
                f"global_batch_size ({global_batch_size}) must be divisible by world_size "
                f"({world_size})"
            )
        self.local_batch_size = global_batch_size // world_size
        self.micro_batch_size = _int(
            "micro_batch_size",
            self.local_batch_size if micro_batch_size is None else micro_batch_size,
            1,
        )
        if self.local_batch_size % self.micro_batch_size:
            raise ValueError(
                f"micro_batch_size ({self.micro_batch_size}) must divide the per-rank batch "
                f"global_batch_size / world_size = {self.local_batch_size}"
            )
        self.accumulation_steps = self.local_batch_size // self.micro_batch_size
        self.seed = _int("seed", seed, 0)
        self.shuffle = bool(shuffle)
        self.start_step = _int("start_step", start_step, 0)
        self.num_steps = None if num_steps is None else _int("num_steps", num_steps, 0)
        self._perm_cache: dict[int, torch.Tensor] = {}

    def epoch_of(self, step: int) -> float:
        """Epochs completed at the start of ``step`` (fractional)."""
        return step * self.global_batch_size / self.num_samples

    def _permutation(self, epoch: int) -> torch.Tensor:
        if epoch not in self._perm_cache:
            if len(self._perm_cache) >= 2:
                self._perm_cache.pop(min(self._perm_cache))
            if self.shuffle:
                g = torch.Generator().manual_seed(self.seed * _EPOCH_SEED_STRIDE + epoch)
                self._perm_cache[epoch] = torch.randperm(self.num_samples, generator=g)
            else:
                self._perm_cache[epoch] = torch.arange(self.num_samples)
        return self._perm_cache[epoch]

    def _stream(self, start: int, stop: int) -> list[int]:
        out: list[int] = []
        pos = start
        while pos < stop:
            epoch, offset = divmod(pos, self.num_samples)
            take = min(stop - pos, self.num_samples - offset)
            out.extend(self._permutation(epoch)[offset : offset + take].tolist())
            pos += take
        return out

    def global_batch(self, step: int) -> list[int]:
        """All ``G`` global sample indices of optimizer step ``step``, in rank order."""
        step = _int("step", step, 0)
        return self._stream(step * self.global_batch_size, (step + 1) * self.global_batch_size)

    def local_batch(self, step: int) -> list[int]:
        """This rank's ``G / world_size`` indices of step ``step``."""
        step = _int("step", step, 0)
        start = step * self.global_batch_size + self.rank * self.local_batch_size
        return self._stream(start, start + self.local_batch_size)

    def micro_batches(self, step: int) -> list[list[int]]:
        """This rank's indices of step ``step``, split into ``accumulation_steps`` lists."""
        return self._split(self.local_batch(step))

    def micro_batch_repeats(self, step: int) -> list[list[int]]:
        """Parallel to :meth:`micro_batches`: each draw's ``repeat``, how many earlier draws of
        the same sample step ``step``'s global batch holds (0 unless the batch straddles an
        epoch boundary or is larger than the dataset). Counted over the whole global batch, so
        it does not depend on ranks or micro-batches; it keeps repeated draws' noise apart
        (:func:`dlmkit.data.seeds.sample_seed`)."""
        seen: dict[int, int] = {}
        repeats = []
        for index in self.global_batch(step):
            repeats.append(seen.get(index, 0))
            seen[index] = repeats[-1] + 1
        start = self.rank * self.local_batch_size
        return self._split(repeats[start : start + self.local_batch_size])

    def _split(self, local: list[int]) -> list[list[int]]:
        m = self.micro_batch_size
        return [local[i : i + m] for i in range(0, len(local), m)]

    def micro_batch_slots(self) -> list[int]:
        """The first slot (position in the step's global batch) of each of this rank's
        micro-batches, in the order of :meth:`micro_batches`; the same for every step."""
        start = self.rank * self.local_batch_size
        return list(range(start, start + self.local_batch_size, self.micro_batch_size))

    def __iter__(self) -> Iterator[list[int]]:
        step = self.start_step
        while self.num_steps is None or step < self.num_steps:
            yield from self.micro_batches(step)
            step += 1

    def __len__(self) -> int:
        if self.num_steps is None:
            raise TypeError("an endless GlobalBatchSampler (num_steps=None) has no length")
        return max(self.num_steps - self.start_step, 0) * self.accumulation_steps


def eval_batches(
    num_samples: int, global_batch_size: int, *, rank: int = 0, world_size: int = 1
) -> list[list[int]]:
    """One in-order pass over ``0..N-1`` for validation, sharded by rank.

    Global batch ``k`` is ``[k*G, min(N, (k+1)*G))``; each rank gets a contiguous share whose
    sizes differ by at most one (a rank's share may be empty in the last batch, so every rank
    gets the same number of batches and collectives stay matched).

    Returns:
        this rank's list of index lists, one per global batch.
    """
    n = _int("num_samples", num_samples, 1)
    g = _int("global_batch_size", global_batch_size, 1)
    w = _int("world_size", world_size, 1)
    r = _int("rank", rank, 0)
    if r >= w:
        raise ValueError(f"rank must be in [0, world_size={w}), got {r}")
    out = []
    for lo in range(0, n, g):
        size = min(g, n - lo)
        base, extra = divmod(size, w)
        start = lo + r * base + min(r, extra)
        out.append(list(range(start, start + base + (r < extra))))
    return out
