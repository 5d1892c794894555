"""A config means what it says: no key, value or file is dropped or reinterpreted silently.

Before: a repeated YAML key kept the last value (``train: {steps: 5, lr: 0.001, steps: 50000}``
trained 50000 steps; a second ``train:`` section dropped the first one's keys); ``--set
train.steps=`` became null; ``--set train.steps=100 --set train.epochs=3`` let epochs win;
data files without ``data.task=null`` named the run after the bundled task; a config path
that is a directory was said not to exist; config.yaml recorded data files as written, so a
``--resume`` from another directory read other files.
"""

from __future__ import annotations

import os

import pytest

from dlmkit.cli import main
from dlmkit.train.config import ConfigError, load_config
from dlmkit.train.recipe import default_run_dir


def write(path, text):
    path.write_text(text)
    return path


def test_a_key_given_twice_in_a_file_names_the_key_the_file_and_both_lines(tmp_path):
    twice = write(tmp_path / "twice.yaml", "train:\n  steps: 5\n  lr: 0.001\n  steps: 50000\n")
    with pytest.raises(ConfigError) as err:
        load_config(twice)
    assert str(err.value) == (f"{twice}: key 'train.steps' is given twice, on line 2 and "
                              "line 4 (YAML would keep only the last); keep one")
    sections = write(tmp_path / "sections.yaml",
                     "train:\n  steps: 5\nmodel:\n  dtype: float32\ntrain:\n  lr: 0.001\n")
    with pytest.raises(ConfigError, match=r"key 'train' is given twice, on line 1 and line 5"):
        load_config(sections)


def test_a_key_given_twice_in_a_set_value_is_an_error():
    with pytest.raises(ConfigError, match=r"--set 'train=\{steps: 5, steps: 6\}': key "
                                          r"'train.steps' is given twice"):
        load_config(None, ["train={steps: 5, steps: 6}"])


def test_the_same_key_in_the_file_and_in_set_is_an_override_not_a_duplicate(tmp_path):
    path = write(tmp_path / "c.yaml", "train: {lr: 0.001}\n")
    assert load_config(path, ["train.lr=0.002"])["train"]["lr"] == 0.002


def test_an_empty_set_value_is_an_error_that_suggests_null(capsys):
    with pytest.raises(ConfigError) as err:
        load_config(None, ["train.steps="])
    assert str(err.value) == ("--set 'train.steps=' has no value after '='; give one, or write "
                              "--set train.steps=null for the default")
    assert load_config(None, ["train.steps=null"])["train"]["steps"] is None


def test_steps_and_epochs_in_one_place_are_an_error_naming_both(tmp_path):
    with pytest.raises(ConfigError, match=r"train.steps and train.epochs are both set in the "
                                          r"--set options \(steps=100, epochs=3\)"):
        load_config(None, ["train.steps=100", "train.epochs=3"])
    with pytest.raises(ConfigError, match="both set in the --set options"):
        load_config(None, ["train={steps: 100}", "train.lr=0.001", "train.epochs=3"])
    both = write(tmp_path / "both.yaml", "train: {steps: 100, epochs: 3}\n")
    with pytest.raises(ConfigError, match=f"both set in {both}"):
        load_config(both)
    # one in the file, the other on the command line: the later one decides (the README)
    steps = write(tmp_path / "steps.yaml", "train: {steps: 100}\n")
    train = load_config(steps, ["train.epochs=3"])["train"]
    assert (train["steps"], train["epochs"]) == (None, 3)
    # setting one back to null on the command line leaves the other alone
    train = load_config(None, ["train.steps=100", "train.steps=null", "train.epochs=3"])["train"]
    assert (train["steps"], train["epochs"]) == (None, 3)


def test_a_config_path_that_is_a_directory_says_so(tmp_path):
    with pytest.raises(SystemExit, match=f"config file {tmp_path} is a directory; give a YAML "
                                         "file"):
        main(["train", str(tmp_path)])


def test_data_files_decide_the_run_name_and_an_explicit_task_is_reported(tmp_path, capsys,
                                                                         monkeypatch):
    data = write(tmp_path / "train.jsonl", '{"prompt": "ab", "response": "ba"}\n')
    config = load_config(None, [f"data.train_files=[{data}]"])
    assert config["data"]["task"] is None  # config.yaml says what is trained
    assert default_run_dir(config).name.startswith("bd3lm-files-")
    notes: list[str] = []
    load_config(None, [f"data.train_files=[{data}]", "data.task=copy"], notes)
    assert notes == ["note: data.task='copy' (from the --set options) is not used: "
                     "data.train_files is set, so the run trains on those files"]
    monkeypatch.chdir(tmp_path)
    assert main(["train", "--set", "data.train_files=[train.jsonl]", "--set", "data.task=copy",
                 "--print-config"]) == 0
    assert "note: data.task='copy' (from the --set options) is not used" in \
        capsys.readouterr().err


def test_relative_paths_that_exist_are_recorded_absolute(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    write(tmp_path / "train.jsonl", '{"prompt": "ab", "response": "ba"}\n')
    write(tmp_path / "val.jsonl", '{"prompt": "ab", "response": "ba"}\n')
    (tmp_path / "models" / "mine").mkdir(parents=True)
    (tmp_path / "tiny-llama").mkdir()  # a directory named like a preset: the preset wins
    (tmp_path / "byte").mkdir()  # likewise the byte tokenizer
    config = load_config(None, ["data.train_files=[train.jsonl]",
                                "data.validation_files=[val.jsonl, missing.jsonl]",
                                "model.name=models/mine"])
    d = config["data"]
    assert d["train_files"] == [str(tmp_path / "train.jsonl")]
    # a missing file is left as written: the data loader names it as the user wrote it
    assert d["validation_files"] == [str(tmp_path / "val.jsonl"), "missing.jsonl"]
    assert config["model"]["name"] == str(tmp_path / "models" / "mine")
    assert d["tokenizer"] == "byte"
    assert load_config(None, ["model.name=tiny-llama"])["model"]["name"] == "tiny-llama"
    assert load_config(None, ["strategy.name=dflash", "strategy.target=models/mine"]
                       )["strategy"]["target"] == os.path.join(tmp_path, "models", "mine")


def test_tensorboard_key_is_checked(monkeypatch):
    with pytest.raises(ConfigError, match="train.tensorboard must be true or false, got 'yes'"):
        load_config(None, ["train.tensorboard='yes'"])
    import importlib.util

    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec",
                        lambda name, *a: None if name == "tensorboard" else real(name, *a))
    with pytest.raises(ConfigError, match=r"train.tensorboard: true needs the tensorboard "
                                          r"package, which is not installed: pip install "
                                          r"tensorboard \(or set train.tensorboard=false\)"):
        load_config(None, ["train.tensorboard=true"])
