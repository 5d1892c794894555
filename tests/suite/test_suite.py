"""The task suite's generator: deterministic files, disjoint splits, the promised shapes, and a
BPE tokenizer that dlmkit loads and supervises like the byte one."""

from __future__ import annotations

import json

import pytest

from dlmkit.data import SFTDataset, load_tokenizer

from . import generate as suite


@pytest.fixture(scope="module")
def written(tmp_path_factory):
    out = tmp_path_factory.mktemp("suite")
    suite.main([str(out)])
    return out


def read(path):
    return [json.loads(line) for line in path.read_text().splitlines()]


def test_the_files_are_deterministic(written, tmp_path):
    suite.write_splits(tmp_path)
    for task in suite.TASKS:
        for split in suite.SPLIT_SIZES:
            assert (tmp_path / task / f"{split}.jsonl").read_bytes() == \
                (written / task / f"{split}.jsonl").read_bytes(), (task, split)


def test_a_new_suite_directory_appears_whole_even_when_two_writers_race(tmp_path, monkeypatch):
    def staged(staging):  # stands in for the (slow) real writer
        (staging / "mine").write_text("")

    monkeypatch.setattr(suite, "write_suite", staged)
    assert suite.main([str(tmp_path / "a" / "data")]) == 0
    assert [p.name for p in (tmp_path / "a").iterdir()] == ["data"]
    assert [p.name for p in (tmp_path / "a" / "data").iterdir()] == ["mine"]

    out = tmp_path / "b" / "data"

    def overtaken(staging):  # another run renames its finished copy into place first
        staged(staging)
        out.mkdir()
        (out / "theirs").write_text("")

    monkeypatch.setattr(suite, "write_suite", overtaken)
    assert suite.main([str(out)]) == 0
    assert [p.name for p in (tmp_path / "b").iterdir()] == ["data"]
    assert [p.name for p in out.iterdir()] == ["theirs"]


@pytest.mark.parametrize("task", suite.TASKS)
def test_splits_are_disjoint_and_end_with_an_answer(written, task):
    splits = {s: read(written / task / f"{s}.jsonl") for s in suite.SPLIT_SIZES}
    assert {s: len(r) for s, r in splits.items()} == suite.SPLIT_SIZES
    keys = {s: {json.dumps(r["messages"][:-1]) + r["messages"][-1]["content"] for r in rows}
            for s, rows in splits.items()}
    assert not keys["train"] & keys["test"] and not keys["train"] & keys["validation"]
    for rows in splits.values():
        for r in rows:
            roles = [m["role"] for m in r["messages"]]
            assert roles == ["user", "assistant"] * (len(roles) // 2)


def test_chat_is_multi_turn_and_answers_span_short_to_long(written):
    chat = read(written / "chat" / "train.jsonl")
    turns = [len(r["messages"]) // 2 for r in chat]
    assert 0.4 < turns.count(1) / len(turns) < 0.6 and max(turns) == 3
    lookup = [len(r["messages"][-1]["content"]) for r in read(written / "lookup" / "train.jsonl")]
    assert min(lookup) <= 4 and max(lookup) >= 30


def test_the_bpe_tokenizer_loads_and_supervises_every_answer(written):
    tok = load_tokenizer(str(written / "bpe"))
    assert tok.vocab_size == suite.BPE_VOCAB and tok.stop_token_ids == (tok.eos_token_id,)
    record = next(r for r in read(written / "chat" / "test.jsonl") if len(r["messages"]) == 6)
    enc = tok.apply_chat_template(record["messages"])
    answers = [tok.decode([i for i, m in zip(enc.input_ids[a:b], enc.loss_mask[a:b]) if m],
                          skip_special_tokens=True) for a, b in enc.assistant_spans]
    assert answers == [m["content"] for m in record["messages"][1::2]]
    assert all(enc.input_ids[b - 1] == tok.eos_token_id for _, b in enc.assistant_spans)
    data = SFTDataset.from_files(written / "chat" / "test.jsonl", tok)  # BPE: fewer tokens
    assert int(data.lengths.max()) < int(SFTDataset.from_files(
        written / "chat" / "test.jsonl", load_tokenizer("byte")).lengths.max())


def test_the_runner_reads_sampler_options_as_set_reads_values():
    import argparse

    from . import run

    parser = argparse.ArgumentParser()
    assert run.sampler_options(parser, ["block_size=1", "remasking=margin", "threshold=0.9"]) \
        == {"block_size": 1, "remasking": "margin", "threshold": 0.9}
    with pytest.raises(SystemExit):  # argparse's error: "--decode takes K=V, got 'steps'"
        run.sampler_options(parser, ["steps"])


def test_the_runner_replaces_an_existing_run_only_with_overwrite(tmp_path, capsys):
    """It once deleted whatever ``--out`` named before training; now an existing directory is
    an error (nothing deleted) unless ``--overwrite``, and a directory that holds no dlmkit run
    is never cleared."""
    from . import run

    data = tmp_path / "data"
    suite.main([str(data)])
    out = tmp_path / "mine"
    out.mkdir()
    (out / "notes.txt").write_text("a user's file")
    argv = ["ar", "arith", "--data", str(data), "--out", str(out), "--set", "train.steps=1"]
    for extra in ([], ["--overwrite"]):
        with pytest.raises(SystemExit) as stopped:
            run.main([*argv, *extra])
        assert stopped.value.code == 2
        assert "holds no dlmkit run" in capsys.readouterr().err
        assert (out / "notes.txt").read_text() == "a user's file"


def test_the_runner_resumes_a_stopped_run_to_the_same_result(tmp_path, capsys, monkeypatch):
    """A suite run stopped after a checkpoint (a session's end) and continued with ``--resume``
    prints the line an uninterrupted run prints, but for the wall times and ``resumed_at``."""
    import dlmkit.train.recipe as recipe

    from . import run

    data = tmp_path / "data"
    suite.main([str(data)])
    argv = ["ar", "arith", "--data", str(data), "--set", "train.steps=4",
            "--set", "train.save_every=2", "--set", "train.val_every=2"]

    def result(out: str, *extra: str) -> dict:
        assert run.main([*argv, "--out", str(tmp_path / out), *extra]) == 0
        line = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
        return {k: v for k, v in line.items() if k not in ("train_s", "score_s")}

    straight = result("straight")
    with pytest.raises(SystemExit) as stopped:  # nothing to continue yet
        run.main([*argv, "--out", str(tmp_path / "stopped"), "--resume"])
    assert stopped.value.code == 2 and "no complete checkpoint" in capsys.readouterr().err

    real_save = recipe.save_checkpoint

    def save_then_stop(*args, **kwargs):
        real_save(*args, **kwargs)
        raise KeyboardInterrupt  # as the session's end, right after the step-2 checkpoint

    monkeypatch.setattr(recipe, "save_checkpoint", save_then_stop)
    with pytest.raises(KeyboardInterrupt):
        run.main([*argv, "--out", str(tmp_path / "stopped")])
    monkeypatch.undo()
    assert not (tmp_path / "stopped" / "final").exists()
    with pytest.raises(SystemExit):  # a different setting is named, not trained silently
        run.main([*argv, "--out", str(tmp_path / "stopped"), "--resume",
                  "--set", "train.lr=0.01"])
    assert "train.lr" in capsys.readouterr().err

    resumed = result("stopped", "--resume")
    assert resumed.pop("resumed_at") == 2
    assert resumed == straight and straight["steps"] == 4
