"""Training configuration: YAML + ``--set key.sub=value`` overrides, validated up front.

The embedded default (no config file) trains a tiny Llama with MDLM on the bundled ``reverse``
task on the CPU in a few minutes. Unknown keys are errors that list the valid ones.
"""

from __future__ import annotations

import copy
from pathlib import Path

import yaml

DEFAULTS: dict = {
    "seed": 0,
    "output_dir": None,          # default: runs/<strategy>-<task>-<timestamp>
    "data": {
        "task": "reverse",        # a bundled task, or null with train_files
        "task_options": {},
        "train_files": [],        # JSONL / JSON / Parquet SFT records
        "validation_files": [],
        "num_train": 20000,       # samples drawn from the bundled task
        "num_validation": 256,
        "tokenizer": "byte",      # "byte" or a local Hugging Face tokenizer directory
        "allow_eos_as_pad": False,
        "block_align": True,      # pad each sample to a multiple of the strategy's block size
        "pad_seq_len_divisible": None,
        "max_seq_len": 128,
        "supervise_padding": False,
        "pack": False,
    },
    "model": {
        "name": "tiny-llama",     # preset name or local model directory
        "attention": "auto",      # auto | sdpa | flex_attention | eager
        "dtype": "float32",
        "config": {},             # preset overrides (e.g. num_hidden_layers)
    },
    "strategy": {"name": "mdlm"},  # + the strategy's own options (see dlmkit.strategies)
    "train": {
        "steps": 400,
        "global_batch_size": 64,
        "micro_batch_size": 64,   # per rank; accumulation = global / (micro * world)
        "lr": 3.0e-3,
        "min_lr_ratio": 0.1,
        "warmup_steps": 20,
        "weight_decay": 0.01,
        "betas": [0.9, 0.98],
        "max_grad_norm": 1.0,
        "autocast": "auto",       # auto (bf16 on CUDA, off on CPU) | bf16 | none
        "loss_chunk_size": None,
        "distributed": "ddp",     # ddp | fsdp2 (used under torchrun with world size > 1)
        "device": "auto",
        "log_every": 10,
        "val_every": 100,
        "save_every": 100,
        "threads": None,          # torch intra-op threads (None = torch default)
        "progress": True,
    },
}


class ConfigError(ValueError):
    pass


def _merge(base: dict, update: dict, path: str, *, open_keys: tuple[str, ...]) -> dict:
    out = copy.deepcopy(base)
    for key, value in update.items():
        where = f"{path}{key}"
        if key not in base and path.rstrip(".") not in open_keys:
            raise ConfigError(f"unknown config key {where!r}; valid keys under "
                              f"{path.rstrip('.') or 'the top level'}: {', '.join(sorted(base))}")
        if isinstance(base.get(key), dict) and where not in open_keys and key != "config" \
                and key != "task_options":
            if not isinstance(value, dict):
                raise ConfigError(f"config key {where!r} must be a mapping, got {value!r}")
            out[key] = _merge(base[key], value, f"{where}.", open_keys=open_keys)
        else:
            out[key] = copy.deepcopy(value)
    return out


def parse_override(item: str) -> tuple[list[str], object]:
    if "=" not in item:
        raise ConfigError(f"--set expects key.sub=value, got {item!r}")
    key, raw = item.split("=", 1)
    if not key:
        raise ConfigError(f"--set expects key.sub=value, got {item!r}")
    return key.split("."), yaml.safe_load(raw) if raw else None


def load_config(path: str | Path | None = None, overrides: list[str] | None = None) -> dict:
    """The default config, updated by a YAML file and then by ``key.sub=value`` overrides."""
    config = copy.deepcopy(DEFAULTS)
    if path is not None:
        path = Path(path)
        if not path.is_file():
            raise ConfigError(f"config file {path} does not exist")
        try:
            loaded = yaml.safe_load(path.read_text()) or {}
        except yaml.YAMLError as err:
            raise ConfigError(f"{path}: not valid YAML: {err}") from None
        if not isinstance(loaded, dict):
            raise ConfigError(f"{path}: the top level must be a mapping")
        config = _merge(config, loaded, "", open_keys=("strategy",))
    for item in overrides or []:
        keys, value = parse_override(item)
        update: dict = value  # type: ignore[assignment]
        for key in reversed(keys):
            update = {key: update}
        config = _merge(config, update, "", open_keys=("strategy",))
    return validate(config)


def validate(config: dict) -> dict:
    def need(cond: bool, message: str) -> None:
        if not cond:
            raise ConfigError(message)

    t, d = config["train"], config["data"]
    for key in ("steps", "global_batch_size", "micro_batch_size", "log_every", "val_every",
                "save_every"):
        value = t[key]
        need(isinstance(value, int) and not isinstance(value, bool) and value >= 1,
             f"train.{key} must be a positive int, got {value!r}")
    need(isinstance(t["lr"], (int, float)) and t["lr"] > 0,
         f"train.lr must be > 0, got {t['lr']!r}")
    need(isinstance(t["warmup_steps"], int) and t["warmup_steps"] >= 0,
         f"train.warmup_steps must be an int >= 0, got {t['warmup_steps']!r}")
    need(0 <= t["min_lr_ratio"] <= 1,
         f"train.min_lr_ratio must be in [0, 1], got {t['min_lr_ratio']!r}")
    need(t["autocast"] in ("auto", "bf16", "none"),
         f"train.autocast must be auto, bf16 or none, got {t['autocast']!r}")
    need(t["distributed"] in ("ddp", "fsdp2"),
         f"train.distributed must be ddp or fsdp2, got {t['distributed']!r}")
    need(t["max_grad_norm"] is None or t["max_grad_norm"] > 0,
         f"train.max_grad_norm must be > 0 or null, got {t['max_grad_norm']!r}")
    need(isinstance(config["seed"], int) and config["seed"] >= 0,
         f"seed must be an int >= 0, got {config['seed']!r}")
    need(d["task"] is not None or d["train_files"],
         "data: give a bundled data.task or data.train_files")
    need(isinstance(d["max_seq_len"], int) and d["max_seq_len"] >= 1,
         f"data.max_seq_len must be a positive int, got {d['max_seq_len']!r}")
    need(isinstance(config["strategy"], dict) and "name" in config["strategy"],
         "strategy.name is required")
    need(config["model"]["dtype"] in ("float32", "bfloat16"),
         f"model.dtype must be float32 or bfloat16, got {config['model']['dtype']!r}")
    return config
