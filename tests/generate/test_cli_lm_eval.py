"""`dlmkit lm-eval`: its help says how to call the dlmkit model; wrong tasks and a run directory
as `pretrained=` get one line naming what the user passed.

Before: `--help` printed only lm-eval's help (no word of `--model dlmkit` or its model_args);
an unknown task and `pretrained=RUN` ended in tracebacks, the latter saying `--model`."""

import inspect

import pytest

from dlmkit.cli import main

pytest.importorskip("lm_eval")


def test_help_starts_with_how_to_call_the_dlmkit_model(capsys):
    with pytest.raises(SystemExit) as done:
        main(["lm-eval", "--help"])
    assert done.value.code == 0
    out = capsys.readouterr().out
    assert out.startswith("dlmkit lm-eval: lm-evaluation-harness's command line with the "
                          "dlmkit model registered.")
    assert "dlmkit lm-eval --model dlmkit --model_args pretrained=RUN/final" in out
    assert "  pretrained=DIR   the exported model directory, RUN/final" in out
    from dlmkit.commands.generate import sampler_fields

    listed = " ".join(out.split())  # every sampler option of every family, by its field name
    assert "steps" in sampler_fields() and "block_size" in sampler_fields()
    assert ", ".join(sampler_fields()) in listed
    assert out.index("lm-eval's own help follows") < out.index("usage: lm-eval run")


def test_listed_model_args_are_the_adapters():
    from dlmkit.commands.lm_eval import MODEL_ARGS
    from dlmkit.generate.harness import DlmkitLM

    takes = set(inspect.signature(DlmkitLM.__init__).parameters)
    # max_batch_size: lm-eval passes it to every model; options: the sampler options
    takes -= {"self", "options", "max_batch_size"}
    assert {name.split("=")[0] for name, _ in MODEL_ARGS} == takes


def test_run_directory_as_pretrained_names_model_args(exported, tmp_path):
    from dlmkit.generate.harness import DlmkitLM

    run = tmp_path / "run"
    (run / "checkpoints").mkdir(parents=True)
    (run / "config.yaml").write_text("")
    final = run / "final"
    final.symlink_to(exported("ar"), target_is_directory=True)
    with pytest.raises(ValueError, match=rf"^--model_args pretrained {run} is a training run "
                                         rf"directory, not a model directory; pass {final}"):
        DlmkitLM(pretrained=str(run))


@pytest.mark.slow
def test_unknown_task_is_one_line(exported, monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_DATASETS_OFFLINE", "1")
    with pytest.raises(SystemExit, match=r"^error: Tasks not found: no_such_task; `dlmkit "
                                         r"lm-eval ls tasks` lists the tasks lm-eval knows, and "
                                         r"--include_path DIR adds your own"):
        main(["lm-eval", "--model", "dlmkit", "--model_args",
              f"pretrained={exported('ar')}", "--tasks", "no_such_task", "--device", "cpu"])
