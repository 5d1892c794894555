"""A run never overwrites or mixes results unasked, and a resume trains what its config says.

Before: a second ``dlmkit train --output-dir EXISTING`` replaced metrics.jsonl, config.yaml and
final/ but kept the old checkpoints and ``latest`` (a mixed directory); ``--resume`` silently
ignored a changed lr (while config.yaml recorded it), accepted a changed strategy and relabelled
the export, and met a changed model with a raw size-mismatch traceback; the last step was not
checkpointed, so a finished run could not be extended.
"""

from __future__ import annotations

import json

import pytest
import yaml

from dlmkit.cli import main

from .helpers import cli_args, losses, records, rewrite_checkpoint_config


def train(run_dir, *extra, strategy="mdlm"):
    main(cli_args(run_dir, *extra, strategy=strategy))


@pytest.fixture(scope="module")
def finished(tmp_path_factory):
    """A finished 3-step run (checkpoint every 2 steps, so step 2 and the final step 3)."""
    run_dir = tmp_path_factory.mktemp("finished") / "run"
    train(run_dir, "train.steps=3", "train.save_every=2")
    return run_dir


def test_existing_run_directory_is_refused(finished, tmp_path):
    before = (finished / "metrics.jsonl").read_text()
    with pytest.raises(SystemExit, match=r"already holds a run \(config.yaml, metrics.jsonl, "
                                         r"checkpoints, final\).*--resume.*--overwrite"):
        train(finished, "train.steps=1")
    assert (finished / "metrics.jsonl").read_text() == before  # nothing touched


def test_overwrite_clears_the_directory_first(tmp_path):
    run_dir = tmp_path / "run"
    train(run_dir, "train.steps=2", "train.save_every=1")
    (run_dir / "notes.txt").write_text("from the old run")
    main([*cli_args(run_dir, "train.steps=1"), "--overwrite"])
    assert not (run_dir / "notes.txt").exists()
    assert sorted(p.name for p in (run_dir / "checkpoints").iterdir()) == ["latest",
                                                                           "step_0000001"]
    assert len(losses(run_dir)) == 1


def test_overwrite_never_deletes_a_directory_that_is_not_a_run(tmp_path):
    mine = tmp_path / "documents"
    mine.mkdir()
    (mine / "thesis.tex").write_text("precious")
    with pytest.raises(SystemExit, match="not empty and holds no dlmkit run.*refusing"):
        main([*cli_args(mine, "train.steps=1"), "--overwrite"])
    assert (mine / "thesis.tex").read_text() == "precious"


def test_resume_refuses_config_changes_and_lists_them(finished):
    with pytest.raises(SystemExit) as caught:
        main(["train", "--output-dir", str(finished), "--resume", "--set", "train.lr=0.01",
              "--set", "strategy.name=bd3lm", "--set", "model.config.hidden_size=32",
              "--set", "train.steps=5"])
    message = str(caught.value)
    assert "differs from the one" in message and "step_0000003" in message
    assert "  train.lr: 0.001 in the checkpoint, 0.01 now" in message
    assert "  strategy.name: 'mdlm' in the checkpoint, 'bd3lm' now" in message
    assert "  model.config.hidden_size: 64 in the checkpoint, 32 now" in message
    assert "train.steps" not in message.split("\n", 1)[1].split("Resume without")[0]
    assert "--allow-config-change" in message
    assert len(losses(finished)) == 3  # nothing trained


def test_resume_extends_a_finished_run_with_its_own_config(finished, tmp_path, capsys):
    """The final step is checkpointed; `--resume --set train.steps=N` continues from it with
    the checkpoint's config (no need to repeat the original --set options)."""
    assert (finished / "checkpoints" / "latest").read_text() == "step_0000003"
    run_dir = tmp_path / "copy"
    import shutil

    shutil.copytree(finished, run_dir)
    main(["train", "--output-dir", str(run_dir), "--resume", "--set", "train.steps=5"])
    assert "resume: train.steps: 3 -> 5" in capsys.readouterr().out
    assert [r["step"] for r in records(run_dir)] == [1, 2, 3, 4, 5]
    assert losses(run_dir)[:3] == losses(finished)
    config = yaml.safe_load((run_dir / "config.yaml").read_text())
    assert config["train"]["steps"] == 5
    assert config["model"]["config"]["hidden_size"] == 64  # the run's own, not the default
    change = json.loads((run_dir / "config_changes.jsonl").read_text())
    # the copy moved the run: the new path is recorded too
    assert change["resumed_at_step"] == 3 and change["applied"] == {
        "train.steps": [3, 5], "output_dir": [str(finished), str(run_dir)]}
    assert change["forced"] == {}


def test_allow_config_change_applies_and_records(finished, tmp_path):
    import shutil

    run_dir = tmp_path / "forced"
    shutil.copytree(finished, run_dir)
    main(["train", "--output-dir", str(run_dir), "--resume", "--allow-config-change",
          "--set", "train.lr=0.01", "--set", "train.steps=4"])
    change = json.loads((run_dir / "config_changes.jsonl").read_text())
    assert change["forced"] == {"train.lr": [0.001, 0.01]}
    assert yaml.safe_load((run_dir / "config.yaml").read_text())["train"]["lr"] == 0.01
    assert [r["step"] for r in records(run_dir)] == [1, 2, 3, 4]


