"""Training configuration: YAML + ``--set key.sub=value`` overrides, validated up front.

The embedded default (no config file) trains a tiny Llama with BD3-LM block diffusion on the
bundled ``reverse`` task on the CPU in a few minutes (early stopping ends it once the task is
learned). Unknown keys are errors that list the valid ones.
"""

from __future__ import annotations

import copy
import importlib.util
import os
import re
from collections.abc import Callable
from pathlib import Path

import yaml

DEFAULTS: dict = {
    "seed": 0,
    "output_dir": None,          # default: runs/<strategy>-<task>-<timestamp>
    "data": {
        "task": "reverse",        # a bundled task, or null with train_files
        "task_options": {},
        "train_files": [],        # JSONL / JSON / Parquet / CSV files or saved HF datasets
        "fields": {},             # format field -> your name, e.g. {prompt: question}
        "validation_files": [],
        "num_train": 20000,       # samples drawn from the bundled task
        "num_validation": 256,
        "tokenizer": "byte",      # "byte" or a local Hugging Face tokenizer directory
        "allow_eos_as_pad": False,
        "block_align": True,      # pad each sample to a multiple of the strategy's block size
        "pad_seq_len_divisible": None,
        "max_seq_len": 128,
        "supervise_padding": None,  # score the padding after a sample (None = the strategy's
                                    # choice: true for mdlm/scdd, false otherwise)
        "pack": False,
        # Split this share of the training prompts' tokens into two vocabulary pieces that
        # spell them (recursively; BPE only; see dlmkit.data.split_tokens): shows a BPE model
        # the spelling of its pieces. 0 = the tokenizer's own segmentation.
        "split_tokens": 0.0,
        "split_responses": False,  # split the supervised tokens too (else the prompt's only)
        # A record longer than max_seq_len is cut (block_diffusion keeps a response's whole
        # blocks under the cap only). error: a record left with no supervised token is an
        # error; drop: every record the cap cuts is left out; truncate: every record is cut and
        # kept (see dlmkit.train.truncation). Counts are reported either way.
        "truncation": "error",
    },
    "model": {
        "name": None,             # preset name or local model directory (None = the
                                  # strategy's own preset: tiny-llama for the causal-LM families)
        "attention": "auto",      # auto | sdpa | flex_attention | eager
        "dtype": None,            # float32 | bfloat16: frozen weights (LoRA's base) and the
                                  # export; null = the checkpoint's own (float32 for a preset).
                                  # Trained weights are train.master_dtype (dlmkit.train.precision)
        "config": {},             # preset overrides (e.g. num_hidden_layers)
        "gradient_checkpointing": False,  # recompute layer activations in the backward
        "lora": None,             # {r, alpha, dropout, target_modules, export} (see models.lora)
    },
    # + the strategy's own options (see dlmkit.strategies). BD3-LM is the default because it
    # decodes the bundled task exactly within 400 steps while the tiny MDLM learns the answer
    # length from the canvas length (docs/families/bd3lm.md#why-these-defaults).
    "strategy": {"name": "bd3lm"},
    "train": {
        # None (and no epochs) = the strategy's default_steps, what the user-like suite
        # tests/suite needs (the bundled task needs only 400: `make demo`). Every family's
        # training defaults: `dlmkit train --print-config`; the measurements behind them:
        # docs/families/<family>.md#why-these-defaults. Written into config.yaml.
        "steps": None,
        "final_model": "best",    # RUN/final: best (lowest validation loss) or last step
        # auto: fine-tune when model.name is a model directory with weights, else train from
        # scratch; each regime fills the unset keys its own way (dlmkit.train.regime)
        "regime": "auto",
        # With validation data, stop after this many validations in a row that do not lower
        # the best validation loss by min_delta (nats/token); steps/epochs are then the most
        # the run trains (dlmkit.train.early_stopping). 0 = train the whole budget.
        "early_stopping_patience": 5,
        "early_stopping_min_delta": 0.001,
        "epochs": None,           # passes over the training records; when set it decides the
                                  # step count instead of steps (see dlmkit.train.budget)
        "global_batch_size": 64,
        "micro_batch_size": None,  # rows per forward on each rank (None = the rank's whole
                                   # share); accumulation = global / (micro * world)
        "lr": None,               # None = the strategy's default_lr, written into config.yaml
        "min_lr_ratio": 0.1,
        "warmup_steps": None,     # None = 10% of the resolved steps, or the family's
                                  # default_warmup_steps (dlmkit.train.budget; measured:
                                  # docs/families/ar.md#why-these-defaults);
                                  # written into config.yaml
        "weight_decay": None,     # AdamW's, on matrices only (not norms or biases); None =
                                  # the regime's default (dlmkit.train.regime)
        "betas": [0.9, 0.98],
        "max_grad_norm": 1.0,
        "ema_decay": None,        # > 0: validation, best/, last/ and final/ use an exponential
                                  # moving average of the weights (dlmkit.train.ema); it spans
                                  # ~1/(1 - decay) steps, e.g. 0.999 for a few thousand steps.
                                  # 0 = none; None = the strategy's default_ema_decay,
                                  # written into config.yaml
        "autocast": "auto",       # auto (bf16 on CUDA or with model.dtype bfloat16, else
                                  # off) | bf16 | none: the compute dtype of every forward
        "master_dtype": "float32",  # trainable weights, optimizer state; bfloat16 = pure-bf16
                                    # opt-in that loses small updates (warned)
        "loss_chunk_size": None,
        "distributed": "ddp",     # ddp | fsdp2 (used under torchrun with world size > 1)
        "device": "auto",
        "log_every": 10,
        "val_every": 100,
        "save_every": 100,
        "threads": None,          # torch intra-op threads (None = torch default)
        "progress": True,
        "tensorboard": False,     # also write the metrics as TensorBoard events in
                                  # RUN/tensorboard/ (needs the tensorboard package)
    },
}


