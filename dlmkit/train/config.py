"""Training configuration: typed sections loaded from YAML + ``--set key.sub=value``.

The run config is :class:`RunConfig` (``seed``, ``output_dir`` and the ``data``, ``model``,
``strategy`` and ``train`` sections); every field carries its default and a help text
(``dlmkit train --print-config`` shows them), and its type and range are checked when a config
is loaded (:meth:`RunConfig.from_dict`). ``strategy`` is the family's own mapping of options,
checked by the family. Unknown keys are errors that list the valid ones.

The embedded default (no config file) trains a tiny Llama with BD3-LM block diffusion on the
bundled ``reverse`` task on the CPU in a few minutes (early stopping ends it once the task is
learned).
"""

from __future__ import annotations

import copy
import dataclasses
import difflib
import importlib.util
import os
import re
import textwrap
import types
import typing
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import yaml


def _default_family() -> str:
    from dlmkit import families

    return families.DEFAULT

Regime = Literal["auto", "scratch", "finetune"]
FinalModel = Literal["best", "last"]
TruncationPolicy = Literal["error", "drop", "truncate"]


class ConfigError(ValueError):
    """A config that cannot be trained: the message names the key, the value and what is
    allowed; ``key``, when one dotted key is at fault, is that key."""

    def __init__(self, message: str, key: str | None = None) -> None:
        super().__init__(message)
        self.key = key


def option(default, help: str, *, expect: str | None = None,
           check: Callable[[Any], bool] | None = None, hint: str | None = None):
    """A config field: its default, its ``help`` text, and how it is checked.

    The type comes from the field's annotation. ``check``: a range test run on a value of the
    right type (None passes it: null's meaning is the annotation's). ``expect``: what the
    error says the value must be, when the annotation's own words (:func:`_describe`) do not
    say it; ``hint``: said after the bad value."""
    metadata = {"help": help, "expect": expect, "check": check, "hint": hint}
    if isinstance(default, (dict, list)):
        return field(default_factory=lambda: copy.deepcopy(default), metadata=metadata)
    return field(default=default, metadata=metadata)


def _positive(value) -> bool:
    return value >= 1


def _at_least_zero(value) -> bool:
    return value >= 0


class _Section(Mapping):
    """Mapping-style access (``config["train"]["lr"]``, ``dict(config.train)``) for scripts
    written against the nested dict config; dlmkit itself reads attributes. The keys are the
    field names."""

    def __getitem__(self, key: str):
        if key not in _names(type(self)):
            raise KeyError(key)
        return getattr(self, key)

    def __setitem__(self, key: str, value) -> None:
        if key not in _names(type(self)):
            raise KeyError(key)
        setattr(self, key, value)

    def __iter__(self):
        return iter(_names(type(self)))

    def __len__(self) -> int:
        return len(_names(type(self)))


def _names(cls) -> tuple[str, ...]:
    return tuple(f.name for f in dataclasses.fields(cls))


@dataclass
class DataConfig(_Section):
    task: str | None = option(
        "reverse", "a bundled task (dlmkit.data.tasks), or null with train_files")
    task_options: dict = option({}, "the bundled task's parameters (e.g. max_len)")
    train_files: list[str] = option(
        [], "JSONL / JSON / Parquet / CSV files or saved Hugging Face datasets; when given "
            "the run trains on them, not on the bundled task", expect="a list of paths")
    fields: dict = option({}, "format field -> your name, e.g. {prompt: question}")
    validation_files: list[str] = option([], "files of validation records (same formats)",
                                         expect="a list of paths")
    num_train: int = option(20000, "samples drawn from the bundled task",
                            expect="a positive int", check=_positive)
    num_validation: int = option(256, "validation samples drawn from the bundled task",
                                 expect="a positive int", check=_positive)
    tokenizer: str = option("byte", '"byte" or a local Hugging Face tokenizer directory')
    allow_eos_as_pad: bool = option(
        False, "pad with the EOS token when the tokenizer has no pad token (else an error)")
    block_align: bool = option(
        True, "pad each sample to a multiple of the strategy's block size")
    pad_seq_len_divisible: int | None = option(
        None, "round every batch's row length up to a multiple of this",
        expect="a positive int or null", check=_positive)
    max_seq_len: int = option(128, "the longest row, in tokens (see truncation)",
                              expect="a positive int", check=_positive)
    supervise_padding: bool | None = option(
        None, "score the padding after a sample (null = the strategy's choice: true for "
              "mdlm/scdd, false otherwise)")
    pack: bool = option(False, "pack several records into one row (the strategies that "
                               "support packing)")
    split_tokens: float = option(
        0.0, "split this share of the training prompts' tokens into two vocabulary pieces "
             "that spell them (recursively; BPE only; see dlmkit.data.split_tokens): shows a "
             "BPE model the spelling of its pieces. 0 = the tokenizer's own segmentation",
        expect="a number in [0, 1] (0 = off)", check=lambda v: 0 <= v <= 1)
    split_responses: bool = option(
        False, "split the supervised tokens too (else the prompt's only)")
    truncation: TruncationPolicy = option(
        "error", "a record longer than max_seq_len is cut (block_diffusion keeps a response's "
                 "whole blocks under the cap only). error: a record left with no supervised "
                 "token is an error; drop: every record the cap cuts is left out; truncate: "
                 "every record is cut and kept (see dlmkit.train.truncation). Counts are "
                 "reported either way")


