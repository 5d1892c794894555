"""Hugging Face causal LMs: load one from a local directory or create a tiny one from a preset.

Diffusion training needs no change to the architecture: the attention pattern arrives as an
explicit mask (transformers passes a 4-D mask or a ``BlockMask`` to the kernel unchanged), and
the ``[x_t | x_0]`` layouts get their position ids from the strategy.
"""

from __future__ import annotations

import json
import os
import stat
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import torch

from .directory import check_model_directory

# Tiny models that learn the bundled tasks on a laptop CPU in minutes (no download).
PRESETS: dict[str, dict] = {
    "tiny-llama": dict(model_type="llama", hidden_size=128, intermediate_size=384,
                       num_hidden_layers=3, num_attention_heads=4, num_key_value_heads=4,
                       max_position_embeddings=1024, rope_theta=10000.0,
                       tie_word_embeddings=False),
    "tiny-qwen3": dict(model_type="qwen3", hidden_size=128, intermediate_size=384,
                       num_hidden_layers=3, num_attention_heads=4, num_key_value_heads=2,
                       head_dim=32, max_position_embeddings=1024, tie_word_embeddings=False),
    "small-llama": dict(model_type="llama", hidden_size=256, intermediate_size=768,
                        num_hidden_layers=4, num_attention_heads=8, num_key_value_heads=8,
                        max_position_embeddings=2048, tie_word_embeddings=False),
}

ATTENTION_BACKENDS = ("auto", "sdpa", "flex_attention", "eager")


def resolve_attention(requested: str, device: torch.device) -> str:
    """``auto`` picks FlexAttention with our ``BlockMask``s on CUDA, SDPA with dense masks
    elsewhere (FlexAttention has no backward on CPU)."""
    if requested not in ATTENTION_BACKENDS:
        raise ValueError(f"model.attention must be one of {ATTENTION_BACKENDS}, got {requested!r}")
    if requested == "auto":
        return "flex_attention" if device.type == "cuda" else "sdpa"
    return requested


@contextmanager
def quiet_transformers() -> Iterator[None]:
    """transformers' progress bars off and its logging at warnings and above inside the block
    (around dlmkit's loads and saves: its per-call "Loading weights" and "Writing model shards"
    bars would land in dlmkit's own output); both as they were afterwards. Warnings still
    print."""
    from transformers.utils import logging as hf_logging

    bars = hf_logging.is_progress_bar_enabled()
    level = hf_logging.get_verbosity()
    hf_logging.disable_progress_bar()
    hf_logging.set_verbosity(max(level, hf_logging.WARNING))
    try:
        yield
    finally:
        hf_logging.set_verbosity(level)
        if bars:
            hf_logging.enable_progress_bar()


def build_model(spec: str, vocab_size: int, *, attention: str, dtype: torch.dtype = torch.float32,
                overrides: dict | None = None, what: str = "model.name"):
    """A causal LM from a preset name (``tiny-llama``...) or a local HF model directory.

    The embeddings are resized to ``vocab_size`` when the tokenizer has more tokens (e.g. an
    added mask token). ``what``: the config key ``spec`` came from, for error messages.
    """
    from transformers import AutoConfig, AutoModelForCausalLM

    if spec in PRESETS:
        params = dict(PRESETS[spec])
        params.update(overrides or {})
        model_type = params.pop("model_type")
        config = AutoConfig.for_model(model_type, vocab_size=vocab_size, **params)
        model = AutoModelForCausalLM.from_config(config, attn_implementation=attention,
                                                 dtype=dtype)
    elif os.path.isdir(spec):
        if overrides:
            raise ValueError(f"model.config overrides apply to presets only, got {overrides}")
        check_model_directory(spec, what)
        with quiet_transformers():
            model = AutoModelForCausalLM.from_pretrained(spec, attn_implementation=attention,
                                                         dtype=dtype, local_files_only=True)
        if model.get_input_embeddings().num_embeddings < vocab_size:
            model.resize_token_embeddings(vocab_size)
    else:
        raise ValueError(f"{what} must be a preset ({', '.join(PRESETS)}) or a local "
                         f"model directory, got {spec!r} (not a directory)")
    return model


def load_exported(path: str | Path, *, attention: str = "sdpa", device: str | torch.device = "cpu"):
    """Load a model directory written by ``dlmkit train`` (``RUN/final``) for inference."""
    from transformers import AutoModelForCausalLM

    from .lora import is_adapter_dir, load_adapter_export

    path = check_model_directory(path, "--model")
    with quiet_transformers():
        if is_adapter_dir(path) and not (path / "config.json").is_file():  # lora export=adapter
            return load_adapter_export(path, attention=attention, device=device)
        model = AutoModelForCausalLM.from_pretrained(path, attn_implementation=attention,
                                                     local_files_only=True)
    return model.to(device).eval()


def write_token_ids(directory: str | Path, tokenizer) -> None:
    """Put ``tokenizer``'s special ids into an exported model's ``config.json`` and
    ``generation_config.json`` (those present; a LoRA adapter directory has neither):
    ``bos_token_id``, ``pad_token_id`` and ``eos_token_id`` = the ids that end a response
    (:attr:`~dlmkit.data.Tokenizer.stop_token_ids`, the chat template's end-of-turn first),
    so plain transformers ``generate()`` stops where dlmkit does. A preset's config otherwise
    carries transformers' defaults (1, 2, none), which are ordinary tokens of dlmkit's
    tokenizers."""
    end = tokenizer.end_of_turn_token_id
    stops = [end] * (end is not None) + [i for i in tokenizer.stop_token_ids if i != end]
    ids = {"bos_token_id": tokenizer.bos_token_id, "pad_token_id": tokenizer.pad_token_id,
           "eos_token_id": stops[0] if len(stops) == 1 else stops}
    for name in ("config.json", "generation_config.json"):
        file = Path(directory) / name
        if not file.is_file():
            continue
        config = json.loads(file.read_text())
        config.update(ids)
        # Multimodal configs (DiffusionGemma) keep the text model's ids in text_config too.
        text = config.get("text_config")
        if isinstance(text, dict):
            text.update({k: v for k, v in ids.items() if k in text})
        file.write_text(json.dumps(config, indent=2, sort_keys=True) + "\n")


def make_readable(directory: str | Path) -> None:
    """Give every file under ``directory`` the mode a plain write gets (0644 under the usual
    umask 022). safetensors writes its files through a private temporary file (mode 0600)
    renamed into place, so an exported model would otherwise be unreadable to other users."""
    probe = Path(directory) / ".dlmkit_mode_probe"  # the umask, without changing it
    probe.touch()
    mode = stat.S_IMODE(probe.stat().st_mode)
    probe.unlink()
    for file in Path(directory).rglob("*"):
        if file.is_file() and stat.S_IMODE(file.stat().st_mode) != mode:
            file.chmod(mode)
