"""Exact resume after kill -9, and checkpoints that survive a crash mid-save."""

from __future__ import annotations

import os
import signal
import time

import pytest
import torch

from dlmkit.cli import main
from dlmkit.train.checkpoint import latest_checkpoint, load_checkpoint
from dlmkit.train.distributed import World
from dlmkit.train.recipe import build_components

from .helpers import cli_args, cli_subprocess, config, losses, run_cli

CPU = World(rank=0, world_size=1, local_rank=0, device=torch.device("cpu"))
STEPS = ["train.steps=12", "train.save_every=3", "train.val_every=6"]


@pytest.mark.parametrize("name", ["mdlm", "block_diffusion",
                                  pytest.param("dflash", marks=pytest.mark.slow),
                                  pytest.param("bd3lm", marks=pytest.mark.slow)])
def test_kill_and_resume_is_bit_exact(tmp_path, name):
    straight = tmp_path / "straight"
    main(cli_args(straight, *STEPS, strategy=name))

    killed = tmp_path / "killed"
    args = cli_args(killed, *STEPS, strategy=name)
    proc = cli_subprocess(args)
    pointer = killed / "checkpoints" / "latest"
    deadline = time.monotonic() + 120
    while not pointer.is_file() and proc.poll() is None and time.monotonic() < deadline:
        time.sleep(0.02)
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait()
    assert proc.returncode == -signal.SIGKILL, "the run finished before it could be killed"
    assert not (killed / "final").exists()
    run_cli([*args, "--resume"])

    assert losses(killed) == losses(straight)  # bit-identical, every step logged once
    assert losses(killed, "validation") == losses(straight, "validation")
    assert len(losses(killed)) == 12


def test_crash_during_save_keeps_previous_checkpoint(tmp_path, monkeypatch):
    run_dir = tmp_path / "run"
    real_save = torch.save
    calls = {"n": 0}

    def flaky_save(obj, f, *a, **k):
        calls["n"] += 1
        if calls["n"] == 3:  # first file of the second checkpoint (2 files per checkpoint)
            real_save(obj, f, *a, **k)  # leave a complete-looking file behind, then die
            raise OSError("disk full (simulated)")
        return real_save(obj, f, *a, **k)

    monkeypatch.setattr(torch, "save", flaky_save)
    # The CLI reports the failed write (and the intact checkpoint) instead of a traceback.
    with pytest.raises(SystemExit, match=r"could not write the step-4 checkpoint.*simulated"
                                         r".*step_0000002, is intact"):
        main(cli_args(run_dir, "train.steps=6", "train.save_every=2"))
    monkeypatch.undo()

    checkpoint = latest_checkpoint(run_dir)
    assert checkpoint is not None and checkpoint.name == "step_0000002"
    c = build_components(config(), CPU)
    assert load_checkpoint(checkpoint, c.model, c.optimizer, c.scheduler, CPU) == 2
    # and the run resumes from it to the end
    main([*cli_args(run_dir, "train.steps=6", "train.save_every=2"), "--resume"])
    assert len(losses(run_dir)) == 6
    assert (run_dir / "final" / "config.json").is_file()


def test_resume_without_checkpoint_is_an_error(tmp_path):
    with pytest.raises(SystemExit, match="no complete checkpoint"):
        main([*cli_args(tmp_path / "none", "train.steps=2"), "--resume"])


def _jsonl(path, n):
    import json

    rows = ({"prompt": "ab" * (1 + i % 3), "response": "c" * (1 + i % 2)} for i in range(n))
    path.write_text("".join(json.dumps(row) + "\n" for row in rows))
    return path