TRUNCATION_POLICIES = ("error", "drop", "truncate")


class ConfigError(ValueError):
    pass


class _Loader(yaml.SafeLoader):
    """YAML 1.2 floats: PyYAML (YAML 1.1) reads ``3e-3`` (no dot) as a string."""


_Loader.add_implicit_resolver(
    "tag:yaml.org,2002:float",
    re.compile(r"""^(?:[-+]?(?:[0-9][0-9_]*)\.[0-9_]*(?:[eE][-+]?[0-9]+)?
                   |[-+]?(?:[0-9][0-9_]*)(?:[eE][-+]?[0-9]+)
                   |\.[0-9_]+(?:[eE][-+]?[0-9]+)?
                   |[-+]?\.(?:inf|Inf|INF)
                   |\.(?:nan|NaN|NAN))$""", re.X),
    list("-+0123456789."))


class DuplicateKeyError(yaml.YAMLError):
    """A mapping names the same key twice. PyYAML keeps the last value silently, so
    ``train: {steps: 5, steps: 50000}`` would train 50000 steps."""

    def __init__(self, key: str, first: int, second: int) -> None:
        self.key, self.first, self.second = key, first, second
        super().__init__(f"key {key!r} is given twice, on line {first} and line {second}")


def _reject_duplicates(node, path: str) -> None:
    """Raise DuplicateKeyError for the first mapping in ``node`` that repeats a key; ``path``
    is the dotted key of ``node`` ("" at the top)."""
    if isinstance(node, yaml.SequenceNode):
        for item in node.value:
            _reject_duplicates(item, path)
    elif isinstance(node, yaml.MappingNode):
        seen: dict[str, int] = {}
        for key_node, value_node in node.value:
            key = str(key_node.value) if isinstance(key_node, yaml.ScalarNode) else None
            where = f"{path}.{key}" if path else str(key)
            if key is not None:
                line = key_node.start_mark.line + 1
                if key in seen:
                    raise DuplicateKeyError(where, seen[key], line)
                seen[key] = line
            _reject_duplicates(value_node, where)


def _yaml(text: str, path: str = ""):
    """``text`` read as YAML (1.2 floats); a repeated key is a DuplicateKeyError (its name is
    dotted from ``path``, the key the text stands for)."""
    loader = _Loader(text)
    try:
        node = loader.get_single_node()
        if node is None:
            return None
        _reject_duplicates(node, path)
        return loader.construct_document(node)
    finally:
        loader.dispose()


