"""The typed run config: types from the annotations, errors that name the key, the value and
where it came from, and config.yaml written exactly as before.

Before: a key whose type nothing checked (``data.pack``, ``model.attention``, ``data.task``,
``output_dir``) reached the data or the model as given; a bad value did not say which file or
``--set`` gave it; an unknown key listed the valid ones without naming the likely one.
"""

from __future__ import annotations

import pytest

from dlmkit.cli import main
from dlmkit.train.config import ConfigError, load_config, load_yaml

from .helpers import cli_args

# A tiny mdlm run's config.yaml as dlmkit wrote it before the config was typed (the helpers'
# config with train.steps=2): what a run written then holds.
OLD_CONFIG_YAML = """\
seed: 0
output_dir: /tmp/h2/old_run
data:
  task: reverse
  task_options: {}
  train_files: []
  fields: {}
  validation_files: []
  num_train: 64
  num_validation: 16
  tokenizer: byte
  allow_eos_as_pad: false
  block_align: true
  pad_seq_len_divisible: null
  max_seq_len: 128
  supervise_padding: null
  pack: false
  split_tokens: 0.0
  split_responses: false
  truncation: error
model:
  name: tiny-llama
  attention: auto
  dtype: float32
  config:
    hidden_size: 64
    intermediate_size: 128
    num_hidden_layers: 2
    num_attention_heads: 4
    num_key_value_heads: 4
  gradient_checkpointing: false
  lora: null
strategy:
  name: mdlm
  t_min: 0.2
  t_max: 1.0
  time_sampling: stratified
  logit_shift: false
train:
  steps: 2
  final_model: best
  regime: scratch
  early_stopping_patience: 5
  early_stopping_min_delta: 0.001
  epochs: null
  global_batch_size: 8
  micro_batch_size: 8
  lr: 0.001
  min_lr_ratio: 0.1
  warmup_steps: 2
  weight_decay: 0.5
  betas:
  - 0.9
  - 0.98
  max_grad_norm: 1.0
  ema_decay: 0.0
  autocast: auto
  master_dtype: float32
  loss_chunk_size: null
  distributed: ddp
  device: auto
  log_every: 1
  val_every: 1000
  save_every: 1000
  threads: 1
  progress: false
  tensorboard: false
"""


def _without_strategy(text: str) -> str:
    """config.yaml without its strategy section (a family's options may change)."""
    head, rest = text.split("strategy:\n", 1)
    return head + rest[rest.index("train:\n"):]


def error(*overrides: str, path=None) -> str:
    with pytest.raises(ConfigError) as info:
        load_config(path, list(overrides))
    return str(info.value)


def test_an_old_config_yaml_loads_and_is_written_back_byte_for_byte():
    from dlmkit.train.config import RunConfig, dump_yaml

    config = RunConfig.from_dict(load_yaml(OLD_CONFIG_YAML))
    assert config.train.lr == 0.001 and config.model.config["hidden_size"] == 64
    assert dump_yaml(config) == OLD_CONFIG_YAML


def test_a_run_writes_config_yaml_as_before(tmp_path):
    run_dir = tmp_path / "run"
    main(cli_args(run_dir, "train.steps=2"))
    written = (run_dir / "config.yaml").read_text()
    expected = OLD_CONFIG_YAML.replace("/tmp/h2/old_run", str(run_dir))
    assert _without_strategy(written) == _without_strategy(expected)


@pytest.mark.parametrize(("item", "message"), [
    ("data.pack=1", "data.pack must be true or false, got 1"),
    ("model.attention=flex", "model.attention must be one of auto, sdpa, flex_attention, "
                             "eager, got 'flex'"),
    ("data.task=3", "data.task must be a string or null, got 3"),
    ("output_dir=5", "output_dir must be a string or null, got 5"),
    ("data.allow_eos_as_pad=sure", "data.allow_eos_as_pad must be true or false, got 'sure'"),
    ("train.steps=true", "train.steps must be a positive int, got True (or null: the "
                         "strategy's default_steps, or train.epochs when set)"),
    ("data.pad_seq_len_divisible=0", "data.pad_seq_len_divisible must be a positive int or "
                                     "null, got 0"),
    ("train.betas=[0.9]", "train.betas must be two numbers in [0, 1), got [0.9]"),
    ("data.train_files=a.jsonl", "data.train_files must be a list of paths, got 'a.jsonl'"),
])
def test_every_key_is_checked_against_its_type_and_names_the_set_that_gave_it(item, message):
    assert error(item) == f"--set {item}: {message}"


