"""Bad input: a clear error naming what and where, before any training starts."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import torch

from dlmkit.cli import main

from .helpers import cli_args, records


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


# -- the environment: clean errors before anything is written (issue: 100-line tracebacks) --

def test_output_dir_under_a_file(tmp_path):
    blocker = tmp_path / "file.txt"
    blocker.write_text("x")
    with pytest.raises(SystemExit, match=r"output directory .*file.txt/run cannot be created: "
                                         r".*file.txt is a file, not a directory"):
        main(cli_args(blocker / "run", "train.steps=1"))
    with pytest.raises(SystemExit, match=r"output directory .*file.txt is a file"):
        main(cli_args(blocker, "train.steps=1"))


@pytest.mark.skipif(not os.path.isdir("/proc/self"), reason="needs Linux /proc")
def test_output_dir_not_creatable(tmp_path):
    with pytest.raises(SystemExit, match=r"output directory /proc/dlmkit-test/run cannot be "
                                         r"created or written: writing in /proc fails"):
        main(cli_args(Path("/proc/dlmkit-test/run"), "train.steps=1"))


def test_output_dir_read_only(tmp_path, monkeypatch):
    parent = tmp_path / "ro"
    parent.mkdir()
    parent.chmod(0o555)
    try:
        if os.access(parent, os.W_OK):  # root ignores permissions: simulate a read-only mount
            import errno
            import tempfile

            def read_only(*a, **k):
                raise OSError(errno.EROFS, "Read-only file system")

            monkeypatch.setattr(tempfile, "mkstemp", read_only)
        with pytest.raises(SystemExit, match=r"output directory .*ro/run cannot be created or "
                                             r"written: writing in .*ro fails \((Read-only "
                                             r"file system|Permission denied)\)"):
            main(cli_args(parent / "run", "train.steps=1"))
    finally:
        parent.chmod(0o755)
    assert not (parent / "run").exists()


def test_flex_attention_training_on_cpu(tmp_path):
    fails(tmp_path, "model.attention=flex_attention",
          match=r"model.attention=flex_attention cannot train on the CPU: FlexAttention has no "
                r"backward pass there .*model.attention=sdpa")
    assert not (tmp_path / "run").exists()


@pytest.mark.skipif(torch.cuda.is_available(), reason="needs a machine without CUDA")
def test_cuda_device_without_cuda(tmp_path):
    fails(tmp_path, "train.device=cuda",
          match=r"train.device=cuda but (this torch build has no CUDA support|no CUDA device "
                r"is visible).*train.device=cpu")
    fails(tmp_path, "train.device=gpu", match=r"train.device='gpu' is not a torch device")
    assert not (tmp_path / "run").exists()


def test_model_config_typo_names_the_class_and_suggests(tmp_path):
    # Before: transformers' config kept the typo as an attribute and the preset trained as is.
    fails(tmp_path, "model.config.num_hiden_layers=1",
          match=r"model.config.num_hiden_layers is not an option of LlamaConfig .*did you mean "
                r"'num_hidden_layers'\?")
    assert not (tmp_path / "run").exists()


def test_disk_full_during_checkpoint(tmp_path, monkeypatch):
    """Before: `enforce fail at inline_container.cc` from deep inside torch.save."""
    real_save = torch.save
    calls = {"n": 0}

    def full_disk(obj, f, *a, **k):
        calls["n"] += 1
        if calls["n"] > 2:  # the second checkpoint
            raise RuntimeError("[enforce fail at inline_container.cc:664] . unexpected pos 64 "
                               "vs 0\nPytorchStreamWriter failed writing file data/0: file "
                               "write failed")
        return real_save(obj, f, *a, **k)

    monkeypatch.setattr(torch, "save", full_disk)
    run_dir = tmp_path / "run"
    with pytest.raises(SystemExit, match=r"could not write the step-2 checkpoint under "
                                         r".*checkpoints \(the disk is full; .* MiB free there\)"
                                         r"\. The newest complete checkpoint, .*step_0000001, "
                                         r"is intact: free some space and continue from it "
                                         r"with --resume"):
        main(cli_args(run_dir, "train.steps=3", "train.save_every=1"))
    assert sorted(p.name for p in (run_dir / "checkpoints").iterdir()) == ["latest",
                                                                           "step_0000001"]


def _finished_run(tmp_path, steps=4):
    run_dir = tmp_path / "run"
    main(cli_args(run_dir, f"train.steps={steps}", "train.save_every=2"))
    return run_dir


def test_truncated_checkpoint_falls_back_to_the_newest_complete_one(tmp_path, capsys):
    run_dir = _finished_run(tmp_path)
    state = run_dir / "checkpoints" / "step_0000004" / "state.pt"
    size = state.stat().st_size
    with state.open("r+b") as f:
        f.truncate(size // 2)
    capsys.readouterr()
    main(["train", "--output-dir", str(run_dir), "--resume", "--set", "train.steps=6"])
    out = capsys.readouterr().out
    assert (f"resume: checkpoint step_0000004 is incomplete: {state} is truncated "
            f"({size // 2} of {size} bytes); resuming from {run_dir / 'checkpoints'}/step_0000002"
            " instead, the newest complete checkpoint") in out
    assert [r["step"] for r in records(run_dir)] == [1, 2, 3, 4, 5, 6]


def test_latest_pointing_at_a_missing_step(tmp_path, capsys):
    run_dir = _finished_run(tmp_path)
    (run_dir / "checkpoints" / "latest").write_text("step_0000099")
    capsys.readouterr()
    main(["train", "--output-dir", str(run_dir), "--resume", "--set", "train.steps=5"])
    out = capsys.readouterr().out
    assert ("latest names step_0000099, which does not exist; resuming from "
            f"{run_dir / 'checkpoints'}/step_0000004 instead") in out
    assert [r["step"] for r in records(run_dir)] == [1, 2, 3, 4, 5]


def test_unreadable_checkpoint_without_manifest_names_the_file(tmp_path):
    run_dir = _finished_run(tmp_path, steps=2)
    checkpoint = run_dir / "checkpoints" / "step_0000002"
    (checkpoint / "manifest.json").unlink()  # as written by an older dlmkit
    (checkpoint / "state.pt").write_bytes(b"not a zip file")
    with pytest.raises(SystemExit, match=r"checkpoint file .*step_0000002/state.pt is "
                                         r"unreadable"):
        main(["train", "--output-dir", str(run_dir), "--resume", "--set", "train.steps=3"])