@dataclass
class ModelConfig(_Section):
    name: str | None = option(
        None, "preset name or local model directory (null = the strategy's own preset: "
              "tiny-llama for the causal-LM families)",
        expect="a string (a preset or a model directory) or null")
    attention: Literal["auto", "sdpa", "flex_attention", "eager"] = option(
        "auto", "the attention backend (auto: FlexAttention on CUDA, SDPA on the CPU)")
    dtype: Literal["float32", "bfloat16"] | None = option(
        None, "frozen weights (LoRA's base) and the export; null = the checkpoint's own "
              "(float32 for a preset). Trained weights are train.master_dtype "
              "(dlmkit.train.precision)",
        expect="float32, bfloat16 or null (the checkpoint's own)")
    config: dict = option({}, "preset overrides (e.g. num_hidden_layers)")
    gradient_checkpointing: bool = option(
        False, "recompute layer activations in the backward")
    lora: dict | None = option(
        None, "{r, alpha, dropout, target_modules, export} (see dlmkit.models.lora)",
        expect="a mapping {r, alpha, dropout, target_modules, export} or null")


@dataclass
class TrainConfig(_Section):
    steps: int | None = option(
        None, "null (and no epochs) = the strategy's default_steps, what the user-like suite "
              "tests/suite needs (the bundled task needs only 400: `make demo`). Every "
              "family's training defaults: the end of `dlmkit train --print-config`; the "
              "measurements behind them: docs/families/<family>.md#why-these-defaults. "
              "Written into config.yaml",
        expect="a positive int", check=_positive,
        hint="or null: the strategy's default_steps, or train.epochs when set")
    final_model: FinalModel = option(
        "best", "RUN/final: best (lowest validation loss) or last step")
    regime: Regime = option(
        "auto", "auto: fine-tune when model.name is a model directory with weights, else train "
                "from scratch; each regime fills the unset keys its own way "
                "(dlmkit.train.regime)")
    early_stopping_patience: int = option(
        5, "with validation data, stop after this many validations in a row that do not "
           "lower the best validation loss by early_stopping_min_delta; steps/epochs are then "
           "the most the run trains (dlmkit.train.early_stopping). 0 = train the whole budget",
        expect="an int >= 0 (0 = off)", check=_at_least_zero)
    early_stopping_min_delta: float = option(
        0.001, "the least drop of the validation loss (nats/token) that counts as better",
        expect="a number >= 0", check=_at_least_zero)
    epochs: float | None = option(
        None, "passes over the training records; when set it decides the step count instead "
              "of steps (see dlmkit.train.budget)",
        expect="a number > 0 or null", check=lambda v: v > 0)
    global_batch_size: int = option(64, "samples per optimizer step, over all ranks",
                                    expect="a positive int", check=_positive)
    micro_batch_size: int | None = option(
        None, "rows per forward on each rank (null = the rank's whole share); accumulation "
              "= global / (micro * world)",
        expect="a positive int or null", check=_positive)
    lr: float | None = option(
        None, "peak learning rate; null = the regime's default (the strategy's default_lr "
              "from scratch), written into config.yaml",
        expect="> 0 (or null: the strategy's default)", check=lambda v: v > 0)
    min_lr_ratio: float = option(
        0.1, "the cosine schedule ends at min_lr_ratio * lr",
        expect="a number in [0, 1]", check=lambda v: 0 <= v <= 1)
    warmup_steps: int | None = option(
        None, "linear warmup; null = 10% of the resolved steps, or the family's "
              "default_warmup_steps (dlmkit.train.budget); written into config.yaml",
        expect="an int >= 0 or null (10% of the steps)", check=_at_least_zero)
    weight_decay: float | None = option(
        None, "AdamW's, on matrices only (not norms or biases); null = the regime's default "
              "(dlmkit.train.regime)",
        expect="a number >= 0 or null (the regime's default)", check=_at_least_zero)
    betas: list[float] = option([0.9, 0.98], "AdamW's betas",
                                expect="two numbers in [0, 1)",
                                check=lambda v: len(v) == 2 and all(0 <= b < 1 for b in v))
    max_grad_norm: float | None = option(
        1.0, "clip the gradient's global norm to this (null = no clipping)",
        expect="> 0 or null", check=lambda v: v > 0)
    ema_decay: float | None = option(
        None, "> 0: validation, best/, last/ and final/ use an exponential moving average of "
              "the weights (dlmkit.train.ema); it spans ~1/(1 - decay) steps, e.g. 0.999 for "
              "a few thousand steps. 0 = none; null = the strategy's default_ema_decay, "
              "written into config.yaml",
        expect="a number in [0, 1) (0 = no weight average) or null (the family's default)",
        check=lambda v: 0 <= v < 1)
    autocast: Literal["auto", "bf16", "none"] = option(
        "auto", "the compute dtype of every forward: auto (bf16 on CUDA or with model.dtype "
                "bfloat16, else off), bf16 or none", expect="auto, bf16 or none")
    master_dtype: Literal["float32", "bfloat16"] = option(
        "float32", "trainable weights, optimizer state; bfloat16 = pure-bf16 opt-in that "
                   "loses small updates (warned)", expect="float32 or bfloat16")
    loss_chunk_size: int | None = option(
        None, "compute the logits and the loss this many tokens at a time, so the full "
              "[tokens, vocabulary] logits never exist (dlmkit.diffusion.chunked; null = "
              "all at once)",
        expect="a positive int or null", check=_positive)
    distributed: Literal["ddp", "fsdp2"] = option(
        "ddp", "ddp or fsdp2 (used under torchrun with world size > 1)",
        expect="ddp or fsdp2")
    device: str = option("auto", "auto (CUDA when present, else the CPU), cpu, cuda or cuda:N")
    log_every: int = option(10, "write the training metrics every this many steps",
                            expect="a positive int", check=_positive)
    val_every: int = option(100, "validate every this many steps",
                            expect="a positive int", check=_positive)
    save_every: int = option(100, "save a checkpoint every this many steps",
                             expect="a positive int", check=_positive)
    threads: int | None = option(None, "torch intra-op threads (null = torch's default)",
                                 expect="a positive int or null", check=_positive)
    progress: bool = option(True, "show a progress bar (plain lines in a log file)")
    tensorboard: bool = option(
        False, "also write the metrics as TensorBoard events in RUN/tensorboard/ (needs the "
               "tensorboard package)")


