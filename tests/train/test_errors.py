"""Bad input: a clear error naming what and where, before any training starts."""

from __future__ import annotations

import pytest

from dlmkit.cli import main

from .helpers import cli_args


def fails(tmp_path, *extra, strategy="mdlm", match):
    run_dir = tmp_path / "run"
    with pytest.raises(SystemExit, match=match):
        main(cli_args(run_dir, "train.steps=2", *extra, strategy=strategy))
    assert not (run_dir / "metrics.jsonl").exists(), "training started"


def test_unknown_key_lists_valid_ones(tmp_path):
    fails(tmp_path, "train.stpes=3", match=r"unknown config key 'train.stpes'.*steps")
    fails(tmp_path, "optim.lr=1", match=r"unknown config key 'optim'.*train")


def test_malformed_values(tmp_path):
    fails(tmp_path, "train.steps=-1", match="train.steps must be a positive int, got -1")
    fails(tmp_path, "train.min_lr_ratio=abc", match="train.min_lr_ratio must be a number")
    fails(tmp_path, "train=3", match="'train' must be a mapping")
    with pytest.raises(SystemExit, match="expects key.sub=value"):
        main(["train", "--set", "train.steps"])


def test_yaml_file_errors(tmp_path):
    bad = tmp_path / "bad.yaml"
    bad.write_text("train: {steps: [\n")
    with pytest.raises(SystemExit, match="bad.yaml: not valid YAML"):
        main(["train", str(bad)])
    with pytest.raises(SystemExit, match="does not exist"):
        main(["train", str(tmp_path / "missing.yaml")])
    good = tmp_path / "good.yaml"
    good.write_text("train: {lr: 3e-3}\nmodel: {config: {hidden_size: 64}}\n")
    main(["train", str(good), "--set", "model.config.num_hidden_layers=1", "--print-config"])


def test_unknown_strategy_and_option(tmp_path):
    fails(tmp_path, strategy="nope", match="unknown strategy 'nope'; valid: mdlm")
    fails(tmp_path, "strategy.blok_size=4", strategy="bd3lm",
          match=r"unknown option\(s\) \['blok_size'\]; valid: .*block_size")


def test_tokenizer_without_pad_token(tmp_path):
    from tests.data.helpers import build_hf_tokenizer

    build_hf_tokenizer(pad=False).save_pretrained(tmp_path / "tok")
    fails(tmp_path, f"data.tokenizer={tmp_path / 'tok'}", match="pad")


def test_empty_dataset_and_malformed_jsonl(tmp_path):
    empty = tmp_path / "empty.jsonl"
    empty.write_text("")
    fails(tmp_path, f"data.train_files=[{empty}]", "data.task=null", match="empty.jsonl.*empty")
    broken = tmp_path / "broken.jsonl"
    broken.write_text('{"prompt": "a", "response": "b"}\n{"prompt": "a", "resp\n')
    fails(tmp_path, f"data.train_files=[{broken}]", "data.task=null",
          match=r"broken.jsonl:2: malformed JSON")


def test_mask_token_outside_vocabulary(tmp_path, monkeypatch):
    from dlmkit.data import ByteTokenizer
    from dlmkit.train import recipe

    class OffByMany(ByteTokenizer):
        def __init__(self):
            super().__init__()
            self.mask_token_id = 10_000

    monkeypatch.setattr(recipe, "load_tokenizer", lambda *a, **k: OffByMany())
    fails(tmp_path, match="mask_token_id 10000 is outside the vocabulary")
