"""torchrun with 2 gloo ranks gives the losses of 1 process with the same global batch.

Tolerance: the ranks compute the same per-sample noise and the same global denominators; only
the order of floating-point reductions differs (the all-reduce of gradients and loss sums, and
2 micro-batches per rank vs 4 in one process), so losses agree to ~1e-6 relative per step and
drift slowly through the optimizer; 1e-4 relative over 4 steps leaves margin.
"""

from __future__ import annotations

import pytest

from .helpers import cli_args, copy_as_crashed_at, losses, run_cli

pytestmark = pytest.mark.slow
SETTINGS = ["train.steps=4", "train.global_batch_size=16", "train.micro_batch_size=4",
            "train.val_every=4", "train.save_every=2"]


@pytest.fixture(scope="module")
def single(tmp_path_factory):
    run_dir = tmp_path_factory.mktemp("single")
    run_cli(cli_args(run_dir, *SETTINGS, strategy="hybrid"))
    return run_dir


@pytest.mark.parametrize("kind", ["ddp", "fsdp2"])
def test_two_ranks_match_one_process(tmp_path, single, kind):
    run_dir = tmp_path / kind
    # 2 ranks x 2 micro-batches of 4 == 1 process x 4 micro-batches of 4
    run_cli(cli_args(run_dir, *SETTINGS, f"train.distributed={kind}", strategy="hybrid"),
            nproc=2)
    assert losses(run_dir) == pytest.approx(losses(single), rel=1e-4)
    assert losses(run_dir, "validation") == pytest.approx(losses(single, "validation"),
                                                          rel=1e-4)
    assert (run_dir / "checkpoints" / "latest").is_file()
    from transformers import AutoModelForCausalLM

    AutoModelForCausalLM.from_pretrained(run_dir / "final", local_files_only=True)


def test_default_run_dir_under_torchrun(tmp_path):
    """Without --output-dir every rank agrees on rank 0's timestamped runs/ directory."""
    from .helpers import overrides

    args = ["train"]
    for item in overrides("train.steps=1", "train.global_batch_size=4",
                          "train.micro_batch_size=2"):
        args += ["--set", item]
    run_cli(args, nproc=2, cwd=tmp_path)
    (run_dir,) = (tmp_path / "runs").iterdir()
    assert run_dir.name.startswith("mdlm-reverse-")
    assert (run_dir / "final" / "config.json").is_file() and len(losses(run_dir)) == 1


@pytest.mark.parametrize("kind,ema", [("ddp", 0), ("fsdp2", 0), ("fsdp2", 0.9)])
def test_resume_under_torchrun_is_bit_exact(tmp_path, kind, ema):
    """A 2-rank run resumed from its step-2 checkpoint (torch.distributed.checkpoint) recomputes
    steps 3-4 exactly as the uninterrupted run did; with ``train.ema_decay`` the step-4
    validation (on the weight average, sharded like the weights) matches too."""
    full = tmp_path / "full"
    settings = [*SETTINGS, f"train.distributed={kind}", f"train.ema_decay={ema}"]
    run_cli(cli_args(full, *settings, strategy="hybrid"), nproc=2)
    resumed = tmp_path / "resumed"
    copy_as_crashed_at(full, resumed, 2)  # as after a crash at step 3
    run_cli(cli_args(resumed, *settings, strategy="hybrid") + ["--resume"], nproc=2)
    assert losses(resumed) == losses(full)
    assert losses(resumed, "validation") == losses(full, "validation")


@pytest.mark.parametrize("kind", ["ddp", "fsdp2"])
def test_dflash_two_ranks_match_one_process(tmp_path, kind):
    """The drafter's loss and the draft accuracies (extras summed over ranks) of 2 ranks equal
    one process's; the frozen target is loaded on every rank and never wrapped."""
    from .helpers import records

    single = tmp_path / "single"
    run_cli(cli_args(single, *SETTINGS, strategy="dflash"))
    run_dir = tmp_path / kind
    run_cli(cli_args(run_dir, *SETTINGS, f"train.distributed={kind}", strategy="dflash"),
            nproc=2)
    assert losses(run_dir) == pytest.approx(losses(single), rel=1e-4)
    two, one = records(run_dir), records(single)
    assert [r["dropped_samples"] for r in two] == [r["dropped_samples"] for r in one]
    # step 1 runs the same weights on both sides: the same argmax hits, counted once
    assert {k: v for k, v in two[0].items() if k.startswith("draft_acc")} == pytest.approx(
        {k: v for k, v in one[0].items() if k.startswith("draft_acc")}, abs=1e-9)
