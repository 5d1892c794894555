"""`dlmkit eval` and `dlmkit generate` after training: the output file, Ctrl-C, -n/--split
with --data, and prompts too long for the model.

Before: `--output missing/dir/preds.jsonl` evaluated everything, then failed with a
FileNotFoundError and no scores; Ctrl-C gave a KeyboardInterrupt traceback; `-n` and `--split`
were ignored with --data.
"""

import json

import pytest

from dlmkit.cli import main


@pytest.fixture
def data(tmp_path):
    path = tmp_path / "test.jsonl"
    rows = [{"prompt": f"rev {w}", "response": w[::-1]} for w in ("ab", "abc", "xy", "q", "pq")]
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def run_eval(model, data, *extra):
    return main(["eval", "--model", str(model), "--data", str(data), "--max-new-tokens", "4",
                 "--no-progress", *extra])


def test_output_folder_is_made_and_scores_always_print(exported, data, tmp_path, capsys,
                                                       monkeypatch):
    model = exported("ar")
    out = tmp_path / "missing" / "dir" / "preds.jsonl"
    assert run_eval(model, data, "--output", str(out)) == 0
    assert capsys.readouterr().out.splitlines()[-1].startswith("exact_match: ")
    assert [json.loads(line)["turn"] for line in out.read_text().splitlines()] == [1] * 5

    # a failing write comes after the scores, which are printed in full
    def full_disk(*args, **kwargs):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr("dlmkit.commands.eval.open", full_disk, raising=False)
    assert run_eval(model, data, "--output", str(out)) == 1
    captured = capsys.readouterr()
    assert captured.out.splitlines()[-1].startswith("exact_match: ")
    assert (f"error: --output {out}: No space left on device; the scores above are complete, "
            "the per-turn rows were not written") in captured.err


def test_bad_output_path_fails_before_evaluating(exported, data, tmp_path, monkeypatch):
    def no_loading(*args, **kwargs):
        raise AssertionError("the model was loaded")

    monkeypatch.setattr("dlmkit.commands.generate.load_and_configure", no_loading)
    with pytest.raises(SystemExit, match=rf"--output {tmp_path} is a directory; pass a file "
                                         r"path, e.g. .*predictions.jsonl"):
        run_eval(exported("ar"), data, "--output", str(tmp_path))
    (tmp_path / "file").write_text("")
    with pytest.raises(SystemExit, match=r"--output .*file/preds.jsonl: cannot create its "
                                         r"folder .*file"):
        run_eval(exported("ar"), data, "--output", str(tmp_path / "file" / "preds.jsonl"))


def test_n_and_split_with_data(exported, data, capsys):
    model = exported("ar")
    assert run_eval(model, data, "-n", "2") == 0
    assert f"{data}  n: 2  sampler: ar" in capsys.readouterr().out
    assert run_eval(model, data) == 0  # all records by default, not the task's 200
    assert f"{data}  n: 5  sampler: ar" in capsys.readouterr().out
    with pytest.raises(SystemExit, match=r"--split test picks a bundled task's split; the "
                                         r"--data files are the split to score: drop --split"):
        run_eval(model, data, "--split", "test")
    assert main(["eval", "--model", str(model), "-n", "2", "--max-new-tokens", "4",
                 "--no-progress"]) == 0  # the bundled task keeps its defaults (split test)
    assert "task: reverse  split: test  n: 2" in capsys.readouterr().out
    # as --last-turn, --field belongs to --data (before: ignored without it)
    with pytest.raises(SystemExit, match=r"--field prompt=question names a field of --data "
                                         r"files; a bundled task has its own fields"):
        main(["eval", "--model", str(model), "--field", "prompt=question"])


def test_ctrl_c_says_what_was_done(exported, data, capsys, monkeypatch):
    import dlmkit.generate
    import dlmkit.generate.api

    real = dlmkit.generate.api.generate
    calls = []

    def interrupted_second_batch(*args, **kwargs):
        calls.append(1)
        if len(calls) == 2:
            raise KeyboardInterrupt
        return real(*args, **kwargs)

    model = exported("ar")
    monkeypatch.setattr(dlmkit.generate.api, "generate", interrupted_second_batch)
    assert run_eval(model, data, "--batch-size", "2") == 130
    captured = capsys.readouterr()
    assert captured.err.strip().splitlines()[-1].startswith(
        "interrupted: 2 of 5 turns scored (")
    assert "exact_match" not in captured.out

    calls.clear()
    monkeypatch.setattr(dlmkit.generate, "generate", interrupted_second_batch)
    assert main(["generate", "--model", str(model), "--prompt", "a", "--prompt", "b",
                 "--prompt", "c", "--batch-size", "1", "--max-new-tokens", "2"]) == 130
    captured = capsys.readouterr()
    assert captured.out.startswith("> a\n")  # the finished batch is printed
    assert captured.err.strip() == "interrupted: 1 of 3 prompts decoded (their responses are above)"


def test_eval_names_the_record_too_long_for_the_model(exported, tmp_path, monkeypatch):
    path = tmp_path / "long.jsonl"
    path.write_text(json.dumps({"prompt": "ok", "response": "ko"}) + "\n"
                    + json.dumps({"prompt": "x" * 1100, "response": "y"}) + "\n")
    calls = []
    monkeypatch.setattr("dlmkit.generate.api.generate", lambda *a, **k: calls.append(1))
    with pytest.raises(SystemExit, match=rf"{path}:2 \(assistant turn 1\) is 11\d\d tokens and "
                                         r"4 more are decoded after it: .* the model has 1024"):
        run_eval(exported("ar"), path)
    assert not calls  # checked before the first turn is decoded
