from __future__ import annotations

import json

import pytest
import torch

from dlmkit.data import ByteTokenizer, DataError, Record, SFTDataset
from dlmkit.data import __all__ as public_names


def test_items_carry_ids_mask_and_sample_index():
    tok = ByteTokenizer()
    ds = SFTDataset([{"prompt": "ab", "response": "c"}, {"prompt": "d", "response": "ef"}], tok)
    assert len(ds) == 2
    item = ds[1]
    assert item["sample_index"] == 1
    assert item["input_ids"].dtype == torch.long
    enc = tok.apply_chat_template(
        [{"role": "user", "content": "d"}, {"role": "assistant", "content": "ef"}]
    )
    assert item["input_ids"].tolist() == enc.input_ids
    assert item["loss_mask"].tolist() == enc.loss_mask
    assert ds.lengths.tolist() == [len(ds[0]["input_ids"]), len(enc.input_ids)]
    assert ds.num_supervised_tokens == 2 + 3  # "c<|end|>" + "ef<|end|>"
    assert ds[-1]["sample_index"] == 1
    with pytest.raises(IndexError, match=r"\[0, 2\)"):
        ds[2]


def test_from_files_and_records(tmp_path):
    f = tmp_path / "d.jsonl"
    f.write_text(json.dumps({"prompt": "x", "response": "y"}) + "\n")
    ds = SFTDataset.from_files(f, ByteTokenizer())
    assert ds.sources == [f"{f}:1"]
    rec = Record(({"role": "user", "content": "a"}, {"role": "assistant", "content": "b"}), "s")
    assert len(SFTDataset([rec], ByteTokenizer())) == 1


def test_bad_dict_record_is_named_and_bad_tokenizer_is_rejected():
    with pytest.raises(DataError, match=r"mine\[1\]: missing key 'response'"):
        SFTDataset(
            [{"prompt": "a", "response": "b"}, {"prompt": "a"}], ByteTokenizer(), source="mine"
        )
    with pytest.raises(TypeError, match="tokenizer must be a dlmkit Tokenizer"):
        SFTDataset([{"prompt": "a", "response": "b"}], object())


def test_seed_helpers_are_reexported_when_present():
    import importlib.util

    import dlmkit.data as data

    if importlib.util.find_spec("dlmkit.data.seeds") is None:
        pytest.skip("dlmkit/data/seeds.py not written yet")
    assert callable(data.sample_seed) and callable(data.validation_seed)
    assert {"sample_seed", "validation_seed"} <= set(public_names)


def test_supervised_lengths_count_each_examples_response():
    from dlmkit.data import ByteTokenizer

    tok = ByteTokenizer()
    ds = SFTDataset([{"prompt": "a", "response": "xyz"}, {"prompt": "bb", "response": "q"}], tok)
    # the response bytes plus the end-of-turn marker are supervised
    assert ds.supervised_lengths.tolist() == [4, 2]
    assert int(ds.supervised_lengths.sum()) == ds.num_supervised_tokens


def test_longest_responses_are_each_examples_longest_assistant_turn():
    from dlmkit.data import ByteTokenizer

    tok = ByteTokenizer()
    ds = SFTDataset([
        {"messages": [{"role": "user", "content": "a"}, {"role": "assistant", "content": "xyz"},
                      {"role": "user", "content": "b"}, {"role": "assistant", "content": "q"}]},
        {"prompt": "bb", "response": "qrstu"},
        {"messages": [{"role": "user", "content": "a"}, {"role": "assistant", "content": "x"},
                      {"role": "user", "content": "b"}, {"role": "assistant", "content": "qr"}]},
    ], tok)
    # bytes + the end-of-turn marker of the longest turn (the sums would be 6, 6, 5)
    assert ds.longest_responses.tolist() == [4, 6, 3]
    assert ds.supervised_lengths.tolist() == [6, 6, 5]
