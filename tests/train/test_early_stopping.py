"""Early stopping (dlmkit.train.early_stopping): the run ends where its patience says, final/
is the best checkpoint, and a resume in the middle of a patience count ends at the same step."""

from __future__ import annotations

import json

import pytest

from dlmkit.train import load_config
from dlmkit.train.early_stopping import EarlyStopping
from dlmkit.train.recipe import run

from .helpers import copy_as_crashed_at, losses, overrides, records


def train(run_dir, *extra, resume=False):
    items = [*overrides(*SETTINGS, *extra), f"output_dir={run_dir}"]
    run(load_config(None, [f"output_dir={run_dir}"] if resume else items), resume=resume,
        explicit=[])


def test_patience_counts_validations_without_an_improvement_of_min_delta():
    stopper = EarlyStopping(patience=2, min_delta=0.1)
    # 1.0 improves on inf; 0.95 is not 0.1 better; 0.85 is; then two stale ones stop it.
    assert [stopper.observe(s, v) for s, v in
            enumerate([1.0, 0.95, 0.85, 0.80, float("nan")], 1)] == [False, False, False,
                                                                    False, True]
    assert (stopper.best, stopper.best_step) == (0.85, 3)
    off = EarlyStopping(patience=0, min_delta=0.1)
    assert not any(off.observe(s, 1.0) for s in range(10))
    with pytest.raises(ValueError, match="early_stopping_patience"):
        EarlyStopping(patience=-1, min_delta=0.0)


# min_delta 10 nats: only the first validation counts as an improvement, so the run stops at
# step 1 + patience whatever the losses are.
SETTINGS = ["train.steps=10", "train.val_every=1", "train.save_every=2",
            "train.early_stopping_patience=3", "train.early_stopping_min_delta=10"]


@pytest.fixture(scope="module")
def stopped(tmp_path_factory):
    import contextlib
    import io

    run_dir = tmp_path_factory.mktemp("stopped") / "run"
    out = io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(out):
        train(run_dir)
    return run_dir, out.getvalue()


def test_the_run_stops_where_its_patience_says(stopped):
    run_dir, out = stopped
    assert [r["step"] for r in records(run_dir, "validation")] == [1, 2, 3, 4]
    assert records(run_dir)[-1]["step"] == 4
    assert "step 4: early stopping: the validation loss has not improved by 10 for 3" in out
    selected = json.loads((run_dir / "final" / "dlmkit.json").read_text())["selected"]
    val = {r["step"]: r["loss"] for r in records(run_dir, "validation")}
    assert selected["last_step"] == 4
    assert selected["validation_loss"] == min(val.values())  # final/ = the best step
    assert (run_dir / "checkpoints" / "step_0000004").is_dir()  # resumable where it stopped


def test_a_resume_in_the_middle_of_a_patience_count_stops_at_the_same_step(stopped, tmp_path,
                                                                         capsys):
    run_dir, _ = stopped
    copy = tmp_path / "copy"
    copy_as_crashed_at(run_dir, copy, 2)  # one stale validation counted at step 2
    train(copy, resume=True)
    assert [r["step"] for r in records(copy, "validation")] == [1, 2, 3, 4]
    assert losses(copy) == losses(run_dir)
    # Resuming the stopped run says so and trains nothing more.
    capsys.readouterr()
    train(copy, resume=True)
    assert "resume: early stopping" in "".join(capsys.readouterr())
    assert records(copy)[-1]["step"] == 4


def test_no_validation_data_trains_the_whole_budget(tmp_path):
    data = tmp_path / "train.jsonl"
    data.write_text("".join(json.dumps({"prompt": f"rev {w}", "response": w[::-1]}) + "\n"
                            for w in ("abc", "bca", "cab", "hgf") * 4))
    run_dir = tmp_path / "run"
    train(run_dir, "train.steps=3", "train.early_stopping_patience=1", "data.task=null",
          f"data.train_files=[{data}]")
    assert records(run_dir)[-1]["step"] == 3
