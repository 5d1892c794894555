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