@dataclass
class RunConfig(_Section):
    """One training run's configuration (see :func:`load_config`).

    ``strategy`` holds the family's ``name`` and its own options, checked by the family
    (``dlmkit train --print-config`` lists every family's). Build one from a mapping with
    :meth:`from_dict` (which checks it); :meth:`to_dict` gives the nested mapping that
    ``config.yaml`` records."""

    seed: int = option(0, "seeds the model's initialisation, the data draws and every noise "
                          "generator", expect="an int >= 0", check=_at_least_zero)
    output_dir: str | None = option(None, "the run directory (null = "
                                          "runs/<strategy>-<task>-<timestamp>)")
    data: DataConfig = field(default_factory=DataConfig, metadata={"help": "the data trained on"})
    model: ModelConfig = field(default_factory=ModelConfig,
                               metadata={"help": "the model trained"})
    # The registry names the embedded default's family (why that one:
    # docs/families/<name>.md#why-these-defaults).
    strategy: dict = field(default_factory=lambda: {"name": _default_family()}, metadata={
        "help": "the family (name) and its own options (dlmkit.families)"})
    train: TrainConfig = field(default_factory=TrainConfig,
                               metadata={"help": "the optimisation and the run's bookkeeping"})

    def to_dict(self) -> dict:
        """The nested mapping (a deep copy), keys in declaration order: what config.yaml
        records."""
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, config: dict) -> RunConfig:
        """A checked RunConfig from a nested mapping: keys it does not give take their
        defaults; an unknown key, a value of the wrong type or out of range is a
        :class:`ConfigError` naming the dotted key, the value and what is allowed."""
        merged = _merge(DEFAULTS, config)
        built = _build(cls, merged, "")
        built._check_together()
        return built

    def _check_together(self) -> None:
        """What no single field's type says: the keys that depend on one another, the
        strategy section, the data fields and LoRA options (in place: ``data.task`` is
        cleared when files are trained on, ``model.lora`` completed)."""
        d, m = self.data, self.model
        if d.split_responses and not d.split_tokens:
            raise ConfigError("data.split_responses: true does nothing while data.split_tokens "
                              "is 0; set data.split_tokens to the share of tokens to split",
                              key="data.split_responses")
        from dlmkit.data.records import check_fields

        try:
            check_fields(d.fields, "data.fields")
        except ValueError as err:
            raise ConfigError(str(err), key="data.fields") from None
        if d.task is None and not d.train_files:
            raise ConfigError("data: give a bundled data.task or data.train_files")
        if d.train_files:  # the files are trained on (recipe.build_datasets), not the task
            d.task = None
        if "name" not in self.strategy:
            raise ConfigError("strategy.name is required", key="strategy")
        if m.lora is not None:
            from dlmkit.models.lora import lora_options

            try:
                m.lora = lora_options(m.lora)
            except ValueError as err:
                raise ConfigError(str(err), key="model.lora") from None


