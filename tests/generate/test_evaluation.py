"""Evaluation on your own data: every assistant turn scored (teacher-forced history), summaries
checked against a hand count, and the `dlmkit eval --data` / `generate --file` commands."""

import json

import pytest
import torch

from dlmkit.cli import main
from dlmkit.data import load_records
from dlmkit.generate import encode_prompt, sampler_config
from dlmkit.generate.evaluation import conversation_turns, score_turns, summarize

from .helpers import TOK, Rigged, V, tiny_model

O, K, END = ord("o"), ord("k"), TOK.stop_token_ids[-1]


def says_ok(ids, pos):
    """A causal 'model' that answers "ok" to anything: o after any token but o/k, k after o,
    then the end-of-turn marker after k."""
    nxt = torch.where(ids == O, K, torch.where(ids == K, END, O))
    return torch.nn.functional.one_hot(nxt, V).float() * 10


# (record, per-turn exact match of the answer "ok") -- the hand count below comes from these.
DATA = [
    ({"prompt": "a", "response": "ok"}, [True]),
    ({"prompt": "b", "response": "no"}, [False]),
    ({"messages": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "ok"},
                   {"role": "user", "content": "again"},
                   {"role": "assistant", "content": "ok"}]}, [True, True]),
    ({"messages": [{"role": "system", "content": "be brief"},
                   {"role": "user", "content": "1"}, {"role": "assistant", "content": "ok"},
                   {"role": "user", "content": "2"}, {"role": "assistant", "content": "nope"},
                   {"role": "user", "content": "3"},
                   {"role": "assistant", "content": " ok "}]}, [True, False, True]),
]


@pytest.fixture
def data_file(tmp_path):
    path = tmp_path / "test.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r, _ in DATA))
    return path


def test_every_turn_scored_with_reference_history(data_file):
    model = Rigged(says_ok)
    turns = conversation_turns(load_records(data_file))
    assert [t.position for t in turns] == [1, 1, 1, 2, 1, 2, 3]
    rows, totals = score_turns(model, TOK, turns,
                               sampler_config("ar", max_new_tokens=8), batch_size=1)
    assert [r["correct"] for r in rows] == [hit for _, hits in DATA for hit in hits]
    assert all(r["prediction"] == "ok" and r["forwards"] == 3 for r in rows)  # o, k, end
    assert totals.forwards == 3 * len(rows)
    # Turn 2 of the last conversation is generated after the *reference* first answer.
    messages = DATA[3][0]["messages"]
    assert rows[5]["prompt"] == messages[:4] and rows[5]["reference"] == "nope"
    first_calls = [call for call in model.calls if call[0].shape[1] > 1]
    assert first_calls[5][0][0].tolist() == encode_prompt(TOK, messages[:4])
    # Hand count: 7 turns, 5 exact; turn 1: 3/4, turn 2: 1/2, turn 3: 1/1; 2/4 conversations.
    assert summarize(rows) == {"turns": 7, "turns_correct": 5,
                               "by_turn": {1: (3, 4), 2: (1, 2), 3: (1, 1)},
                               "conversations": 4, "conversations_correct": 2}


def test_last_turn_only_and_batching(data_file):
    turns = conversation_turns(load_records(data_file), last_turn_only=True)
    assert [t.reference for t in turns] == ["ok", "no", "ok", " ok "]
    rows, _ = score_turns(Rigged(says_ok), TOK, turns,
                          sampler_config("ar", max_new_tokens=8), batch_size=3)
    assert summarize(rows)["turns_correct"] == 3
    assert summarize(rows)["conversations_correct"] == 3
    with pytest.raises(ValueError, match="batch_size must be an int >= 1"):
        score_turns(Rigged(says_ok), TOK, turns, sampler_config("ar"), batch_size=0)


def test_encode_prompt_conversations():
    conversation = [{"role": "user", "content": "x"}, {"role": "assistant", "content": "y"},
                    {"role": "user", "content": "z"}]
    ids = encode_prompt(TOK, conversation)
    assert ids == TOK.apply_chat_template(conversation, add_generation_prompt=True).input_ids
    assert encode_prompt(TOK, "x") == encode_prompt(TOK, conversation[:1])
    assert encode_prompt(TOK, [5, 6]) == [5, 6]
    with pytest.raises(ValueError, match="must not end with an assistant message"):
        encode_prompt(TOK, conversation[:2])


@pytest.fixture(scope="module")
def files_model(tmp_path_factory):
    """An export of a model trained on files (dlmkit.json records no task)."""
    path = tmp_path_factory.mktemp("files_model")
    tiny_model().save_pretrained(path)
    TOK.save_pretrained(path)
    (path / "dlmkit.json").write_text(json.dumps({
        "strategy": "mdlm", "block_size": None, "task": None,
        "mask_token_id": TOK.mask_token_id, "options": {}, "max_new_tokens": 4}))
    return path


