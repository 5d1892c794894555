"""What `dlmkit train` prints: truthful, readable in a log file, no tracebacks for the user.

Before: Ctrl-C ended in a traceback; `train.progress=false` also hid the validation losses; a
log file got one `\\r`-joined tqdm line; `--print-config | head` ended in a BrokenPipeError
traceback; `--print-config` showed `strategy: {name: bd3lm}` only.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import pytest
import yaml

from dlmkit.cli import main

from .helpers import cli_args, cli_subprocess, env, losses, records, tiny_target


@pytest.mark.slow  # a training subprocess interrupted, then resumed: ~20 s on 2 busy cores
def test_ctrl_c_prints_two_lines_with_the_step_and_the_resume_command(tmp_path):
    run_dir = tmp_path / "run"
    # A shell's background job (`make test &`) starts with SIGINT ignored, which the child
    # would inherit and so never be interrupted: give it the default disposition.
    proc = cli_subprocess(cli_args(run_dir, "train.steps=2000", "train.save_every=2"),
                          preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    pointer = run_dir / "checkpoints" / "latest"
    deadline = time.monotonic() + 120
    while not pointer.is_file() and proc.poll() is None and time.monotonic() < deadline:
        time.sleep(0.05)
    assert proc.poll() is None, proc.communicate()[0][-2000:]
    os.kill(proc.pid, signal.SIGINT)
    out, _ = proc.communicate(timeout=60)
    assert proc.returncode == 130, out[-2000:]
    assert "Traceback" not in out
    first, second = out.strip().splitlines()[-2:]
    step = int(first.split("interrupted at step ")[1].split(";")[0])
    assert step >= 2 and "; the last checkpoint is " in first and "step_" in first
    assert second == f"resume with: dlmkit train --output-dir {run_dir} --resume"
    # and that command (extended only to stop soon) continues the run
    saved = int(pointer.read_text().strip().split("_")[1])
    main(["train", "--output-dir", str(run_dir), "--resume", "--set",
          f"train.steps={saved + 1}"])
    assert len(losses(run_dir)) == saved + 1


def test_ctrl_c_right_after_a_checkpoint_is_written_names_it(tmp_path, monkeypatch, capsys):
    """Ctrl-C between a checkpoint's rename and save_checkpoint's return (the window the test
    above aims at, hit under load) must still name it: "no checkpoint yet" would suggest
    --overwrite, which deletes it."""
    from dlmkit.train import recipe

    real = recipe.save_checkpoint

    def save_then_interrupt(*args, **kwargs):
        real(*args, **kwargs)
        raise KeyboardInterrupt

    monkeypatch.setattr(recipe, "save_checkpoint", save_then_interrupt)
    run_dir = tmp_path / "run"
    assert main(cli_args(run_dir, "train.steps=5", "train.save_every=2")) == 130
    first, second = capsys.readouterr().err.strip().splitlines()[-2:]
    assert first == (f"interrupted at step 2; the last checkpoint is "
                     f"{run_dir / 'checkpoints' / 'step_0000002'}")
    assert second == f"resume with: dlmkit train --output-dir {run_dir} --resume"


def test_progress_off_a_terminal_is_plain_lines(capsys):
    import io

    from dlmkit.train.progress import Progress

    log = io.StringIO()  # not a TTY
    progress = Progress(enabled=True, show_steps=True, total=4, initial=0, desc="train x",
                        stream=log)
    for done in range(1, 5):
        if done % 2 == 0:
            progress.logged(done, {"loss": 1.5, "lr": 1e-3, "tokens_per_s": 100.0})
        progress.advance()
    progress.message("step 4: validation loss 1.2000")
    progress.close()
    lines = log.getvalue().splitlines()
    assert "\r" not in log.getvalue() and len(lines) == 2
    assert lines[0].startswith("train x: step 2/4  loss 1.5000  lr 1.00e-03  tokens/s 100")
    assert capsys.readouterr().out == "step 4: validation loss 1.2000\n"
    hidden = Progress(enabled=True, show_steps=False, total=4, initial=0, desc="x", stream=log)
    hidden.logged(2, {"loss": 1.0, "lr": 1.0, "tokens_per_s": 1.0})
    hidden.message("step 2: validation loss 1.0000")  # train.progress=false keeps these
    assert capsys.readouterr().out == "step 2: validation loss 1.0000\n"
    assert len(log.getvalue().splitlines()) == 2


@pytest.mark.slow  # a training subprocess writing to a log file: ~15-20 s on 2 busy cores
def test_log_file_gets_plain_lines(tmp_path):
    log = tmp_path / "train.log"
    e = env()
    e.pop("TQDM_DISABLE")
    with log.open("w") as f:
        subprocess.run([sys.executable, "-m", "dlmkit.cli",
                        *cli_args(tmp_path / "run", "train.steps=3", "train.progress=true")],
                       env=e, stdout=f, stderr=subprocess.STDOUT, check=True, timeout=300)
    text = log.read_text()
    assert "\r" not in text
    for step in (1, 2, 3):
        assert f"train mdlm: step {step}/3  loss " in text


def test_progress_false_hides_steps_not_validation(tmp_path, capsys):
    main(cli_args(tmp_path / "run", "train.steps=2", "train.val_every=1",
                  "train.progress=false"))
    captured = capsys.readouterr()
    assert "step 1: validation loss" in captured.out
    assert "step 2: validation loss" in captured.out
    assert "step 1/2" not in captured.out + captured.err


def _closed_pipe(args):
    proc = subprocess.Popen([sys.executable, "-m", "dlmkit.cli", *args], env=env(),
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    proc.stdout.close()  # like `| head` exiting before the command writes
    err = proc.stderr.read()
    proc.wait(timeout=120)
    return proc.returncode, err


def test_print_config_into_a_closed_pipe_has_no_traceback():
    code, err = _closed_pipe(["train", "--print-config"])
    assert "Traceback" not in err and "BrokenPipeError" not in err, err
    assert code == 141


def test_print_config_lists_every_strategy_and_checks_options(capsys):
    from dlmkit import strategies

    main(["train", "--print-config"])
    out = capsys.readouterr().out
    config = yaml.safe_load(out)
    # as the run resolves them: logit_shift's null is false for a preset (from scratch)
    assert config["strategy"] == {"name": "bd3lm", **strategies.get("bd3lm").options,
                                  "logit_shift": False}
    for name in strategies.names():  # each family's options, default, allowed values, help
        assert f"#   strategy.<option> of {name}:" in out
    scdd = out.split("#   strategy.<option> of scdd:", 1)[1]
    assert scdd.startswith("\n#     num_timesteps = 1000  (an int >= 2)\n#         the time grid")
    # the training defaults an unset train.lr / steps / warmup_steps / ema_decay resolve to
    defaults = out.split("# Every strategy's training defaults", 1)[1]
    for name in strategies.names():
        cls = strategies.get(name)
        assert (f"#   {name}: from scratch lr={cls.default_lr:g}, weight_decay=0.5, "
                f"steps={cls.default_steps}, ") in defaults
    assert ("#   scdd: from scratch lr=0.001, weight_decay=0.5, steps=10000, warmup_steps=10% "
            "of steps, ema_decay=0.999; fine-tuning lr=1e-05, weight_decay=0, epochs=3, "
            "warmup_steps=3% of steps, ema_decay=0") in out
    assert ("#   block_diffusion: from scratch lr=0.0015, weight_decay=0.5, steps=6000, "
            "warmup_steps=20, ema_decay=0.999; fine-tuning") in out
    with pytest.raises(SystemExit, match=r"unknown option\(s\) \['blok_size'\]"):
        main(["train", "--print-config", "--set", "strategy.blok_size=8"])


def test_sigterm_saves_nothing_new_but_prints_the_resume_command_and_exits_143(
        tmp_path, monkeypatch, capsys):
    """Before: SIGTERM (a scheduler's preemption) ended the run with no message at all."""
    from dlmkit.train import recipe

    real = recipe.save_checkpoint

    def save_then_terminate(*args, **kwargs):
        real(*args, **kwargs)
        os.kill(os.getpid(), signal.SIGTERM)

    monkeypatch.setattr(recipe, "save_checkpoint", save_then_terminate)
    before = signal.getsignal(signal.SIGTERM)
    run_dir = tmp_path / "run"
    assert main(cli_args(run_dir, "train.steps=5", "train.save_every=2")) == 143
    first, second = capsys.readouterr().err.strip().splitlines()[-2:]
    assert first == (f"terminated by SIGTERM at step 2; the last checkpoint is "
                     f"{run_dir / 'checkpoints' / 'step_0000002'}")
    assert second == f"resume with: dlmkit train --output-dir {run_dir} --resume"
    assert signal.getsignal(signal.SIGTERM) is before  # the caller's handler is back
    assert not (run_dir / ".lock").exists()


def test_sigterm_mid_step_finishes_the_step_and_saves_it(tmp_path, monkeypatch, capsys):
    """SIGTERM (or Ctrl-C) in the middle of step 3 of 5, none of which is a save step: the step
    finishes, a checkpoint of it is written, and a resume continues from there."""
    from dlmkit.train import recipe

    real = recipe.train_step

    def step_then_signal(step, *args, **kwargs):
        if step == 2:
            os.kill(os.getpid(), signal.SIGTERM)  # delivered inside the step
        return real(step, *args, **kwargs)

    monkeypatch.setattr(recipe, "train_step", step_then_signal)
    run_dir = tmp_path / "run"
    assert main(cli_args(run_dir, "train.steps=5", "train.save_every=100")) == 143
    err = capsys.readouterr().err
    assert "SIGTERM: stopping after the step in progress" in err
    assert (f"terminated by SIGTERM at step 3; the last checkpoint is "
            f"{run_dir / 'checkpoints' / 'step_0000003'}") in err
    monkeypatch.setattr(recipe, "train_step", real)
    assert main(["train", "--output-dir", str(run_dir), "--resume"]) == 0
    assert [r["step"] for r in records(run_dir)] == [1, 2, 3, 4, 5]


@pytest.mark.slow  # a training subprocess, a second run refused, SIGTERM, a resume: ~25 s
def test_a_live_run_holds_its_directory_until_sigterm_ends_it(tmp_path):
    from dlmkit.train.recipe import newest_complete_checkpoint

    run_dir = tmp_path / "run"
    proc = cli_subprocess(cli_args(run_dir, "train.steps=2000", "train.save_every=2"))
    pointer = run_dir / "checkpoints" / "latest"
    deadline = time.monotonic() + 120
    while not pointer.is_file() and proc.poll() is None and time.monotonic() < deadline:
        time.sleep(0.05)
    assert proc.poll() is None, proc.communicate()[0][-2000:]
    with pytest.raises(SystemExit, match=rf"{run_dir} is in use by another training run "
                                         rf"\(pid {proc.pid} "):
        main([*cli_args(run_dir, "train.steps=2000"), "--resume"])
    proc.send_signal(signal.SIGTERM)
    out, _ = proc.communicate(timeout=60)
    assert proc.returncode == 143, out[-2000:]
    assert "Traceback" not in out
    first, second = out.strip().splitlines()[-2:]
    checkpoint = newest_complete_checkpoint(run_dir)
    assert first.startswith("terminated by SIGTERM at step ")
    assert first.endswith(f"; the last checkpoint is {checkpoint}")
    assert second == f"resume with: dlmkit train --output-dir {run_dir} --resume"
    assert not (run_dir / ".lock").exists()
    saved = int(checkpoint.name.split("_")[1])
    main(["train", "--output-dir", str(run_dir), "--resume", "--set",
          f"train.steps={saved + 1}"])
    assert len(losses(run_dir)) == saved + 1


def test_data_summary_and_a_batch_larger_than_the_data(tmp_path, capsys):
    main(cli_args(tmp_path / "run", "train.steps=2", "data.num_train=4"))
    out = capsys.readouterr().out.splitlines()
    data = next(line for line in out if line.startswith("data: "))
    assert data.startswith("data: 4 training records, ")
    assert " supervised tokens, longest record " in data
    assert data.endswith(" tokens; 16 validation records")
    assert "budget: 2 steps x 8 samples = 4 passes over the training records" in out
    assert ("warning: train.global_batch_size=8 is larger than the training set (4 records): "
            "every step holds some records more than once") in out


def test_tensorboard_gets_the_metrics_and_a_resume_replaces_the_steps_past_it(tmp_path):
    pytest.importorskip("tensorboard")
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    from .helpers import copy_as_crashed_at

    def scalars(run_dir, tag):
        board = EventAccumulator(str(run_dir / "tensorboard"))
        board.Reload()
        return [(e.step, e.value) for e in board.Scalars(tag)], board.Tags()["scalars"]

    run_dir = tmp_path / "run"
    main(cli_args(run_dir, "train.steps=4", "train.val_every=2", "train.save_every=2",
                  "train.tensorboard=true"))
    train, tags = scalars(run_dir, "train/loss")
    assert [s for s, _ in train] == [1, 2, 3, 4]
    assert [v for _, v in train] == pytest.approx(losses(run_dir), rel=1e-6)
    assert [s for s, _ in scalars(run_dir, "validation/loss")[0]] == [2, 4]
    assert "train/lr" in tags and "train/grad_norm" in tags
    # crashed after step 2 with the events of steps 3 and 4 written: they are replaced
    crashed = tmp_path / "crashed"
    copy_as_crashed_at(run_dir, crashed, 2)
    main(["train", "--output-dir", str(crashed), "--resume", "--set", "train.steps=5"])
    train, _ = scalars(crashed, "train/loss")
    assert [s for s, _ in train] == [1, 2, 3, 4, 5]
    assert [v for _, v in train] == pytest.approx(losses(crashed), rel=1e-6)


def test_dlmkit_warnings_print_as_one_line(tmp_path, capsys):
    """dlmkit's own warnings (here the pure-bf16 opt-in) print as `warning: ...`, not as
    Python's `file:line: UserWarning:` with a source line."""
    main(cli_args(tmp_path / "run", "train.steps=1", "model.dtype=bfloat16",
                  "train.master_dtype=bfloat16"))
    err = capsys.readouterr().err
    assert "\nwarning: train.master_dtype=bfloat16: the trained weights" in f"\n{err}"
    assert "UserWarning" not in err


def test_print_config_resolves_the_regime_s_options_as_the_run_would(capsys):
    main(["train", "--print-config", "--set", f"model.name={tiny_target()}", "--set",
          "strategy.name=idlm"])
    config = yaml.safe_load(capsys.readouterr().out)
    assert config["strategy"]["clean_loss_weight"] == 4.0  # adapting a causal checkpoint
    main(["train", "--print-config", "--set", "strategy.name=idlm"])
    assert yaml.safe_load(capsys.readouterr().out)["strategy"]["clean_loss_weight"] == 1.0