def test_a_bad_value_names_the_file_that_gave_it(tmp_path):
    path = tmp_path / "c.yaml"
    path.write_text("train:\n  lr: abc\n")
    assert error("train.steps=3", path=path) == (
        f"{path}: train.lr must be > 0 (or null: the strategy's default), got 'abc'")
    # the last place that sets the key is the one named
    assert error("train.lr=-1", path=path).startswith("--set train.lr=-1: train.lr must be > 0")


def test_an_unknown_key_suggests_the_likely_one_and_names_its_source(tmp_path):
    path = tmp_path / "c.yaml"
    path.write_text("train:\n  stpes: 3\n")
    message = error(path=path)
    assert message.startswith(f"{path}: unknown config key 'train.stpes' (did you mean "
                              "'train.steps'?); valid keys under train: ")
    assert error("model.lora_r=8").startswith("--set model.lora_r=8: unknown config key "
                                              "'model.lora_r' (did you mean 'model.lora'?)")


def test_the_typed_config_reads_as_attributes_and_as_the_mapping_it_replaces():
    from dlmkit.train.config import DEFAULTS, RunConfig

    config = load_config(None, ["train.lr=0.002"])
    assert isinstance(config, RunConfig)
    assert config.train.lr == config["train"]["lr"] == 0.002
    config["train"]["steps"] = 7
    assert config.train.steps == 7 and "steps" in config["train"]
    with pytest.raises(KeyError):
        config["train"]["stpes"]
    assert dict(config["train"]) == config.to_dict()["train"]
    assert RunConfig().to_dict() == DEFAULTS
    assert RunConfig.from_dict(config.to_dict()) == config


def test_from_dict_fills_missing_keys_and_checks_the_rest():
    from dlmkit.train.config import RunConfig

    config = RunConfig.from_dict({"train": {"steps": 3}, "strategy": {"name": "mdlm"}})
    assert config.train.steps == 3 and config.train.global_batch_size == 64
    with pytest.raises(ConfigError, match=r"unknown config key 'train.stpes' \(did you mean"):
        RunConfig.from_dict({"train": {"stpes": 3}})
    with pytest.raises(ConfigError, match="train.log_every must be a positive int, got 0"):
        RunConfig.from_dict({"train": {"log_every": 0}})


def test_every_field_has_help_and_print_config_shows_it(capsys):
    import dataclasses

    from dlmkit.train.config import DataConfig, ModelConfig, RunConfig, TrainConfig

    for cls in (RunConfig, DataConfig, ModelConfig, TrainConfig):
        for f in dataclasses.fields(cls):
            assert f.metadata.get("help"), f"{cls.__name__}.{f.name} has no help"
    main(["train", "--print-config", "--set", "train.lr=0.002"])
    out = capsys.readouterr().out
    assert "  # peak learning rate; null = the regime's default" in out
    assert "  lr: 0.002\n" in out
    shown = load_yaml(out)
    assert shown["train"]["lr"] == 0.002 and shown["strategy"]["name"] == "bd3lm"
    # every family's training options with their help, from the option dataclasses
    from dlmkit import families

    for name in families.names():
        assert f"#   strategy.<option> of {name}" in out
    assert "#     eps = 0.001  (a number in (0.0, 1.0))" in out  # block_diffusion's


def test_the_recipe_takes_a_run_config_not_a_mapping():
    import torch

    from dlmkit.train.distributed import World
    from dlmkit.train.recipe import build_components

    with pytest.raises(TypeError, match=r"build_components: config must be a RunConfig "
                                        r"\(dlmkit.train.load_config, or RunConfig.from_dict "
                                        r"for a mapping\), got dict"):
        build_components(load_config().to_dict(), World(0, 1, 0, torch.device("cpu")))