def test_eval_data_command(files_model, data_file, tmp_path, capsys):
    out_file = tmp_path / "predictions.jsonl"
    assert main(["eval", "--model", str(files_model), "--data", str(data_file), "--output",
                 str(out_file), "--batch-size", "4", "--no-progress"]) == 0
    lines = capsys.readouterr().out.strip().splitlines()
    rows = [json.loads(line) for line in out_file.read_text().splitlines()]
    assert len(rows) == 7
    assert {"prompt", "reference", "prediction", "forwards", "correct"} <= set(rows[0])
    assert all(r["forwards"] >= 1 for r in rows)
    assert all(r["correct"] == (r["prediction"].strip() == r["reference"].strip())
               for r in rows)
    hits = sum(r["correct"] for r in rows)
    assert lines[-1] == f"exact_match: {100.0 * hits / 7:.1f}%"
    assert any(line.startswith("turn 3: ") for line in lines)
    assert any(line.startswith("conversations: ") for line in lines)

    assert main(["eval", "--model", str(files_model), "--data", str(data_file), "--last-turn",
                 "--output", str(out_file), "--no-progress"]) == 0
    assert [r["turn"] for r in map(json.loads, out_file.read_text().splitlines())] == \
        [1, 1, 2, 3]


def test_progress_lines_in_a_log(data_file, capsys):
    """stderr is not a terminal here (a log file): one plain line per batch, no bar."""
    turns = conversation_turns(load_records(data_file))
    score_turns(Rigged(says_ok), TOK, turns, sampler_config("ar", max_new_tokens=8),
                batch_size=4, progress=True)
    lines = capsys.readouterr().err.strip().splitlines()
    assert [line.split("  ")[0] for line in lines] == ["eval: 4/7 turns", "eval: 7/7 turns"]
    assert "exact so far 71.4%" in lines[-1] and "\r" not in "".join(lines)


def test_eval_data_field_mapping(files_model, tmp_path, capsys):
    data = tmp_path / "qa.jsonl"
    data.write_text('{"question": "a", "answer": "b"}\n{"question": "c", "answer": "d"}\n')
    out_file = tmp_path / "p.jsonl"
    assert main(["eval", "--model", str(files_model), "--data", str(data), "--field",
                 "prompt=question", "--field", "response=answer", "--output", str(out_file),
                 "--no-progress"]) == 0
    assert [r["reference"] for r in map(json.loads, out_file.read_text().splitlines())] == \
        ["b", "d"]
    with pytest.raises(SystemExit, match="unknown record shape"):
        main(["eval", "--model", str(files_model), "--data", str(data), "--no-progress"])
    with pytest.raises(SystemExit, match="--field expects FIELD=NAME"):
        main(["eval", "--model", str(files_model), "--data", str(data), "--field", "prompt"])


def test_eval_without_task_or_data_says_how(files_model, tmp_path, capsys):
    with pytest.raises(SystemExit, match="pass a test file in the training format with --data"):
        main(["eval", "--model", str(files_model)])
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"prompt": "a", "response": "b"}\n{"question": "a"}\n')
    with pytest.raises(SystemExit, match=r"bad.jsonl:2: unknown record shape"):
        main(["eval", "--model", str(files_model), "--data", str(bad), "--no-progress"])
    with pytest.raises(SystemExit, match="--last-turn applies to --data files only"):
        main(["eval", "--model", str(files_model), "--task", "reverse", "--last-turn"])


def test_generate_file_with_messages(files_model, tmp_path, capsys):
    prompts = tmp_path / "p.jsonl"
    conversation = [{"role": "user", "content": "a"}, {"role": "assistant", "content": "b"},
                    {"role": "user", "content": "c"}]
    prompts.write_text(json.dumps({"messages": conversation}) + '\n{"prompt": "x"}\n')
    assert main(["generate", "--model", str(files_model), "--file", str(prompts),
                 "--json"]) == 0
    lines = [json.loads(x) for x in capsys.readouterr().out.strip().splitlines()]
    assert lines[0]["messages"] == conversation and lines[1]["prompt"] == "x"
    prompts.write_text(json.dumps({"messages": conversation[:2]}) + "\n")
    with pytest.raises(SystemExit, match=r"p.jsonl:1: 'messages' must be a non-empty list "
                                         "ending with a non-assistant turn"):
        main(["generate", "--model", str(files_model), "--file", str(prompts)])
