"""LoRA through ``peft`` (``model.lora: {r, alpha, dropout, target_modules, modules_to_save,
export}``).

The adapters are injected **in place** (``peft.inject_adapter_in_model``): the model keeps its
class, so every strategy calls it as before, FSDP2 still finds its decoder layers, and the base
weights are frozen (``requires_grad=False``), so only adapter weights get gradients and
optimizer state. ``modules_to_save`` (e.g. ``[embed_tokens, lm_head]``) trains a full copy of
those modules too: needed when the tokenizer adds tokens to a pretrained model (a new mask
token's embedding row would otherwise stay at its random initialisation). Checkpoints hold the
whole state dict (frozen weights included), so ``--resume`` is exact as without LoRA.

Export (``RUN/final``), from the full state dict, on a fresh copy of the model:

* ``export: merged`` (default) -- every adapter folded into its base weight
  (``W + B A * alpha / r``, peft's own merge) and the LoRA layers removed: a plain Hugging Face
  directory that transformers and ``dlmkit generate`` load.
* ``export: adapter`` -- the adapter alone in peft's format (``adapter_config.json`` +
  ``adapter_model.safetensors``), for ``peft.PeftModel.from_pretrained(base, RUN/final)``.
  The base must be a local model directory (``model.name``) whose vocabulary already covers the
  tokenizer's: weights of a preset exist only inside the run, and rows added by resizing the
  embeddings are not part of an adapter.
"""

from __future__ import annotations

import contextlib
import json
import os
from collections.abc import Mapping
from pathlib import Path

import torch

ADAPTER_CONFIG = "adapter_config.json"
DEFAULTS = {"r": 8, "alpha": 16, "dropout": 0.0, "target_modules": "all-linear",
            "modules_to_save": [], "export": "merged"}
EXPORTS = ("merged", "adapter")


def lora_options(spec, key: str = "model.lora") -> dict:
    """``model.lora`` validated and completed with :data:`DEFAULTS`; ``key``: the config key
    its messages name (``dlmkit rl``'s is ``lora``)."""
    if not isinstance(spec, Mapping):
        raise ValueError(f"{key} must be a mapping {{r, alpha, dropout, target_modules, "
                         f"export}} or null, got {spec!r}")
    unknown = sorted(set(spec) - set(DEFAULTS))
    if unknown:
        raise ValueError(f"{key}: unknown key(s) {unknown}; valid: {sorted(DEFAULTS)}")
    out = {**DEFAULTS, **spec}
    r, alpha, dropout = out["r"], out["alpha"], out["dropout"]
    if isinstance(r, bool) or not isinstance(r, int) or r < 1:
        raise ValueError(f"{key}.r must be an int >= 1, got {r!r}")
    if isinstance(alpha, bool) or not isinstance(alpha, (int, float)) or alpha <= 0:
        raise ValueError(f"{key}.alpha must be a number > 0, got {alpha!r}")
    if isinstance(dropout, bool) or not isinstance(dropout, (int, float)) \
            or not 0 <= dropout < 1:
        raise ValueError(f"{key}.dropout must be a number in [0, 1), got {dropout!r}")
    targets = out["target_modules"]
    if targets != "all-linear" and not (
            isinstance(targets, list) and targets
            and all(isinstance(t, str) and t for t in targets)):
        raise ValueError(f"{key}.target_modules must be 'all-linear' or a non-empty list "
                         f"of module names (e.g. [q_proj, v_proj]), got {targets!r}")
    extra = out["modules_to_save"]
    if not (isinstance(extra, list) and all(isinstance(t, str) and t for t in extra)):
        raise ValueError(f"{key}.modules_to_save must be a list of module names (e.g. "
                         f"[embed_tokens, lm_head]), got {extra!r}")
    if out["export"] not in EXPORTS:
        raise ValueError(f"{key}.export must be one of {EXPORTS}, got {out['export']!r}")
    return out


def _peft(key: str = "model.lora"):
    try:
        import peft
    except ImportError:
        raise ImportError(f"{key} needs peft: pip install dlmkit[lora]") from None
    return peft


def linear_module_names(model: torch.nn.Module) -> list[str]:
    """The distinct (last-component) names of the model's ``nn.Linear`` layers."""
    return sorted({name.rsplit(".", 1)[-1] for name, module in model.named_modules()
                   if isinstance(module, torch.nn.Linear)})


def _peft_config(options: dict):
    peft = _peft()
    return peft.LoraConfig(r=options["r"], lora_alpha=options["alpha"],
                           lora_dropout=float(options["dropout"]),
                           target_modules=options["target_modules"],
                           modules_to_save=options["modules_to_save"] or None)


def apply_lora(model: torch.nn.Module, options: Mapping, *,
               base: str | os.PathLike | None = None, key: str = "model.lora") -> torch.nn.Module:
    """Inject LoRA adapters into ``model`` in place and freeze everything else.

    ``base`` is the local directory the model was loaded from (``model.name``), required for
    ``export: adapter``; ``key`` the config key the messages name.

    Raises:
        ValueError: a target module the model lacks (names the linear layers it has), or an
            adapter export without a usable base directory.
    """
    options = lora_options(dict(options), key)
    targets = options["target_modules"]
    if targets != "all-linear":
        have = linear_module_names(model)
        missing = [t for t in targets if t not in have]
        if missing:
            raise ValueError(f"{key}.target_modules: {type(model).__name__} has no linear "
                             f"layer named {missing}; its linear layers: {have} (or use "
                             "'all-linear')")
    names = {name.rsplit(".", 1)[-1] for name, _ in model.named_modules()}
    missing = [m for m in options["modules_to_save"] if m not in names]
    if missing:
        raise ValueError(f"{key}.modules_to_save: {type(model).__name__} has no module "
                         f"named {missing}; e.g. {sorted(n for n in names if not n.isdigit())}")
    if options["export"] == "adapter":
        _check_adapter_base(model, base)
    _peft(key).inject_adapter_in_model(_peft_config(options), model)
    return model


