"""The formats people have: ShareGPT, Alpaca, a field mapping, saved Hugging Face datasets and
files `datasets` loads -- each normalised to the same conversations, bad ones named by
file and line or row."""

from __future__ import annotations

import json

import pytest

from dlmkit.data import DataError, load_records
from dlmkit.data.records import check_fields
from dlmkit.train import ConfigError, load_config

USER_A = ({"role": "user", "content": "q"}, {"role": "assistant", "content": "a"})


def write_jsonl(path, items):
    path.write_text("".join((x if isinstance(x, str) else json.dumps(x)) + "\n" for x in items))
    return path


def test_sharegpt(tmp_path):
    f = write_jsonl(tmp_path / "s.jsonl", [
        {"conversations": [{"from": "human", "value": "q"}, {"from": "gpt", "value": "a"}]},
        {"system": "terse", "conversations": [
            {"from": "system", "value": "s"}, {"from": "user", "value": "q"},
            {"from": "assistant", "value": "a"}, {"from": "human", "value": "q2"},
            {"from": "GPT", "value": "a2"}]},
    ])
    first, second = load_records(f)
    assert first.messages == USER_A
    assert [m["role"] for m in second.messages] == ["system", "system", "user", "assistant",
                                                    "user", "assistant"]
    assert second.messages[0]["content"] == "terse" and second.messages[-1]["content"] == "a2"


@pytest.mark.parametrize(("record", "problem"), [
    ({"conversations": [{"from": "human", "value": "q"}, {"from": "tool", "value": "x"}]},
     r"conversations\[1\].from is 'tool'; ShareGPT speakers: human, user, gpt"),
    ({"conversations": [{"from": "human", "value": "q"}]},
     r"no 'assistant' message, so nothing would be supervised: speakers \('from'\) found: "
     r"'human'; an answer's speaker is one of 'gpt', 'assistant', 'chatgpt', 'model'"),
    ({"conversations": [{"from": "human", "text": "q"}]},
     r"conversations\[0\] has no 'value' key \(its keys: 'from', 'text'\); map the name your "
     r"data uses with data.fields, e.g. \{value: text\}"),
    ({"conversations": [{"from": "human", "value": 3}]},
     r"conversations\[0\].value must be a string, got int"),
    ({"conversations": "hi"}, "'conversations' must be a non-empty list"),
    ({"instruction": "do"}, r"missing key 'output' \(a alpaca record needs 'instruction' and "
                            "'output'"),
    ({"instruction": "do", "input": 3, "output": "x"}, "'input' must be a string"),
    ({"conversations": [], "prompt": "a", "response": "b"}, "not both"),
    ({"question": "a", "answer": "b"}, r"unknown record shape .* 'conversations' \[\{from, "
                                       r"value\}\] \(ShareGPT\) .* map other names with "
                                       "data.fields"),
])
def test_bad_records_name_file_line_and_what_is_allowed(tmp_path, record, problem):
    good = {"prompt": "a", "response": "b"}
    f = write_jsonl(tmp_path / "bad.jsonl", [good, record])
    with pytest.raises(DataError, match=problem) as info:
        load_records(f)
    assert info.value.where == f"{f}:2"


def test_alpaca(tmp_path):
    f = write_jsonl(tmp_path / "a.jsonl", [
        {"instruction": "q", "input": "", "output": "a"},
        {"instruction": "Translate", "input": "chat", "output": "cat", "system": "s"},
    ])
    first, second = load_records(f)
    assert first.messages == USER_A
    assert second.messages == ({"role": "system", "content": "s"},
                               {"role": "user", "content": "Translate\n\nchat"},
                               {"role": "assistant", "content": "cat"})


def test_field_mapping(tmp_path):
    f = write_jsonl(tmp_path / "m.jsonl", [
        {"question": "q", "answer": "a", "prompt": "ignored: the mapping names the prompt"},
    ])
    assert load_records(f, {"prompt": "question", "response": "answer"})[0].messages == USER_A
    f = write_jsonl(tmp_path / "n.jsonl", [
        {"dialog": [{"speaker": "user", "text": "q"}, {"speaker": "assistant", "text": "a"}]},
    ])
    mapping = {"messages": "dialog", "role": "speaker", "content": "text"}
    assert load_records(f, mapping)[0].messages == USER_A
    with pytest.raises(DataError, match=r"n.jsonl:1: unknown record shape with keys \['dialog'\]"):
        load_records(f)


