"""Per-token integer tags for chunk-causal video/action layouts.

Every position of a token stream carries ``kind`` (``KIND_GLOBAL``: text, conditioning or
register tokens; ``KIND_NOISED``: latent video tokens being denoised; ``KIND_CLEAN``: the
clean-context copies of latent video tokens), ``chunk`` (chunk index) and ``frame`` (latent frame
index, global across chunks). Global tokens carry the sentinel ``-1`` for chunk and frame. The
three tensors are the whole layout: the masks of :mod:`dlmkit.masks.catalogue.chunk_causal` are
functions of them only.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from ..checks import check_int, check_positive_int

KIND_GLOBAL, KIND_NOISED, KIND_CLEAN = 0, 1, 2
KINDS = {KIND_GLOBAL: "KIND_GLOBAL", KIND_NOISED: "KIND_NOISED", KIND_CLEAN: "KIND_CLEAN"}


def _allowed_kinds() -> str:
    return ", ".join(f"{name} ({value})" for value, name in KINDS.items())


@dataclass(frozen=True, eq=False)
class TokenTags:
    """``kind``, ``chunk``, ``frame``: int32 ``[length]`` tensors on one device.

    Integer tensors (or sequences) are converted to int32 on the device of ``kind``. Kinds must
    be one of ``KIND_GLOBAL``, ``KIND_NOISED``, ``KIND_CLEAN``; video tokens need chunk and frame
    ``>= 0``; global tokens get chunk and frame ``-1`` whatever was given.
    """

    kind: torch.Tensor
    chunk: torch.Tensor
    frame: torch.Tensor

    def __post_init__(self) -> None:
        device = self.kind.device if isinstance(self.kind, torch.Tensor) else None
        tensors = {}
        for name in ("kind", "chunk", "frame"):
            value = torch.as_tensor(getattr(self, name), device=device)
            if value.is_floating_point() or value.is_complex() or value.dtype == torch.bool:
                raise TypeError(f"TokenTags.{name} must hold integers, got dtype {value.dtype}")
            if value.dim() != 1 or value.numel() == 0:
                raise ValueError(f"TokenTags.{name} must be a non-empty 1-D tensor [length], "
                                 f"got shape {tuple(value.shape)}")
            tensors[name] = value.to(torch.int32)
        lengths = {name: t.numel() for name, t in tensors.items()}
        if len(set(lengths.values())) != 1:
            raise ValueError(f"TokenTags kind, chunk and frame must have one length, got {lengths}")
        kind = tensors["kind"]
        known = (kind == KIND_GLOBAL) | (kind == KIND_NOISED) | (kind == KIND_CLEAN)
        if not bool(known.all()):
            at = int((~known).nonzero()[0])
            raise ValueError(f"TokenTags.kind must be one of {_allowed_kinds()}, got "
                             f"{int(kind[at])} at position {at}")
        video = kind != KIND_GLOBAL
        for name in ("chunk", "frame"):
            bad = video & (tensors[name] < 0)
            if bool(bad.any()):
                at = int(bad.nonzero()[0])
                raise ValueError(f"TokenTags.{name} must be >= 0 for video tokens, got "
                                 f"{int(tensors[name][at])} at position {at}")
            tensors[name] = torch.where(video, tensors[name], -1).to(torch.int32)
        for name, value in tensors.items():
            object.__setattr__(self, name, value)
        object.__setattr__(self, "_runs", None)  # memo: the tags never change

    @property
    def length(self) -> int:
        return self.kind.numel()

    @property
    def device(self) -> torch.device:
        return self.kind.device

    def runs(self) -> tuple[torch.Tensor, torch.Tensor]:
        """``(start, end)`` int64 ``[n_runs]``: maximal runs of constant (kind, chunk, frame)."""
        if self._runs is not None:
            return self._runs
        tags = torch.stack([self.kind, self.chunk, self.frame])
        change = torch.ones(self.length, dtype=torch.bool, device=self.device)
        change[1:] = (tags[:, 1:] != tags[:, :-1]).any(0)
        start = change.nonzero().flatten()
        end = torch.cat([start[1:], torch.tensor([self.length], device=self.device)])
        object.__setattr__(self, "_runs", (start, end))
        return start, end

    def key(self) -> tuple:
        """Hashable canonical layout: run-length encoding ``((kind, chunk, frame, count), ...)``
        plus the device (exact: equal keys mean equal tags)."""
        start, end = self.runs()
        values = torch.stack([self.kind[start], self.chunk[start], self.frame[start]], 1)
        counts = (end - start).tolist()
        rle = tuple((*v, c) for v, c in zip(values.tolist(), counts))
        return (str(self.device), rle)

    def to(self, device) -> TokenTags:
        if torch.device(device) == self.device:
            return self
        return TokenTags(self.kind.to(device), self.chunk.to(device), self.frame.to(device))


@dataclass(frozen=True)
class Slot:
    """A contiguous span of ``frames * tokens_per_frame`` tokens of one kind, frame-major.

    Video slots cover latent frames ``first_frame .. first_frame + frames - 1``; for a global
    slot ``frames * tokens_per_frame`` is just its token count.
    """

    kind: int
    frames: int
    tokens_per_frame: int
    first_frame: int = 0

    def __post_init__(self) -> None:
        kind = check_int("Slot.kind", self.kind)
        if kind not in KINDS:
            raise ValueError(f"Slot.kind must be one of {_allowed_kinds()}, got {kind}")
        check_positive_int("Slot.frames", self.frames)
        check_positive_int("Slot.tokens_per_frame", self.tokens_per_frame)
        check_int("Slot.first_frame", self.first_frame, minimum=0)

    @property
    def length(self) -> int:
        return self.frames * self.tokens_per_frame


def window_tags(slots, chunk_size: int, device=None) -> TokenTags:
    """Tags of the concatenation of ``slots``: frame ``f`` of a video slot is in chunk
    ``f // chunk_size``; global tokens get chunk and frame ``-1``.

    Example: ``[Slot(KIND_GLOBAL, 1, 4), Slot(KIND_CLEAN, 6, 16), Slot(KIND_NOISED, 6, 16)]``
    with ``chunk_size=2`` is 4 globals then the clean and noised copies of 3 chunks.
    """
    chunk_size = check_positive_int("chunk_size", chunk_size)
    slots = list(slots)
    if not slots:
        raise ValueError("slots must hold at least one Slot, got none")
    kinds, frames = [], []
    for i, slot in enumerate(slots):
        if not isinstance(slot, Slot):
            raise TypeError(f"slots[{i}] must be a Slot, got {type(slot).__name__}")
        frame = torch.arange(slot.first_frame, slot.first_frame + slot.frames, device=device)
        frames.append(frame.repeat_interleave(slot.tokens_per_frame))
        kinds.append(torch.full((slot.length,), slot.kind, device=device))
    kind, frame = torch.cat(kinds), torch.cat(frames)
    frame = torch.where(kind == KIND_GLOBAL, -1, frame)
    chunk = torch.where(kind == KIND_GLOBAL, -1, frame.div(chunk_size, rounding_mode="floor"))
    return TokenTags(kind, chunk, frame)
