from __future__ import annotations

import builtins
import json

import pytest

from dlmkit.data import ByteTokenizer, DataError, SFTDataset, load_records, records_from_dicts


def _write_jsonl(path, lines):
    path.write_text("".join(line + "\n" for line in lines))
    return path


def test_jsonl_prompt_response_and_messages(tmp_path):
    f = _write_jsonl(
        tmp_path / "d.jsonl",
        [
            json.dumps({"prompt": "1+1=", "response": "2"}),
            "",
            json.dumps({"prompt": "hi", "response": "yo", "system": "terse"}),
            json.dumps(
                {
                    "messages": [
                        {"role": "user", "content": "a"},
                        {"role": "assistant", "content": "b"},
                    ]
                }
            ),
        ],
    )
    recs = load_records(f)
    assert [r.source for r in recs] == [f"{f}:1", f"{f}:3", f"{f}:4"]
    assert recs[0].messages == (
        {"role": "user", "content": "1+1="},
        {"role": "assistant", "content": "2"},
    )
    assert recs[1].messages[0] == {"role": "system", "content": "terse"}


@pytest.mark.parametrize(
    ("line", "problem"),
    [
        ('{"prompt": "a", "response": ', "malformed JSON"),
        ('{"prompt": "a"}', "missing key 'response'"),
        ('{"prompt": "a", "response": 3}', "'response' must be a string"),
        ('{"text": "a"}', "unknown record shape"),
        ("[1, 2]", r"a JSON list, not a record; a .jsonl file holds one record \(a JSON "
                   r"object\) per line"),
        ('{"messages": []}', "non-empty list"),
        ('{"messages": [{"role": "user", "content": "a"}]}', "no 'assistant' message"),
        ('{"messages": [{"role": "user"}]}', r"messages\[0\] has no 'content' key \(its keys: "
                                             r"'role'\); map the name your data uses with "
                                             r"data.fields, e.g. \{content: NAME\}"),
        ('{"messages": [{"content": "a"}]}', r"messages\[0\] has no 'role' key \(its keys: "
                                             r"'content'\)"),
        ('{"messages": [{"role": "user", "content": null}]}', "content must be a string, got "
                                                            "NoneType"),
        ('{"messages": [{"role": "", "content": "a"}]}', "role must be a non-empty string"),
        ('{"messages": [], "prompt": "a", "response": "b"}', "not both"),
    ],
)
def test_bad_jsonl_record_names_file_line_and_problem(tmp_path, line, problem):
    good = json.dumps({"prompt": "a", "response": "b"})
    f = _write_jsonl(tmp_path / "bad.jsonl", [good, good, line, good])
    with pytest.raises(DataError, match=problem) as info:
        load_records(f)
    assert info.value.where == f"{f}:3"
    assert str(info.value).startswith(f"{f}:3: ")


def test_json_list_reports_the_line_each_record_starts_on(tmp_path):
    f = tmp_path / "d.json"
    f.write_text(
        '[\n  {"prompt": "a", "response": "b"},\n  {"prompt": "c",\n   "response": "d"},\n'
        '  {"prompt": "e"}\n]\n'
    )
    with pytest.raises(DataError, match="missing key 'response'") as info:
        load_records(f)
    assert info.value.where == f"{f}:5"
    f.write_text(
        '[\n  {"prompt": "a", "response": "b"},\n  {"prompt": "c",\n   "response": "d"}\n]'
    )
    assert [r.source for r in load_records(f)] == [f"{f}:2", f"{f}:3"]


@pytest.mark.parametrize(
    ("text", "problem", "line"),
    [
        ('{"prompt": "a", "response": "b"}', "must hold a list", 1),
        ('[\n{"prompt": "a", "response": "b"}\n{"prompt": "a"}]', "expected ',' or ']'", 3),
        ('[\n{"prompt": "a", "response": }]', "malformed JSON", 2),
        ('[{"prompt": "a", "response": "b"}] x', "unexpected text", 1),
    ],
)
def test_malformed_json_list(tmp_path, text, problem, line):
    f = tmp_path / "d.json"
    f.write_text(text)
    with pytest.raises(DataError, match=problem) as info:
        load_records(f)
    assert info.value.where == f"{f}:{line}"


def test_empty_dataset_is_an_error(tmp_path):
    for name, text in (("e.jsonl", "\n\n"), ("e.json", "[ ]")):
        (tmp_path / name).write_text(text)
        with pytest.raises(DataError, match="empty"):
            load_records(tmp_path / name)
    with pytest.raises(DataError, match="no records"):
        records_from_dicts([], source="task:x")
    with pytest.raises(DataError, match="empty"):
        SFTDataset([], ByteTokenizer())


def test_missing_file_bad_extension_and_no_paths(tmp_path):
    with pytest.raises(FileNotFoundError, match="does not exist"):
        load_records(tmp_path / "nope.jsonl")
    (tmp_path / "d.txt").write_text("a,b\n")
    with pytest.raises(ValueError, match=r"'.txt'.*\['.jsonl', '.json', '.parquet', '.csv', "
                                         r"'.tsv', '.arrow'\] or a saved Hugging Face dataset"):
        load_records(tmp_path / "d.txt")
    with pytest.raises(ValueError, match="at least one"):
        load_records([])


def test_several_files_concatenate(tmp_path):
    a = _write_jsonl(tmp_path / "a.jsonl", [json.dumps({"prompt": "a", "response": "b"})])
    b = tmp_path / "b.json"
    b.write_text(json.dumps([{"prompt": "c", "response": "d"}] * 2))
    assert len(load_records([a, b])) == 3


def test_parquet_without_pyarrow_names_the_extra(tmp_path, monkeypatch):
    real_import = builtins.__import__

    def no_pyarrow(name, *args, **kwargs):
        if name.split(".")[0] == "pyarrow":
            raise ImportError("No module named 'pyarrow'")
        return real_import(name, *args, **kwargs)

    monkeypatch.setattr(builtins, "__import__", no_pyarrow)
    (tmp_path / "d.parquet").write_bytes(b"PAR1")
    with pytest.raises(ImportError, match=r"pip install dlmkit\[parquet\]"):
        load_records(tmp_path / "d.parquet")


def test_parquet_round_trip(tmp_path):
    pa = pytest.importorskip("pyarrow")
    pq = pytest.importorskip("pyarrow.parquet")
    table = pa.table({"prompt": ["1+1=", "2+2="], "response": ["2", None]})
    pq.write_table(table, tmp_path / "d.parquet")
    with pytest.raises(DataError, match="'response' must be a string") as info:
        load_records(tmp_path / "d.parquet")
    assert info.value.where == f"{tmp_path / 'd.parquet'}:row 2"
    pq.write_table(pa.table({"prompt": ["1+1="], "response": ["2"]}), tmp_path / "ok.parquet")
    assert load_records(tmp_path / "ok.parquet")[0].messages[1]["content"] == "2"


def test_tokenization_problem_names_file_and_line(tmp_path):
    f = _write_jsonl(
        tmp_path / "d.jsonl",
        [
            json.dumps({"prompt": "a", "response": "b"}),
            json.dumps(
                {
                    "messages": [
                        {"role": "tool", "content": "x"},
                        {"role": "assistant", "content": "y"},
                    ]
                }
            ),
        ],
    )
    with pytest.raises(DataError, match="'tool'") as info:
        SFTDataset.from_files(f, ByteTokenizer())
    assert info.value.where == f"{f}:2"