# Keys a resumed run may change: they do not alter what is trained (train.steps extends or
# shortens the schedule's horizon; the rest is bookkeeping). Any other difference between a
# resume's config and its checkpoint's is an error (see dlmkit.train.resume).
RESUMABLE_KEYS = ("train.steps", "train.epochs", "train.early_stopping_patience",
                  "train.early_stopping_min_delta", "train.log_every", "train.val_every",
                  "train.save_every", "train.threads", "train.progress", "train.tensorboard",
                  "train.device", "output_dir")

# Mappings whose keys are free-form (a strategy's options, a model preset's overrides, a
# task's parameters): merged key by key, not checked against the defaults.
OPEN_KEYS = ("strategy", "model.config", "data.task_options", "data.fields")


def _merge(base: dict, update: dict, path: str = "") -> dict:
    """``update`` merged into a copy of ``base``; ``path`` is base's dotted key ("" = top)."""
    out = copy.deepcopy(base)
    is_open = path in OPEN_KEYS
    for key, value in update.items():
        where = f"{path}.{key}" if path else str(key)
        if key not in base and not is_open:
            raise ConfigError(f"unknown config key {where!r}; valid keys under "
                              f"{path or 'the top level'}: {', '.join(sorted(base))}")
        if isinstance(base.get(key), dict):
            if value is None and where in OPEN_KEYS:
                value = {}
            if not isinstance(value, dict):
                raise ConfigError(f"config key {where!r} must be a mapping, got {value!r}")
            out[key] = _merge(base[key], value, where)
        else:
            out[key] = copy.deepcopy(value)
    return out


def parse_override(item: str) -> tuple[list[str], object]:
    if "=" not in item:
        raise ConfigError(f"--set expects key.sub=value, got {item!r}")
    key, raw = item.split("=", 1)
    if not key:
        raise ConfigError(f"--set expects key.sub=value, got {item!r}")
    if not raw.strip():
        # YAML reads an empty value as null: `--set train.steps=` (a variable that expanded
        # to nothing) would quietly become the default.
        raise ConfigError(f"--set {item!r} has no value after '='; give one, or write "
                          f"--set {key}=null for the default")
    try:
        return key.split("."), _yaml(raw, key)
    except DuplicateKeyError as err:
        raise ConfigError(f"--set {item!r}: key {err.key!r} is given twice; keep one") from None
    except yaml.YAMLError as err:
        raise ConfigError(f"--set {item!r}: the value is not valid YAML: {err}") from None


# Where a layer of the config comes from: the file's path, or the command line.
COMMAND_LINE = "the --set options"


def _layers(path: str | Path | None, overrides: list[str] | None) -> list[tuple[str, dict]]:
    """The updates applied to the defaults, in order, each with where it comes from: the YAML
    file, then each override."""
    layers = []
    if path is not None:
        path = Path(path)
        if path.is_dir():
            raise ConfigError(f"config file {path} is a directory; give a YAML file (e.g. "
                              "configs/bd3lm-tiny.yaml)")
        if not path.is_file():
            raise ConfigError(f"config file {path} does not exist")
        try:
            loaded = _yaml(path.read_text()) or {}
        except DuplicateKeyError as err:
            raise ConfigError(f"{path}: key {err.key!r} is given twice, on line {err.first} "
                              f"and line {err.second} (YAML would keep only the last); keep "
                              "one") from None
        except yaml.YAMLError as err:
            raise ConfigError(f"{path}: not valid YAML: {err}") from None
        if not isinstance(loaded, dict):
            raise ConfigError(f"{path}: the top level must be a mapping")
        layers.append((str(path), loaded))
    for item in overrides or []:
        keys, value = parse_override(item)
        update: dict = value  # type: ignore[assignment]
        for key in reversed(keys):
            update = {key: update}
        layers.append((COMMAND_LINE, update))
    return layers


def load_config(path: str | Path | None = None, overrides: list[str] | None = None,
                notes: list[str] | None = None) -> dict:
    """The default config, updated by a YAML file and then by ``key.sub=value`` overrides.

    Relative paths that exist (data files, a tokenizer or model directory, a DFlash target)
    are made absolute, so that the run's config.yaml names the same files from any directory.
    ``notes``, when given, receives lines about settings that have no effect (see
    :func:`_unused_task`)."""
    config = copy.deepcopy(DEFAULTS)
    layers = _layers(path, overrides)
    budget: dict[str, object] = {}
    for i, (where, layer) in enumerate(layers):
        config = _merge(config, layer)
        train = layer.get("train") if isinstance(layer.get("train"), dict) else {}
        budget.update({k: train[k] for k in ("steps", "epochs") if k in train})
        if i + 1 == len(layers) or layers[i + 1][0] != where:
            _one_budget(budget, where, config)
            budget = {}
    absolute_paths(config)
    if notes is not None:
        notes.extend(_unused_task(layers, config))
    return validate(config)


