"""Gradient checkpointing (``model.gradient_checkpointing: true``): each decoder layer keeps
only its input during the forward and recomputes its activations in the backward.

The non-reentrant implementation is used: it recomputes with the same RNG state and the same
masks, so losses and gradients equal the plain run's, and it works with frozen parameters
(LoRA), DDP and FSDP2 without the reentrant variant's "inputs must require grad" workaround.
Activation memory drops from every layer's intermediates to one layer's plus the layer inputs.
"""

from __future__ import annotations

import torch


def enable_gradient_checkpointing(model: torch.nn.Module) -> torch.nn.Module:
    """Turn on checkpointing of every decoder layer (training mode only); returns ``model``.

    Raises:
        ValueError: the model has no gradient checkpointing support.
    """
    # transformers 5 renamed gradient_checkpointing_enable (deprecated) to this.
    enable = getattr(model, "activation_checkpointing_enable", None)
    if enable is None or not getattr(model, "supports_gradient_checkpointing", False):
        raise ValueError(f"model.gradient_checkpointing: {type(model).__name__} does not support "
                         "gradient checkpointing (Hugging Face models whose class sets "
                         "supports_gradient_checkpointing do); set it to false")
    enable(activation_checkpointing_kwargs={"use_reentrant": False})
    return model
