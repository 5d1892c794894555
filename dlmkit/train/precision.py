"""Mixed precision as the large trainers do it: fp32 master weights, bf16 compute.

Three dtypes, each with one job (resolved by :func:`resolve_precision`):

* **master** (``train.master_dtype``, float32): the trainable parameters, so their AdamW state
  and the weight average (:mod:`dlmkit.train.ema`, always fp32) too. An update of lr 1e-5 on a
  weight near 0.02 is ~1e-3 of a bf16 ulp: stepped in bf16 it rounds away. ``bfloat16`` is an
  explicit opt-in that warns.
* **compute** (``train.autocast``): the forward and backward run under ``torch.autocast`` in
  bf16 (``auto``: on CUDA, or wherever ``model.dtype`` is bfloat16); under FSDP2 a
  ``MixedPrecisionPolicy`` gathers bf16 parameters and reduces gradients in fp32.
* **storage** (``model.dtype``; null = the source checkpoint's own dtype, float32 for a
  preset): the frozen parts (LoRA's base weights) and the exported weights.
"""

from __future__ import annotations

import json
import warnings
from contextlib import nullcontext
from dataclasses import dataclass
from pathlib import Path

import torch

from .config import RunConfig

DTYPES = ("float32", "bfloat16")


@dataclass(frozen=True)
class Precision:
    master: torch.dtype  # trainable parameters, optimizer state
    compute: torch.dtype | None  # autocast dtype; None = off
    storage: torch.dtype  # frozen parameters and the export

    @property
    def all_fp32(self) -> bool:
        return self.compute is None and self.master == self.storage == torch.float32

    def describe(self) -> str:
        def name(dtype):
            return str(dtype).removeprefix("torch.") if dtype is not None else "off"

        return (f"precision: trainable weights, optimizer state and weight average "
                f"{name(self.master)}; autocast {name(self.compute)}; frozen weights and "
                f"export {name(self.storage)}")


def source_dtype(spec: str | None) -> str:
    """The dtype a model directory's ``config.json`` declares (``dtype``, or transformers 4's
    ``torch_dtype``), as one of :data:`DTYPES`; float32 for a preset or an undeclared one."""
    path = Path(str(spec)) / "config.json" if spec else None
    if path is None or not path.is_file():
        return "float32"
    config = json.loads(path.read_text())
    declared = config.get("dtype") or config.get("torch_dtype")
    return "bfloat16" if declared == "bfloat16" else "float32"


def resolve_storage_dtype(config: RunConfig) -> str | None:
    """Write the source's dtype into ``model.dtype`` when it is null (``model.name`` already
    resolved), so config.yaml records what the export is written in; a line saying so, or
    None when the user set it."""
    m = config.model
    if m.dtype is not None:
        return None
    m.dtype = source_dtype(m.name)
    if not Path(str(m.name)).is_dir():  # a preset: float32, nothing to say
        return None
    return (f"model.dtype={m.dtype}: the dtype of {m.name!r} (frozen weights and the "
            "export; trained weights stay in train.master_dtype)")


def warn_pure_bf16(config: RunConfig) -> None:
    if config.train.master_dtype == "bfloat16":
        warnings.warn("train.master_dtype=bfloat16: the trained weights and their optimizer "
                      "state are kept in bf16, so every update smaller than half a bf16 ulp of "
                      "its weight (most updates at fine-tuning learning rates) is lost; float32 "
                      "(the default) keeps fp32 master weights and still computes in bf16",
                      UserWarning, stacklevel=2)


def resolve_precision(config: RunConfig, device: torch.device) -> Precision:
    """The run's :class:`Precision`; ``model.dtype: null`` reads the source's config.json
    (:func:`resolve_storage_dtype` writes it into the config once)."""
    m, t = config.model, config.train
    storage = m.dtype or source_dtype(m.name)
    mode = t.autocast
    if mode == "auto":
        mode = "bf16" if device.type == "cuda" or storage == "bfloat16" else "none"
    return Precision(master=getattr(torch, t.master_dtype),
                     compute=torch.bfloat16 if mode == "bf16" else None,
                     storage=getattr(torch, storage))


def autocast(precision: Precision, device: torch.device):
    """The context every training and validation forward runs in."""
    if precision.compute is None:
        return nullcontext()
    return torch.autocast(device.type, dtype=precision.compute)


@torch.no_grad()
def place_parameters(model: torch.nn.Module, precision: Precision) -> torch.nn.Module:
    """Trainable parameters in the master dtype, frozen ones in the storage dtype (in place:
    a tied parameter is one object, so it stays tied)."""
    for p in model.parameters():
        want = precision.master if p.requires_grad else precision.storage
        if p.is_floating_point() and p.dtype != want:
            p.data = p.data.to(want)
    return model


def fsdp_policy(precision: Precision):
    """FSDP2's ``MixedPrecisionPolicy`` for bf16 compute (bf16 parameters gathered for the
    forward and backward, gradients reduced and kept in fp32 on the fp32 master shards); None
    when compute is not bf16."""
    if precision.compute is None:
        return None
    from torch.distributed.fsdp import MixedPrecisionPolicy

    return MixedPrecisionPolicy(param_dtype=precision.compute, reduce_dtype=torch.float32)


def export_state(state: dict[str, torch.Tensor], dtype: torch.dtype) -> dict[str, torch.Tensor]:
    """``state`` with its floating tensors in ``dtype`` (the export's)."""
    return {k: v.to(dtype) if v.is_floating_point() else v for k, v in state.items()}


def record_export_dtype(directory: Path, dtype: torch.dtype) -> None:
    """transformers writes ``config.json``'s ``dtype`` from the live model's parameters (fp32
    masters); the file holds ``dtype`` weights, so the config must say so."""
    path = Path(directory) / "config.json"
    config = json.loads(path.read_text())
    config["dtype"] = str(dtype).removeprefix("torch.")
    config.pop("torch_dtype", None)
    path.write_text(json.dumps(config, indent=2, sort_keys=True) + "\n")
