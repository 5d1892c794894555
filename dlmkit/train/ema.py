"""An exponential moving average (EMA) of the trained weights, for validation and exports.

With ``train.ema_decay = d > 0`` (unset: the strategy's ``default_ema_decay``, listed by
``dlmkit train --print-config``; 0 = off) every optimizer step moves a shadow copy of each
trainable parameter towards it: ``shadow += (1 - r) * (param - shadow)`` with ``r = min(d,
(1 + n) / (10 + n))`` after ``n`` earlier updates (the warm-up keeps an early average from
remembering the random initialisation for ~1/(1 - d) steps). Validation, ``RUN/best``,
``RUN/last`` and ``RUN/final`` use the shadow weights, so ``final/`` is the best *averaged*
model; training itself always steps the raw weights. Checkpoints hold both, so a resume
continues the same average bit for bit. The MDLM and BD3-LM recipes average with 0.9999 over
~1M steps; the average spans ~1/(1 - d) steps, so short runs want less (0.999 over a few
thousand).

Works per parameter with in-place ``lerp_``/``copy_``, which DDP's plain tensors and FSDP2's
sharded DTensors both support: each rank averages its own shard. The shadow is fp32 whatever
the parameters' dtype (:mod:`dlmkit.train.precision`).
"""

from __future__ import annotations

from contextlib import contextmanager

import torch


class WeightAverage:
    """The shadow weights of ``model``'s trainable parameters (by name)."""

    def __init__(self, model, decay: float) -> None:
        if not 0.0 < decay < 1.0:
            raise ValueError(f"EMA decay must be in (0, 1), got {decay!r}")
        self.decay = float(decay)
        self.params = {name: p for name, p in model.named_parameters() if p.requires_grad}
        # fp32 whatever the parameters' dtype: at decay 0.999 a bf16 shadow's increment is
        # below half an ulp and the average stalls.
        self.shadow = {name: p.detach().to(torch.float32, copy=True)
                       for name, p in self.params.items()}
        self.updates = 0

    def rate(self) -> float:
        """The decay of the next update (warm-up, then ``decay``)."""
        n = self.updates
        return min(self.decay, (1 + n) / (10 + n))

    @torch.no_grad()
    def update(self) -> None:
        """Call after each optimizer step."""
        weight = 1.0 - self.rate()
        for name, p in self.params.items():
            self.shadow[name].lerp_(p.detach().to(torch.float32), weight)
        self.updates += 1

    @contextmanager
    def applied(self):
        """The model holds the averaged weights inside the block, its own ones again after
        (also when the block raises)."""
        with torch.no_grad():
            backup = {name: p.detach().clone() for name, p in self.params.items()}
            for name, p in self.params.items():
                p.copy_(self.shadow[name])
        try:
            yield
        finally:
            with torch.no_grad():
                for name, p in self.params.items():
                    p.copy_(backup[name])

    @torch.no_grad()
    def restart(self) -> None:
        """Start the average afresh from the model's current weights (a resume from a
        checkpoint written without EMA)."""
        for name, p in self.params.items():
            self.shadow[name].copy_(p.detach())
        self.updates = 0

    def state_dict(self) -> dict:
        # ``updates`` as a tensor: torch.distributed.checkpoint loads tensors in place.
        return {"updates": torch.tensor(self.updates), "shadow": dict(self.shadow)}

    def load_state_dict(self, state: dict) -> None:
        missing = sorted(set(self.shadow) - set(state["shadow"]))
        extra = sorted(set(state["shadow"]) - set(self.shadow))
        if missing or extra:
            raise ValueError(f"EMA state does not fit the model: missing {missing[:3]}, "
                             f"unexpected {extra[:3]}")
        with torch.no_grad():
            for name, tensor in state["shadow"].items():
                self.shadow[name].copy_(tensor)
        self.updates = int(state["updates"])