def _check_adapter_base(model, base) -> None:
    if base is None or not Path(base).is_dir():
        raise ValueError("model.lora.export=adapter needs model.name to be a local model "
                         f"directory (the weights the adapter applies to), got {base!r}; the "
                         "weights of a preset exist only inside the run: use export: merged")
    from transformers import AutoConfig

    base_vocab = AutoConfig.from_pretrained(base, local_files_only=True).vocab_size
    vocab = model.get_input_embeddings().num_embeddings
    if vocab > base_vocab:
        raise ValueError(f"model.lora.export=adapter: the tokenizer needs {vocab} embeddings but "
                         f"the base model {base} has {base_vocab}; the resized rows are not part "
                         "of an adapter: use export: merged")


@contextlib.contextmanager
def adapters_disabled(model: torch.nn.Module):
    """Within the block ``model`` computes as its base: every LoRA layer skips its adapter and
    every ``modules_to_save`` copy gives way to the frozen original (peft's own switch); on
    exit the adapters are on again and trainable as before. How ``dlmkit rl`` scores the
    frozen reference of a LoRA policy without a second copy of the model."""
    from peft.tuners.tuners_utils import BaseTunerLayer
    from peft.utils import ModulesToSaveWrapper

    layers = [m for m in model.modules() if isinstance(m, (BaseTunerLayer,
                                                           ModulesToSaveWrapper))]
    trainable = {id(q): q.requires_grad for m in layers for q in m.parameters()}
    for m in layers:
        m.enable_adapters(False)
    try:
        yield model
    finally:
        for m in layers:
            m.enable_adapters(True)
        for m in layers:  # peft's switch also flips requires_grad: put back what it was
            for q in m.parameters():
                q.requires_grad_(trainable[id(q)])


def merge_lora(model: torch.nn.Module) -> torch.nn.Module:
    """Fold every LoRA adapter into its base layer and put the base layer back, and a trained
    copy of each ``modules_to_save`` module in place of its frozen original (in place)."""
    from peft.tuners.tuners_utils import BaseTunerLayer
    from peft.utils import ModulesToSaveWrapper

    for name, module in list(model.named_modules()):
        if isinstance(module, BaseTunerLayer):
            module.merge(safe_merge=True)
            plain = module.get_base_layer()
        elif isinstance(module, ModulesToSaveWrapper):
            plain = module.modules_to_save[module.active_adapters[0]]
        else:
            continue
        parent, _, attr = name.rpartition(".")
        setattr(model.get_submodule(parent) if parent else model, attr, plain)
    return model


def save_lora_export(directory: str | os.PathLike, fresh: torch.nn.Module,
                     state: Mapping[str, torch.Tensor], options: Mapping,
                     base: str | os.PathLike | None = None,
                     dtype: torch.dtype = torch.float32) -> None:
    """Write ``RUN/final`` from the trained full ``state`` loaded into ``fresh``: a model
    built like the trained one (same architecture, LoRA injected by :func:`apply_lora`).
    A merged export is merged in the trained precision, then written in ``dtype``; an adapter
    keeps its trained (master) dtype."""
    options = lora_options(dict(options))
    fresh.load_state_dict(dict(state))
    directory = Path(directory)
    if options["export"] == "merged":
        merge_lora(fresh.float()).to(dtype).save_pretrained(directory)
        return
    from safetensors.torch import save_file

    peft = _peft()
    adapter = peft.get_peft_model_state_dict(fresh)
    directory.mkdir(parents=True, exist_ok=True)
    # peft's own file layout, so PeftModel.from_pretrained(base, directory) loads it.
    save_file({f"base_model.model.{k}": v.contiguous() for k, v in adapter.items()},
              directory / "adapter_model.safetensors")
    config = _peft_config(options)
    config.base_model_name_or_path = str(Path(base).resolve())
    config.save_pretrained(directory)


def is_adapter_dir(path: str | os.PathLike) -> bool:
    return (Path(path) / ADAPTER_CONFIG).is_file()


def load_adapter_export(path: str | os.PathLike, *, attention: str, device) -> torch.nn.Module:
    """An ``export: adapter`` directory as a merged model: its base, the adapter, merged."""
    from transformers import AutoModelForCausalLM

    peft = _peft()
    path = Path(path)
    base = json.loads((path / ADAPTER_CONFIG).read_text()).get("base_model_name_or_path")
    if not base or not Path(base).is_dir():
        raise ValueError(f"{path / ADAPTER_CONFIG}: base_model_name_or_path {base!r} is not a "
                         "local model directory; the adapter needs its base model")
    model = AutoModelForCausalLM.from_pretrained(base, attn_implementation=attention,
                                                 local_files_only=True)
    model = peft.PeftModel.from_pretrained(model, path).merge_and_unload()
    return model.to(device).eval()