def test_resume_of_a_finished_run_without_more_steps_says_so(finished, tmp_path, capsys):
    import shutil

    run_dir = tmp_path / "again"
    shutil.copytree(finished, run_dir)
    main(["train", "--output-dir", str(run_dir), "--resume"])
    assert "already at train.steps=3; nothing to train" in capsys.readouterr().out
    assert len(losses(run_dir)) == 3


def test_checkpoint_config_from_an_older_dlmkit_gets_new_defaults(finished, tmp_path):
    """A key added to dlmkit after the checkpoint was written is not a 'change'."""
    import shutil

    run_dir = tmp_path / "older"
    shutil.copytree(finished, run_dir)
    checkpoint = run_dir / "checkpoints" / "step_0000003"
    stored = yaml.safe_load((checkpoint / "config.yaml").read_text())
    del stored["data"]["truncation"]
    rewrite_checkpoint_config(checkpoint, stored)
    main(["train", "--output-dir", str(run_dir), "--resume", "--set", "train.steps=4"])
    assert [r["step"] for r in records(run_dir)] == [1, 2, 3, 4]


# A process that holds RUN/.lock as a training run does, until its stdin closes or it is killed.
_HOLD = ("import sys; from dlmkit.train.rundir import RunLock; RunLock.acquire(sys.argv[1]); "
         "print('held', flush=True); sys.stdin.read()")


@pytest.fixture
def holder():
    """``holder(run_dir)`` starts a process holding the run directory's lock."""
    import subprocess
    import sys

    from .helpers import env

    procs = []

    def start(run_dir):
        proc = subprocess.Popen([sys.executable, "-c", _HOLD, str(run_dir)], env=env(),
                                stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
        procs.append(proc)
        assert proc.stdout.readline().strip() == "held"
        return proc

    yield start
    for proc in procs:
        proc.kill()
        proc.wait()


def test_a_run_directory_in_use_is_refused_and_a_dead_holder_does_not_block(tmp_path, holder):
    """Before: two runs into one --output-dir both trained; metrics.jsonl interleaved them."""
    run_dir = tmp_path / "run"
    proc = holder(run_dir)
    in_use = (rf"output directory {run_dir} is in use by another training run \(pid "
              rf"{proc.pid} on .*; it holds {run_dir / '.lock'}\)\. Wait for it to finish")
    with pytest.raises(SystemExit, match=in_use):
        train(run_dir, "train.steps=1")
    with pytest.raises(SystemExit, match=in_use):  # --overwrite must not delete a live run
        main([*cli_args(run_dir, "train.steps=1"), "--overwrite"])
    assert [p.name for p in run_dir.iterdir()] == [".lock"]
    proc.kill()  # as a killed run: the lock file stays, the kernel drops the lock
    proc.wait()
    assert (run_dir / ".lock").is_file()
    train(run_dir, "train.steps=1")
    assert len(losses(run_dir)) == 1
    assert not (run_dir / ".lock").exists()  # released (and removed) at the end


def test_resume_into_a_run_directory_in_use_is_refused(finished, tmp_path, holder):
    import shutil

    run_dir = tmp_path / "busy"
    shutil.copytree(finished, run_dir)
    proc = holder(run_dir)
    with pytest.raises(SystemExit, match=rf"{run_dir} is in use by another training run "
                                         rf"\(pid {proc.pid} "):
        main(["train", "--output-dir", str(run_dir), "--resume", "--set", "train.steps=4"])
    assert len(losses(run_dir)) == 3


def test_a_run_stopped_by_a_config_error_leaves_no_directory(tmp_path):
    """The lock is taken before the model and data are built; a run that fails there leaves
    neither the lock file nor the directories made for it."""
    with pytest.raises(SystemExit, match="tokenizer spec must be 'byte' or an existing"):
        train(tmp_path / "new" / "run", "train.steps=1", f"data.tokenizer={tmp_path / 'no'}")
    assert list(tmp_path.iterdir()) == []


def test_resume_prints_where_it_starts_and_what_it_trains_on(finished, tmp_path, capsys):
    import shutil

    run_dir = tmp_path / "again"
    shutil.copytree(finished, run_dir)
    main(["train", "--output-dir", str(run_dir), "--resume", "--set", "train.steps=4"])
    out = capsys.readouterr().out
    assert (f"resuming from step 3 of 4 (checkpoint {run_dir / 'checkpoints' / 'step_0000003'})"
            in out.splitlines())
    assert "budget: 4 steps x 8 samples = 0.5 passes over the training records" in out


@pytest.mark.slow  # torchrun with two ranks: ~15 s on 2 busy cores
def test_under_torchrun_every_rank_stops_when_the_directory_is_in_use(tmp_path, holder):
    """Rank 0 alone takes the lock; the other ranks learn that it failed instead of waiting
    for it at the next collective."""
    from .helpers import cli_subprocess

    run_dir = tmp_path / "run"
    proc = holder(run_dir)
    ranks = cli_subprocess(cli_args(run_dir, "train.steps=1"), nproc=2)
    out, _ = ranks.communicate(timeout=240)
    assert ranks.returncode != 0
    assert out.count(f"error: output directory {run_dir} is in use by another training run "
                     f"(pid {proc.pid} ") == 2, out[-3000:]