def check_packages(config: RunConfig) -> None:
    """The packages the config asks for are installed (before a run starts, not when a
    finished run's config is read)."""
    if config.train.tensorboard and importlib.util.find_spec("tensorboard") is None:
        raise ConfigError("train.tensorboard: true needs the tensorboard package, which is "
                          "not installed: pip install tensorboard (or set "
                          "train.tensorboard=false)", key="train.tensorboard")


def _build(cls, values: dict, prefix: str):
    """``cls`` (a section dataclass) from ``values`` (every key known, as :func:`_merge`
    leaves them), each field checked against its annotation and its ``check``."""
    hints = typing.get_type_hints(cls)
    kwargs = {}
    for f in dataclasses.fields(cls):
        key = f"{prefix}.{f.name}" if prefix else f.name
        value, hint = values[f.name], hints[f.name]
        if dataclasses.is_dataclass(hint):
            kwargs[f.name] = _build(hint, value, key)
            continue
        check = f.metadata.get("check")
        if not _has_type(value, hint) or (value is not None and check and not check(value)):
            expect = f.metadata.get("expect") or _describe(hint)
            hint_text = f" ({f.metadata['hint']})" if f.metadata.get("hint") else ""
            raise ConfigError(f"{key} must be {expect}, got {value!r}{hint_text}", key=key)
        if isinstance(value, tuple):  # a list in YAML: config.yaml cannot hold a tuple
            value = list(value)
        kwargs[f.name] = copy.deepcopy(value)
    return cls(**kwargs)


def _has_type(value, hint) -> bool:
    """Whether ``value`` (as YAML reads it) is of the annotated type: ``bool`` is not an int,
    an int is a float, a list may be a tuple."""
    origin, args = typing.get_origin(hint), typing.get_args(hint)
    if hint is type(None):
        return value is None
    if origin in (typing.Union, types.UnionType):
        return any(_has_type(value, arg) for arg in args)
    if origin is Literal:  # `type is` so that True does not pass for 1
        return any(value == arg and type(value) is type(arg) for arg in args)
    if hint is bool:
        return isinstance(value, bool)
    if hint is int:
        return isinstance(value, int) and not isinstance(value, bool)
    if hint is float:
        return isinstance(value, (int, float)) and not isinstance(value, bool)
    if hint is str:
        return isinstance(value, str)
    if hint is dict or origin is dict:
        return isinstance(value, dict)
    if origin is list:
        return isinstance(value, (list, tuple)) and all(_has_type(v, args[0]) for v in value)
    raise TypeError(f"config annotation {hint!r} has no type check")


def _describe(hint) -> str:
    """What a value of the annotated type is, in an error's words ("an int or null")."""
    origin, args = typing.get_origin(hint), typing.get_args(hint)
    if origin in (typing.Union, types.UnionType):
        rest = [arg for arg in args if arg is not type(None)]
        if rest == [bool]:
            return "true, false or null"
        words = " or ".join(_describe(arg) for arg in rest)
        return f"{words} or null" if len(rest) < len(args) else words
    if origin is Literal:
        return f"one of {', '.join(map(str, args))}"
    if origin is list:
        return f"a list of {_describe(args[0]).split(' ', 1)[1]}s"
    return {bool: "true or false", int: "an int", float: "a number", str: "a string",
            dict: "a mapping"}.get(hint, str(hint))