def test_resume_from_another_directory_trains_on_the_same_files(tmp_path, monkeypatch, capsys):
    """Before: config.yaml stored data.train_files as written (`train.jsonl`) and a resume
    from another directory read that directory's train.jsonl."""
    first, elsewhere = tmp_path / "first", tmp_path / "elsewhere"
    first.mkdir()
    elsewhere.mkdir()
    _jsonl(first / "train.jsonl", 24)
    _jsonl(elsewhere / "train.jsonl", 40)  # same name, other data
    run_dir = tmp_path / "run"
    monkeypatch.chdir(first)
    main(cli_args(run_dir, "train.steps=2", "data.train_files=[train.jsonl]"))
    monkeypatch.chdir(elsewhere)
    capsys.readouterr()
    main(["train", "--output-dir", str(run_dir), "--resume", "--set", "train.steps=3"])
    out = capsys.readouterr().out
    assert "data: 24 training records" in out, out
    assert len(losses(run_dir)) == 3


def test_resume_reports_a_changed_or_missing_data_file(tmp_path):
    import json

    data = _jsonl(tmp_path / "train.jsonl", 24)
    run_dir = tmp_path / "run"
    main(cli_args(run_dir, "train.steps=2", f"data.train_files=[{data}]"))
    recorded = json.loads((run_dir / "data_files.json").read_text())
    assert list(recorded) == [str(data)]
    assert recorded[str(data)].startswith(f"{data.stat().st_size} bytes, sha256 ")
    resume = ["train", "--output-dir", str(run_dir), "--resume", "--set", "train.steps=3"]

    _jsonl(data, 25)  # one more record
    with pytest.raises(SystemExit) as caught:
        main(resume)
    message = str(caught.value)
    assert (f"  data file {data}: {recorded[str(data)]!r} in the checkpoint, "
            f"'{data.stat().st_size} bytes, sha256 ") in message
    assert "restore it, or train on it as it is with --allow-config-change" in message
    data.rename(tmp_path / "moved.jsonl")
    with pytest.raises(SystemExit, match=rf"data file {data}: '.*' in the checkpoint, "
                                         "'missing' now"):
        main(resume)
    (tmp_path / "moved.jsonl").rename(data)
    main([*resume, "--allow-config-change"])  # trains on the file as it is now, and says so
    change = json.loads((run_dir / "config_changes.jsonl").read_text())
    assert list(change["forced"]) == [f"data file {data}"]
    assert len(losses(run_dir)) == 3
    # the record follows the data the run now trains on: a further resume is clean
    main(["train", "--output-dir", str(run_dir), "--resume", "--set", "train.steps=4"])
    assert len(losses(run_dir)) == 4


def test_a_run_from_an_older_dlmkit_resumes_with_its_relative_paths_and_says_so(
        tmp_path, monkeypatch, capsys):
    import yaml

    from .helpers import rewrite_checkpoint_config

    data = _jsonl(tmp_path / "train.jsonl", 24)
    run_dir = tmp_path / "run"
    main(cli_args(run_dir, "train.steps=2", "train.save_every=2", f"data.train_files=[{data}]"))
    checkpoint = run_dir / "checkpoints" / "step_0000002"
    stored = yaml.safe_load((checkpoint / "config.yaml").read_text())
    stored["data"]["train_files"] = ["train.jsonl"]  # as written, as older dlmkit kept it
    rewrite_checkpoint_config(checkpoint, stored)
    (run_dir / "data_files.json").unlink()
    monkeypatch.chdir(tmp_path)
    capsys.readouterr()
    main(["train", "--output-dir", str(run_dir), "--resume", "--set", "train.steps=3"])
    out = capsys.readouterr().out.splitlines()
    assert (f"resume: {checkpoint / 'config.yaml'} records paths relative to the directory the "
            f"run was started in (older dlmkit); reading them from {tmp_path}: "
            "data.train_files=['train.jsonl']") in out
    assert (f"resume: {run_dir / 'data_files.json'} does not exist (a run from an older "
            "dlmkit): the data files are not checked against the ones it trained on") in out
    assert (run_dir / "data_files.json").is_file()
    assert yaml.safe_load((run_dir / "config.yaml").read_text())["data"]["train_files"] == \
        [str(data)]