def _one_budget(budget: dict, where: str, config: dict) -> None:
    """Exactly one of train.steps / train.epochs decides: the one a place (the config file, or
    the command line) sets clears the other, so a later ``--set`` overrides the file; setting
    both in one place is an error. ``budget``: the values of the two that ``where`` sets."""
    sets = [k for k in ("steps", "epochs") if budget.get(k) is not None]
    if len(sets) == 2:
        raise ConfigError(f"train.steps and train.epochs are both set in {where} "
                          f"(steps={budget['steps']!r}, epochs={budget['epochs']!r}); exactly "
                          "one decides the budget: keep one")
    if sets:
        config["train"]["epochs" if sets[0] == "steps" else "steps"] = None


def _unused_task(layers: list[tuple[str, dict]], config: dict) -> list[str]:
    """With ``data.train_files`` the run trains on the files (the bundled task is not built):
    a line for each task setting the user gave that is therefore not used."""
    if not config["data"]["train_files"]:
        return []
    given = {}
    for where, layer in layers:
        for key, value in flatten(layer).items():
            if key == "data.task" or key.startswith("data.task_options"):
                given[key] = (value, where)
    return [f"note: {key}={value!r} (from {where}) is not used: data.train_files is set, so "
            "the run trains on those files" for key, (value, where) in given.items()
            if value not in (None, {})]


def _model_presets() -> set[str]:
    """Every preset name ``model.name`` may take (they win over a directory of that name)."""
    from dlmkit.models import PRESETS
    from dlmkit.models.dflash import DRAFT_PRESETS
    from dlmkit.models.diffusion_gemma import PRESETS as GEMMA_PRESETS

    return set(PRESETS) | set(DRAFT_PRESETS) | set(GEMMA_PRESETS)


def _absolute(value, *, unless: Callable[[str], bool] = lambda name: False):
    """``value`` as an absolute path when it is a relative path that exists, else as is."""
    if not isinstance(value, str) or os.path.isabs(value) or not os.path.exists(value) \
            or unless(value):
        return value
    return os.path.abspath(value)


def absolute_paths(config: dict) -> None:
    """Make the path-valued keys absolute (in place; see :func:`load_config`)."""
    d, m = config["data"], config["model"]
    for key in ("train_files", "validation_files"):
        if isinstance(d[key], list):
            d[key] = [_absolute(p) for p in d[key]]
    d["tokenizer"] = _absolute(d["tokenizer"], unless=lambda name: name == "byte")
    m["name"] = _absolute(m["name"], unless=lambda name: name in _model_presets())
    strategy = config["strategy"]
    if isinstance(strategy, dict) and "target" in strategy:  # dflash's frozen target model
        strategy["target"] = _absolute(strategy["target"])


def explicit_keys(path: str | Path | None = None,
                  overrides: list[str] | None = None) -> list[str]:
    """Dotted keys the YAML file and the overrides set (leaves; an empty mapping is a leaf).

    A resumed run takes these from the new config and everything else from its checkpoint."""
    return sorted({key for _, layer in _layers(path, overrides) for key in flatten(layer)})


def flatten(config: dict, prefix: str = "") -> dict[str, object]:
    """``{"train.lr": 0.003, ...}``: every leaf of a nested config under its dotted key."""
    out: dict[str, object] = {}
    for key, value in config.items():
        where = f"{prefix}.{key}" if prefix else str(key)
        if isinstance(value, dict) and value:
            out.update(flatten(value, where))
        else:
            out[where] = value
    return out


def set_key(config: dict, dotted: str, value) -> None:
    """``config[a][b] = value`` for ``dotted = "a.b"`` (missing mappings are created)."""
    *parents, last = dotted.split(".")
    for key in parents:
        if not isinstance(config.get(key), dict):
            config[key] = {}
        config = config[key]
    config[last] = copy.deepcopy(value)


