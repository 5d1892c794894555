"""Checks of the machine and the model config that must pass before a run writes anything.

Each one replaces what would otherwise be a deep torch/transformers failure: ``cuda`` on a
machine without CUDA (a cryptic ``torch.cuda`` message), FlexAttention training on the CPU (a
100-line traceback from the first backward, after the run directory was made), a typo under
``model.config`` (silently accepted by transformers' config classes).
"""

from __future__ import annotations

import difflib
import inspect

import torch

from .config import ConfigError


def check_device(spec: str, option: str = "train.device") -> None:
    """``train.device`` (or the command-line ``option`` that takes a device the same way)
    names a device this machine has."""
    if spec == "auto":
        return
    try:
        device = torch.device(spec)
    except (RuntimeError, TypeError):
        raise ConfigError(f"{option}={spec!r} is not a torch device; use auto, cpu, cuda or "
                          "cuda:N") from None
    if device.type == "cuda":
        if not torch.cuda.is_available():
            why = ("this torch build has no CUDA support" if torch.version.cuda is None
                   else "no CUDA device is visible")
            raise ConfigError(f"{option}={spec} but {why} (torch {torch.__version__}); use "
                              f"{option}=cpu, or auto (CUDA when present, else the CPU)")
        if device.index is not None and device.index >= torch.cuda.device_count():
            raise ConfigError(f"{option}={spec} but this machine has "
                              f"{torch.cuda.device_count()} CUDA device(s)")


def check_attention(requested: str, device: torch.device) -> None:
    """FlexAttention has no backward pass on the CPU: training with it there cannot work."""
    if requested == "flex_attention" and device.type == "cpu":
        raise ConfigError(f"model.attention=flex_attention cannot train on the CPU: FlexAttention "
                          f"has no backward pass there (torch {torch.__version__}). Use "
                          "model.attention=sdpa (dense masks), or auto (FlexAttention on CUDA, "
                          "SDPA on the CPU)")


# Accepted by every transformers config class and converted into ``rope_parameters``
# (transformers 5), so absent from the class signature.
_LEGACY_KEYS = ("rope_theta", "rope_scaling")


def check_model_overrides(preset: dict, overrides: dict) -> None:
    """Every ``model.config`` key is a field of the preset's config class.

    transformers' config classes keep unknown keyword arguments as attributes, so a typo such
    as ``num_hiden_layers`` would silently train the preset's default instead."""
    if not overrides:
        return
    from transformers import AutoConfig

    config = AutoConfig.for_model(preset["model_type"])
    cls = type(config)
    valid = set(inspect.signature(cls.__init__).parameters) - {"self", "kwargs"}
    valid |= set(config.to_dict()) | set(getattr(cls, "attribute_map", {})) | set(preset)
    valid |= set(_LEGACY_KEYS)
    valid = {k for k in valid if not k.startswith("_")} - {"model_type", "transformers_version"}
    for key in overrides:
        if key not in valid:
            close = difflib.get_close_matches(str(key), sorted(valid), n=1)
            hint = f"; did you mean {close[0]!r}?" if close else "."
            raise ConfigError(f"model.config.{key} is not an option of {cls.__name__} (the "
                              f"{preset['model_type']} preset's config class){hint} Valid: "
                              f"{', '.join(sorted(valid))}")
