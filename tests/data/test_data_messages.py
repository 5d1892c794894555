"""Data-file mistakes people make, each answered with the file, the line and what to do.

Before: roles 'human'/'gpt' or 'User'/'Assistant' got "no 'assistant' message" without the
roles found; a byte that is not UTF-8 got Python's "'utf-8' codec can't decode byte 0xf6 in
position 3558" with no file or line; a pretty-printed JSON list saved as .jsonl got "malformed
JSON" with no hint; {"role", "text"} got "content must be a string, got NoneType"; empty
answers and turns after the last answer trained without a word.
"""

from __future__ import annotations

import json
import re
import warnings

import pytest

from dlmkit.data import ByteTokenizer, DataError, DataWarning, SFTDataset, load_records

GOOD = {"prompt": "a", "response": "b"}


def write_jsonl(path, items):
    path.write_text("".join(json.dumps(x) + "\n" for x in items))
    return path


def messages(*turns):
    return {"messages": [{"role": r, "content": c} for r, c in turns]}


def error_of(path):
    with pytest.raises(DataError) as info:
        load_records(path)
    return info.value


def test_sharegpt_speaker_names_as_roles_are_named_with_the_roles_allowed(tmp_path):
    f = write_jsonl(tmp_path / "d.jsonl", [GOOD, messages(("human", "q"), ("gpt", "a"))])
    err = error_of(f)
    assert err.where == f"{f}:2"
    assert err.problem == (
        "no 'assistant' message, so nothing would be supervised: roles found: 'human', 'gpt'; "
        "roles allowed: 'system', 'user', 'assistant' (the 'assistant' turns are the answers "
        "learned); 'human', 'gpt' are ShareGPT speaker names: rename to 'user' / 'assistant', "
        'or write the record as ShareGPT {"conversations": [{"from": ..., "value": ...}]}, '
        "which maps them")


def test_capitalised_roles_are_named_with_their_lowercase_spelling(tmp_path):
    f = write_jsonl(tmp_path / "d.jsonl", [messages(("User", "q"), ("Assistant", "a"))])
    err = error_of(f)
    assert err.where == f"{f}:1"
    assert err.problem.startswith("no 'assistant' message, so nothing would be supervised: "
                                  "roles found: 'User', 'Assistant'; roles allowed: 'system', "
                                  "'user', 'assistant'")
    assert err.problem.endswith("; roles are lowercase: 'User' should be 'user', 'Assistant' "
                                "should be 'assistant'")
    assert "ShareGPT" not in err.problem


def test_unknown_roles_without_an_answer_are_listed_without_a_wrong_hint(tmp_path):
    f = write_jsonl(tmp_path / "d.jsonl", [messages(("user", "q"), ("bot", "a"), ("user", "b"))])
    assert error_of(f).problem == (
        "no 'assistant' message, so nothing would be supervised: roles found: 'user', 'bot'; "
        "roles allowed: 'system', 'user', 'assistant' (the 'assistant' turns are the answers "
        "learned)")


def test_a_byte_that_is_not_utf8_is_named_by_file_line_and_byte(tmp_path):
    f = tmp_path / "latin1.jsonl"
    lines = [json.dumps(GOOD)] * 3 + ['{"prompt": "K\u00f6ln", "response": "b"}']
    f.write_bytes("\n".join(lines).encode("latin-1") + b"\n")
    err = error_of(f)
    assert err.where == f"{f}:4"
    assert err.problem == ("not UTF-8 text: byte 0xf6 at byte 14 of the line (invalid start "
                           "byte); data files are read as UTF-8, so convert it, e.g. with "
                           "`iconv -f latin1 -t utf-8` if it is Latin-1")


def test_a_json_list_file_that_is_not_utf8_is_named_by_line(tmp_path):
    f = tmp_path / "latin1.json"
    f.write_bytes(json.dumps([GOOD, GOOD, {"prompt": "caf\u00e9", "response": "b"}],
                             indent=1, ensure_ascii=False).encode("latin-1"))
    err = error_of(f)
    assert err.where == f"{f}:11"  # '[', then 4 lines a record: the third record's prompt
    assert err.problem.startswith("not UTF-8 text: byte 0xe9 at byte 17 of the line")


