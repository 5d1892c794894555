"""Per-sample seeds: every random draw of a sample's corruption is a function of
``(config seed, optimizer step, global sample index)`` only.

So the noise a sample gets does not depend on the number of ranks, the micro-batch split or
gradient accumulation, and resuming at step ``s`` reproduces step ``s``'s noise exactly.
Validation noise depends on ``(seed, sample index)`` only — never on the training step — so
validation losses are comparable from one evaluation to the next.

Mixing: a 63-bit variant of the splitmix64 finaliser (xor-shifts and odd multiplications
modulo 2^63, each a bijection of ``[0, 2^63)``), applied in a chain
``mix(mix(mix(seed) ^ step) ^ index)``. For a fixed ``(seed, step)`` the map from sample index
to seed is therefore a bijection: seeds of different samples of a step never collide.
Across steps they are pseudo-independent 63-bit values. Validation uses a step value outside
the training range, so its seeds never coincide with a training seed of the same sample.

A sample drawn more than once in one step (a global batch that straddles an epoch boundary,
or one larger than the dataset) must not get the same noise twice: that would be one draw
counted twice, not two. So a training seed also takes ``repeat``, the draw's rank among the
step's draws of the same sample (0 for its first, 1 for its second ...; see
:meth:`~dlmkit.data.sampler.GlobalBatchSampler.micro_batch_repeats`). ``repeat`` is counted
over the whole global batch in stream order, so it too is independent of ranks and
micro-batches; ``repeat = 0`` leaves the seed exactly as before, so the common case (no
repeats) keeps its noise. Seeding by the draw's position in the global batch instead would
also separate repeats, but would change every sample's noise with the data order.

Packed rows hold several documents; each takes its noise from its own sample's generator
(:func:`document_generators`, one per document, row-major), never from its row's.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable, Mapping, Sequence

import torch

_BITS = 63
_MASK = (1 << _BITS) - 1
_MAX_STEP = 1 << 62  # training steps live below this; validation uses a value above
_VALIDATION_STEP = _MAX_STEP | 0x5EED_0F_7A11D
_DECODE_STEP = _MAX_STEP | 0xDEC0DE  # sampling seeds: outside training and validation too
_SPLIT_STREAM = 0x5B11_7000_C0DE  # token splitting draws from a stream of its own


def _mix(x: int) -> int:
    """Bijective avalanche mix of a 63-bit integer (splitmix64-style, modulo 2^63)."""
    x = (x + 0x1E3779B97F4A7C15) & _MASK  # golden-ratio increment: mix(0) is not 0
    x ^= x >> 31
    x = (x * 0x3F58476D1CE4E5B9) & _MASK
    x ^= x >> 27
    x = (x * 0x14D049BB133111EB) & _MASK
    x ^= x >> 31
    return x


def _check(name: str, value: object, limit: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value < limit:
        raise ValueError(f"{name} must be an int in [0, {limit}), got {value!r}")
    return value


def _chain(seed: int, step: int, sample_index: int) -> int:
    return _mix(_mix(_mix(seed) ^ step) ^ sample_index)


def sample_seed(seed: int, step: int, sample_index: int, repeat: int = 0) -> int:
    """Seed in ``[0, 2^63)`` for the training noise of global sample ``sample_index`` at
    optimizer step ``step`` of a run configured with ``seed`` (all non-negative ints);
    ``repeat``: which of the step's draws of that sample (0 = the first, the usual case)."""
    x = _chain(
        _check("seed", seed, 1 << _BITS),
        _check("step", step, _MAX_STEP),
        _check("sample_index", sample_index, 1 << _BITS),
    )
    repeat = _check("repeat", repeat, 1 << _BITS)
    return _mix(x ^ repeat) if repeat else x


def validation_seed(seed: int, sample_index: int) -> int:
    """Seed in ``[0, 2^63)`` for the validation noise of sample ``sample_index``; it does not
    depend on the training step and differs from every training seed of that sample."""
    return _chain(
        _check("seed", seed, 1 << _BITS),
        _VALIDATION_STEP,
        _check("sample_index", sample_index, 1 << _BITS),
    )