def get_key(config: dict, dotted: str, default=None):
    for key in dotted.split("."):
        if not isinstance(config, dict) or key not in config:
            return default
        config = config[key]
    return config


# Keys whose default would change what a config written before they existed meant: such a
# config gets the value it was run with instead. ``train.ema_decay``'s default (null = the
# family's default_ema_decay) would turn a weight average on for a run trained without one.
BEFORE_THEY_EXISTED: dict = {"train": {"ema_decay": 0.0}}


def with_defaults(config: dict) -> dict:
    """``config`` merged onto the defaults: keys added to dlmkit since it was written get their
    default values, or the value they stand for in such a config (:data:`BEFORE_THEY_EXISTED`);
    unknown keys are errors, as in a config file."""
    return _merge(_merge(DEFAULTS, BEFORE_THEY_EXISTED), config)


def dump_yaml(config: dict) -> str:
    return yaml.safe_dump(config, sort_keys=False)


def load_yaml(text: str):
    """Read YAML the way config files are read (YAML 1.2 floats)."""
    return _yaml(text)


def validate(config: dict) -> dict:
    def need(cond: bool, message: str) -> None:
        if not cond:
            raise ConfigError(message)

    def number(value) -> bool:
        return isinstance(value, (int, float)) and not isinstance(value, bool)

    def positive_int(value) -> bool:
        return isinstance(value, int) and not isinstance(value, bool) and value >= 1

    t, d, m = config["train"], config["data"], config["model"]
    if t["micro_batch_size"] is not None:
        value = t["micro_batch_size"]
        need(isinstance(value, int) and not isinstance(value, bool) and value >= 1,
             f"train.micro_batch_size must be a positive int or null, got {value!r}")
    from .best import FINAL_MODELS

    need(t["final_model"] in FINAL_MODELS,
         f"train.final_model must be one of {', '.join(FINAL_MODELS)}, got {t['final_model']!r}")
    need(number(d["split_tokens"]) and 0 <= d["split_tokens"] <= 1,
         f"data.split_tokens must be a number in [0, 1] (0 = off), got {d['split_tokens']!r}")
    need(isinstance(d["split_responses"], bool),
         f"data.split_responses must be true or false, got {d['split_responses']!r}")
    need(not d["split_responses"] or d["split_tokens"],
         "data.split_responses: true does nothing while data.split_tokens is 0; set "
         "data.split_tokens to the share of tokens to split")
    need(t["steps"] is None or positive_int(t["steps"]),
         f"train.steps must be a positive int, got {t['steps']!r} (or null: the strategy's "
         "default_steps, or train.epochs when set)")
    need(isinstance(t["early_stopping_patience"], int)
         and not isinstance(t["early_stopping_patience"], bool)
         and t["early_stopping_patience"] >= 0,
         f"train.early_stopping_patience must be an int >= 0 (0 = off), got "
         f"{t['early_stopping_patience']!r}")
    need(number(t["early_stopping_min_delta"]) and t["early_stopping_min_delta"] >= 0,
         f"train.early_stopping_min_delta must be a number >= 0, got "
         f"{t['early_stopping_min_delta']!r}")
    need(t["epochs"] is None or (number(t["epochs"]) and t["epochs"] > 0),
         f"train.epochs must be a number > 0 or null, got {t['epochs']!r}")
    for key in ("global_batch_size", "log_every", "val_every",
                "save_every"):
        need(positive_int(t[key]), f"train.{key} must be a positive int, got {t[key]!r}")
    need(t["lr"] is None or (number(t["lr"]) and t["lr"] > 0),
         f"train.lr must be > 0 (or null: the strategy's default), got {t['lr']!r}")
    need(t["warmup_steps"] is None
         or (isinstance(t["warmup_steps"], int) and not isinstance(t["warmup_steps"], bool)
             and t["warmup_steps"] >= 0),
         f"train.warmup_steps must be an int >= 0 or null (10% of the steps), "
         f"got {t['warmup_steps']!r}")
    need(number(t["min_lr_ratio"]) and 0 <= t["min_lr_ratio"] <= 1,
         f"train.min_lr_ratio must be a number in [0, 1], got {t['min_lr_ratio']!r}")
    need(t["weight_decay"] is None or (number(t["weight_decay"]) and t["weight_decay"] >= 0),
         f"train.weight_decay must be a number >= 0 or null (the regime's default), "
         f"got {t['weight_decay']!r}")
    from .regime import REGIMES

    need(t["regime"] in REGIMES,
         f"train.regime must be one of {', '.join(REGIMES)}, got {t['regime']!r}")
    need(isinstance(t["betas"], (list, tuple)) and len(t["betas"]) == 2
         and all(number(b) and 0 <= b < 1 for b in t["betas"]),
         f"train.betas must be two numbers in [0, 1), got {t['betas']!r}")
    need(t["autocast"] in ("auto", "bf16", "none"),
         f"train.autocast must be auto, bf16 or none, got {t['autocast']!r}")
    need(t["distributed"] in ("ddp", "fsdp2"),
         f"train.distributed must be ddp or fsdp2, got {t['distributed']!r}")
    need(t["ema_decay"] is None or (number(t["ema_decay"]) and 0 <= t["ema_decay"] < 1),
         f"train.ema_decay must be a number in [0, 1) (0 = no weight average) or null (the "
         f"family's default), got {t['ema_decay']!r}")
    need(t["max_grad_norm"] is None or (number(t["max_grad_norm"]) and t["max_grad_norm"] > 0),
         f"train.max_grad_norm must be > 0 or null, got {t['max_grad_norm']!r}")
    need(t["loss_chunk_size"] is None or positive_int(t["loss_chunk_size"]),
         f"train.loss_chunk_size must be a positive int or null, got {t['loss_chunk_size']!r}")
    need(t["threads"] is None or positive_int(t["threads"]),
         f"train.threads must be a positive int or null, got {t['threads']!r}")
    need(isinstance(t["tensorboard"], bool),
         f"train.tensorboard must be true or false, got {t['tensorboard']!r}")
    need(not t["tensorboard"] or importlib.util.find_spec("tensorboard") is not None,
         "train.tensorboard: true needs the tensorboard package, which is not installed: "
         "pip install tensorboard (or set train.tensorboard=false)")
    need(isinstance(config["seed"], int) and not isinstance(config["seed"], bool)
         and config["seed"] >= 0, f"seed must be an int >= 0, got {config['seed']!r}")
    need(isinstance(d["train_files"], list) and isinstance(d["validation_files"], list),
         "data.train_files and data.validation_files must be lists of paths, got "
         f"{d['train_files']!r} and {d['validation_files']!r}")
    from dlmkit.data.records import check_fields

    try:
        check_fields(d["fields"], "data.fields")
    except ValueError as err:
        raise ConfigError(str(err)) from None
    need(d["task"] is not None or d["train_files"],
         "data: give a bundled data.task or data.train_files")
    if d["train_files"]:  # the files are trained on (recipe.build_datasets), not the task
        d["task"] = None
    for key in ("num_train", "num_validation", "max_seq_len"):
        need(positive_int(d[key]), f"data.{key} must be a positive int, got {d[key]!r}")
    need(isinstance(config["strategy"], dict) and "name" in config["strategy"],
         "strategy.name is required")
    need(m["name"] is None or isinstance(m["name"], str),
         f"model.name must be a string (a preset or a model directory) or null, "
         f"got {m['name']!r}")
    need(d["supervise_padding"] is None or isinstance(d["supervise_padding"], bool),
         f"data.supervise_padding must be true, false or null, got {d['supervise_padding']!r}")
    need(d["truncation"] in TRUNCATION_POLICIES,
         f"data.truncation must be one of {', '.join(TRUNCATION_POLICIES)}, "
         f"got {d['truncation']!r}")
    need(m["dtype"] is None or m["dtype"] in ("float32", "bfloat16"),
         f"model.dtype must be float32, bfloat16 or null (the checkpoint's own), "
         f"got {m['dtype']!r}")
    need(t["master_dtype"] in ("float32", "bfloat16"),
         f"train.master_dtype must be float32 or bfloat16, got {t['master_dtype']!r}")
    need(isinstance(m["gradient_checkpointing"], bool),
         f"model.gradient_checkpointing must be true or false, got {m['gradient_checkpointing']!r}")
    if m["lora"] is not None:
        from dlmkit.models.lora import lora_options

        try:
            m["lora"] = lora_options(m["lora"])
        except ValueError as err:
            raise ConfigError(str(err)) from None
    return config