def test_a_pretty_printed_json_list_saved_as_jsonl_says_so(tmp_path):
    f = tmp_path / "list.jsonl"
    f.write_text(json.dumps([GOOD, GOOD], indent=2))
    err = error_of(f)
    assert err.where == f"{f}:1"
    assert err.problem == ("malformed JSON (Expecting value at column 2); the file looks like a "
                           "JSON list (it starts with '['); a .jsonl file holds one record (a "
                           "JSON object) per line: rename it to .json (a JSON list of records) "
                           "or write one record per line")
    f.rename(tmp_path / "list.json")  # the advice works
    assert len(load_records(tmp_path / "list.json")) == 2


def test_a_one_line_json_list_and_pretty_printed_records_in_jsonl_say_so(tmp_path):
    one_line = tmp_path / "one.jsonl"
    one_line.write_text(json.dumps([GOOD, GOOD]) + "\n")
    assert error_of(one_line).problem.startswith("a JSON list, not a record; a .jsonl file "
                                                 "holds one record (a JSON object) per line")
    pretty = tmp_path / "pretty.jsonl"
    pretty.write_text(json.dumps(GOOD) + "\n" + json.dumps(GOOD, indent=2) + "\n")
    err = error_of(pretty)
    assert err.where == f"{pretty}:2"
    assert "the line looks like part of pretty-printed JSON (a record spread over several " \
           "lines)" in err.problem
    truncated = tmp_path / "cut.jsonl"  # a plain syntax error gets no guess
    truncated.write_text('{"prompt": "a", "response": \n')
    assert error_of(truncated).problem == "malformed JSON (Expecting value at column 29)"


def test_text_instead_of_content_names_the_keys_and_the_mapping(tmp_path):
    f = write_jsonl(tmp_path / "d.jsonl", [{"messages": [{"role": "user", "text": "q"},
                                                          {"role": "assistant", "text": "a"}]}])
    err = error_of(f)
    assert err.where == f"{f}:1"
    assert err.problem == ("messages[0] has no 'content' key (its keys: 'role', 'text'); map "
                           "the name your data uses with data.fields, e.g. {content: text}")
    # ... and the mapping it proposes reads the file
    assert load_records(f, {"content": "text"})[0].messages[1]["content"] == "a"
    with pytest.raises(DataError, match=r"messages\[0\] has no 'body' key \(its keys: 'role', "
                                        r"'text'\); data.fields maps 'content' to 'body'"):
        load_records(f, {"content": "body"})


def test_empty_answers_and_turns_after_the_last_answer_are_counted_with_their_lines(tmp_path):
    rows = [GOOD, {"prompt": "a", "response": ""},
            messages(("user", "q"), ("assistant", "a"), ("user", "and then?")),
            {"instruction": "x", "output": "  \n"}, GOOD,
            {"conversations": [{"from": "human", "value": "q"}, {"from": "gpt", "value": ""}]}]
    f = write_jsonl(tmp_path / "d.jsonl", rows)
    with pytest.warns(DataWarning) as caught:
        records = load_records(f)
    assert len(records) == 6  # warned, not dropped
    assert [str(w.message) for w in caught] == [
        f"{f}: 3 records have an empty response (lines 2, 4, 6): it teaches the model to "
        "answer nothing",
        f"{f}: 1 record ends with a 'user' turn after the last answer (line 3): nothing is "
        "trained on it (only 'assistant' turns are supervised)"]


def test_the_lines_listed_are_capped(tmp_path):
    f = write_jsonl(tmp_path / "d.jsonl", [{"prompt": "a", "response": ""}] * 12)
    with pytest.warns(DataWarning, match=re.escape(
            "12 records have an empty response (lines 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, ... "
            "(2 more))")):
        load_records(f)


def test_in_memory_records_are_named_by_index():
    with pytest.warns(DataWarning, match=re.escape("mine: 1 record has an empty response "
                                                   "(mine[1])")):
        SFTDataset([GOOD, {"prompt": "a", "response": ""}], ByteTokenizer(), source="mine")


def test_clean_data_warns_nothing(tmp_path):
    f = write_jsonl(tmp_path / "d.jsonl", [GOOD, messages(("system", "s"), ("user", "q"),
                                                          ("assistant", "a"))])
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        SFTDataset(load_records(f), ByteTokenizer())
        SFTDataset([GOOD], ByteTokenizer())