# The defaults as the nested mapping config files are merged onto (config.yaml's key order).
DEFAULTS: dict = RunConfig().to_dict()


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
            close = [f"{path}.{k}" if path else k
                     for k in difflib.get_close_matches(str(key), [str(k) for k in base], n=1)]
            guess = f" (did you mean {close[0]!r}?)" if close else ""
            raise ConfigError(f"unknown config key {where!r}{guess}; valid keys under "
                              f"{path or 'the top level'}: {', '.join(sorted(base))}",
                              key=where)
        if isinstance(base.get(key), dict):
            if value is None and where in OPEN_KEYS:
                value = {}
            if not isinstance(value, dict):
                raise ConfigError(f"config key {where!r} must be a mapping, got {value!r}",
                                  key=where)
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
                notes: list[str] | None = None) -> RunConfig:
    """The default config, updated by a YAML file and then by ``key.sub=value`` overrides.

    Relative paths that exist (data files, a tokenizer or model directory, a DFlash target)
    are made absolute, so that the run's config.yaml names the same files from any directory.
    An error about a key names the file or the ``--set`` that gave it. ``notes``, when given,
    receives lines about settings that have no effect (see :func:`_unused_task`)."""
    config = copy.deepcopy(DEFAULTS)
    layers = _layers(path, overrides)
    # Each layer's source in an error: the file, or the one --set it comes from.
    sources = ([str(path)] if path is not None else []) + [f"--set {item}"
                                                             for item in overrides or []]
    budget: dict[str, object] = {}
    for i, (where, layer) in enumerate(layers):
        try:
            config = _merge(config, layer)
        except ConfigError as err:
            raise ConfigError(f"{sources[i]}: {err}", key=err.key) from None
        train = layer.get("train") if isinstance(layer.get("train"), dict) else {}
        budget.update({k: train[k] for k in ("steps", "epochs") if k in train})
        if i + 1 == len(layers) or layers[i + 1][0] != where:
            _one_budget(budget, where, config)
            budget = {}
    absolute_paths(config)
    if notes is not None:
        notes.extend(_unused_task(layers, config))
    try:
        built = RunConfig.from_dict(config)
        check_packages(built)
        return built
    except ConfigError as err:
        source = _source_of(err.key, layers, sources)
        if source is None:
            raise
        raise ConfigError(f"{source}: {err}", key=err.key) from None


def _source_of(key: str | None, layers: list[tuple[str, dict]],
               sources: list[str]) -> str | None:
    """The source (:func:`load_config`'s ``sources``) of the last layer that sets ``key`` or a
    key under it; None when no layer does (a default, or an error about no single key)."""
    if key is None:
        return None
    for (_, layer), source in zip(reversed(layers), reversed(sources)):
        if any(k == key or k.startswith(f"{key}.") for k in flatten(layer)):
            return source
    return None


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


def dump_yaml(config: dict | RunConfig) -> str:
    """``config`` (a RunConfig or a nested mapping) as config.yaml writes it."""
    if isinstance(config, RunConfig):
        config = config.to_dict()
    return yaml.safe_dump(config, sort_keys=False)


def commented_yaml(config: RunConfig, width: int = 88) -> str:
    """``config`` as :func:`dump_yaml` writes it, each field under its help text as a YAML
    comment (the same keys and values: it loads as the same config)."""
    lines: list[str] = []

    def section(obj, indent: str) -> None:
        for f in dataclasses.fields(obj):
            value = getattr(obj, f.name)
            for text in textwrap.wrap(f.metadata["help"], width - len(indent) - 2):
                lines.append(f"{indent}# {text}")
            if isinstance(value, _Section):
                lines.append(f"{indent}{f.name}:")
                section(value, indent + "  ")
            else:
                dumped = yaml.safe_dump({f.name: copy.deepcopy(value)}, sort_keys=False)
                lines.extend(indent + line for line in dumped.rstrip("\n").split("\n"))

    section(config, "")
    return "\n".join(lines) + "\n"


def load_yaml(text: str):
    """Read YAML the way config files are read (YAML 1.2 floats)."""
    return _yaml(text)