def _generators(seeds: Iterable[int], device: torch.device | str) -> list[torch.Generator]:
    gens = []
    for s in seeds:
        g = torch.Generator(device=device)
        g.manual_seed(s)
        gens.append(g)
    return gens


def sample_generators(
    seed: int, step: int, sample_indices: Iterable[int], device: torch.device | str = "cpu"
) -> list[torch.Generator]:
    """One ``torch.Generator`` per row, seeded by :func:`sample_seed`, in the order of
    ``sample_indices`` (the global indices of the rows of a micro-batch). Pass the list as a
    corruption's ``generator`` so row ``b`` draws only from its own sample's stream."""
    return _generators((sample_seed(seed, step, int(i)) for i in sample_indices), device)


def validation_generators(
    seed: int, sample_indices: Iterable[int], device: torch.device | str = "cpu"
) -> list[torch.Generator]:
    """Like :func:`sample_generators` for validation rows (:func:`validation_seed`)."""
    return _generators((validation_seed(seed, int(i)) for i in sample_indices), device)


def document_indices(batch: Mapping[str, torch.Tensor]) -> list[int]:
    """Global sample index of every document of a collated batch, row by row and in order
    within a row (``doc_sample_index``; ``sample_index``, one per row, without it)."""
    docs = batch.get("doc_sample_index")
    if docs is None:
        return [int(i) for i in batch["sample_index"].tolist()]
    return [int(i) for i in docs[docs >= 0].tolist()]


def split_generators(
    seed: int, step: int, draws: Iterable[tuple[int, int]], device: torch.device | str = "cpu"
) -> list[torch.Generator]:
    """One ``torch.Generator`` per ``(sample_index, repeat)`` draw for the token splitting of
    :mod:`dlmkit.data.split_tokens`: a function of ``(seed, step, sample, repeat)`` like the
    noise, but a stream of its own, so turning splitting on leaves every noise draw as it
    was."""
    return _generators((_mix(sample_seed(seed, step, int(i), int(r)) ^ _SPLIT_STREAM)
                        for i, r in draws), device)


def document_generators(
    seed: int, step: int | None, batch: Mapping[str, torch.Tensor],
    draws: Sequence[tuple[int, int]] | None = None, device: torch.device | str = "cpu",
) -> list[torch.Generator]:
    """One ``torch.Generator`` per document of a collated batch (:func:`document_indices`
    order): the corruption's ``generator`` for packed and unpacked batches alike.

    ``step``: the optimizer step (:func:`sample_seed`), or ``None`` for validation
    (:func:`validation_seed`). ``draws``: the micro-batch's ``(sample_index, repeat)`` pairs
    (the sampler's indices and :meth:`~dlmkit.data.sampler.GlobalBatchSampler.
    micro_batch_repeats`); ``None`` = every repeat 0. Two documents of the same sample are
    identical, so they take that sample's repeat numbers in ascending order.
    """
    indices = document_indices(batch)
    if step is None:
        return validation_generators(seed, indices, device)
    pending: dict[int, list[int]] = defaultdict(list)
    for index, repeat in sorted(draws or [(i, 0) for i in indices], reverse=True):
        pending[int(index)].append(int(repeat))
    seeds = []
    for i in indices:
        if not pending[i]:
            raise ValueError(f"document of sample {i} is not among the micro-batch's draws "
                             f"{sorted(draws or [])}")
        seeds.append(sample_seed(seed, step, i, pending[i].pop()))
    return _generators(seeds, device)


def prompt_generators(
    seed: int, prompt_indices: Iterable[int], device: torch.device | str = "cpu"
) -> list[torch.Generator]:
    """One ``torch.Generator`` per prompt for a sampler, seeded from ``(sampler seed, prompt
    index)`` only: a prompt's sample does not depend on which prompts share its batch or on
    the batch size (the samplers draw row ``b``'s numbers from entry ``b`` alone)."""
    _check("seed", seed, 1 << _BITS)
    return _generators((_chain(seed, _DECODE_STEP, _check("prompt index", int(i), 1 << _BITS))
                        for i in prompt_indices), device)