@pytest.mark.parametrize(("fields", "problem"), [
    ({"question": "q"}, "fields: unknown field 'question'; fields that can be mapped: prompt, "
                        "response"),
    ({"prompt": ""}, r"fields.prompt must be a non-empty string"),
    (["prompt"], "fields must be a mapping"),
])
def test_bad_field_mapping(fields, problem):
    with pytest.raises(ValueError, match=problem):
        check_fields(fields)


def test_config_data_fields():
    config = load_config(None, ["data.fields={prompt: question, response: answer}"])
    assert config["data"]["fields"] == {"prompt": "question", "response": "answer"}
    with pytest.raises(ConfigError, match="data.fields: unknown field 'prompts'"):
        load_config(None, ["data.fields.prompts=question"])


def test_saved_hf_dataset_and_splits(tmp_path):
    datasets = pytest.importorskip("datasets")
    rows = {"prompt": ["q", "q2"], "response": ["a", "a2"]}
    datasets.Dataset.from_dict(rows).save_to_disk(tmp_path / "one")
    recs = load_records(tmp_path / "one")
    assert recs[0].messages == USER_A and recs[1].source == f"{tmp_path / 'one'}:row 2"

    dd = datasets.DatasetDict({"train": datasets.Dataset.from_dict(rows),
                               "test": datasets.Dataset.from_dict(rows)})
    dd.save_to_disk(tmp_path / "dd")
    with pytest.raises(DataError, match=r"a DatasetDict with splits \['test', 'train'\]; pass one "
                                        "split's directory"):
        load_records(tmp_path / "dd")
    assert len(load_records(tmp_path / "dd" / "train")) == 2
    datasets.DatasetDict({"train": datasets.Dataset.from_dict(rows)}).save_to_disk(tmp_path / "d1")
    assert len(load_records(tmp_path / "d1")) == 2

    sharegpt = [[{"from": "human", "value": "q"}, {"from": "gpt", "value": "a"}],
                [{"from": "human", "value": "q"}, {"from": "robot", "value": "a"}]]
    datasets.Dataset.from_dict({"conversations": sharegpt}).save_to_disk(tmp_path / "bad")
    with pytest.raises(DataError, match="from is 'robot'") as info:
        load_records(tmp_path / "bad")
    assert info.value.where == f"{tmp_path / 'bad'}:row 2"

    (tmp_path / "plain").mkdir()
    with pytest.raises(DataError, match="not a saved Hugging Face dataset"):
        load_records(tmp_path / "plain")


def test_csv_tsv_and_arrow_through_datasets(tmp_path):
    datasets = pytest.importorskip("datasets")
    (tmp_path / "d.csv").write_text('instruction,input,output\nq,,a\n"x, y",z,w\n')
    first, second = load_records(tmp_path / "d.csv")
    assert first.messages == USER_A and second.messages[0]["content"] == "x, y\n\nz"
    (tmp_path / "d.tsv").write_text("question\tanswer\nq\ta\n")
    assert load_records(tmp_path / "d.tsv", {"prompt": "question", "response": "answer"}
                        )[0].messages == USER_A
    (tmp_path / "bad.csv").write_text("prompt,response\nq,a\nq2,\n")
    with pytest.raises(DataError, match="'response' must be a string") as info:
        load_records(tmp_path / "bad.csv")
    assert info.value.where == f"{tmp_path / 'bad.csv'}:row 2"
    ds = datasets.Dataset.from_dict({"prompt": ["q"], "response": ["a"]})
    ds.save_to_disk(tmp_path / "saved")
    arrow = next((tmp_path / "saved").glob("*.arrow"))
    assert load_records(arrow)[0].messages == USER_A


def test_training_reads_mapped_files(tmp_path):
    from dlmkit.data import ByteTokenizer
    from dlmkit.train.recipe import build_datasets

    f = write_jsonl(tmp_path / "t.jsonl", [{"question": "q", "answer": "a"}] * 3)
    config = load_config(None, [f"data.train_files=[{f}]", "data.task=null",
                                "data.fields={prompt: question, response: answer}"])
    train, val = build_datasets(config, ByteTokenizer())
    assert len(train) == 3 and val is None
