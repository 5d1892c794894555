"""data.split_tokens: the split table, the splitting rule and its limits."""

from __future__ import annotations

import pytest
import torch

from dlmkit.data import ByteTokenizer, load_tokenizer
from dlmkit.data.split_tokens import PieceSplits, piece_splits, split_sample

# "ab" = a|b; "abb" = a|bb or ab|b; "bb" = b|b; "ba" = b|a; "xyz" has no split.
PIECES = {0: "a", 1: "b", 2: "ab", 3: "abb", 4: "bb", 5: "ba", 6: "xyz"}


def sample(ids, mask=None, **extra):
    mask = [1] * len(ids) if mask is None else mask
    return {"input_ids": torch.tensor(ids), "loss_mask": torch.tensor(mask), **extra}


def spell(ids) -> str:
    return "".join(PIECES[int(i)] for i in ids)


def gen(seed: int = 0) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


def test_the_table_lists_every_two_piece_spelling_by_split_point():
    splits = PieceSplits(PIECES)
    assert splits.pairs == {2: [(0, 1)], 3: [(0, 4), (2, 1)], 4: [(1, 1)], 5: [(1, 0)]}
    assert len(splits) == 4


def test_a_piece_written_by_two_ids_is_split_into_the_lower_one():
    assert PieceSplits({0: "a", 1: "b", 2: "ab", 7: "a"}).pairs == {2: [(0, 1)]}


def test_probability_one_spells_every_piece_out_and_each_piece_keeps_its_mask():
    s = sample([3, 6, 5, 2], mask=[0, 0, 1, 1], sample_index=7)
    out = split_sample(s, PieceSplits(PIECES), 1.0, gen())
    assert out["input_ids"].tolist() == [0, 1, 1, 6, 1, 0, 0, 1]  # a b b xyz b a a b
    assert out["loss_mask"].tolist() == [0, 0, 0, 0, 1, 1, 1, 1]
    assert out["sample_index"] == 7 and out["input_ids"].dtype == torch.long


def test_without_supervised_only_the_prompt_splits():
    s = sample([3, 2, 3, 2], mask=[0, 0, 1, 1])
    out = split_sample(s, PieceSplits(PIECES), 1.0, gen(), supervised=False)
    assert out["input_ids"].tolist() == [0, 1, 1, 0, 1, 3, 2]
    assert out["loss_mask"].tolist() == [0, 0, 0, 0, 0, 1, 1]


def test_probability_zero_and_unsplittable_pieces_leave_the_sample_as_it_is():
    s = sample([3, 6, 5, 2])
    assert split_sample(s, PieceSplits(PIECES), 0.0, gen())["input_ids"].tolist() == [3, 6, 5, 2]
    assert split_sample(sample([0, 6, 1]), PieceSplits(PIECES), 1.0,
                        gen())["input_ids"].tolist() == [0, 6, 1]


def test_the_text_never_changes_and_the_draws_are_a_function_of_the_generator():
    splits = PieceSplits(PIECES)
    ids = torch.randint(0, 7, (200,), generator=gen(5)).tolist()
    outs = [split_sample(sample(ids), splits, 0.4, gen(seed)) for seed in (1, 1, 2)]
    for out in outs:
        assert spell(out["input_ids"]) == spell(ids)
    assert torch.equal(outs[0]["input_ids"], outs[1]["input_ids"])
    assert not torch.equal(outs[0]["input_ids"], outs[2]["input_ids"])


def test_each_token_splits_with_the_given_probability():
    # "bb" splits only into b|b, which never split again: each split adds exactly one token.
    n, p = 4000, 0.3
    out = split_sample(sample([4] * n), PieceSplits(PIECES), p, gen(3))
    splits = len(out["input_ids"]) - n
    assert abs(splits - n * p) < 5 * (n * p * (1 - p)) ** 0.5  # 5 sigma


def test_a_split_piece_splits_again_with_the_same_probability():
    # "abb" -> (a, bb) or (ab, b); each of bb / ab splits again with p: E[tokens] = 1 + p + p*p.
    n, p = 4000, 0.5
    out = split_sample(sample([3] * n), PieceSplits(PIECES), p, gen(4))
    assert abs(len(out["input_ids"]) / n - (1 + p + p * p)) < 0.05
    assert spell(out["input_ids"]) == "abb" * n


def test_the_limit_caps_the_length_and_a_sample_at_it_is_untouched():
    splits = PieceSplits(PIECES)
    out = split_sample(sample([3] * 10), splits, 1.0, gen(), limit=14)
    assert len(out["input_ids"]) == 14 and spell(out["input_ids"]) == "abb" * 10
    at = sample([3] * 10)
    assert split_sample(at, splits, 1.0, gen(), limit=10)["input_ids"].tolist() == [3] * 10
    assert split_sample(at, splits, 1.0, gen(), limit=8)["input_ids"].tolist() == [3] * 10


def test_the_byte_tokenizer_has_nothing_to_split():
    assert len(piece_splits(ByteTokenizer())) == 0


def test_a_bpe_keeps_its_text_and_never_splits_a_special_token(hf_tokenizer_dir):
    tok = load_tokenizer(str(hf_tokenizer_dir))
    splits = piece_splits(tok)
    assert len(splits) > 0 and not set(splits.pairs) & tok.special_token_ids
    enc = tok.apply_chat_template([{"role": "user", "content": "the quick brown fox"},
                                   {"role": "assistant", "content": "jumps over the lazy dog"}])
    s = sample(enc.input_ids, enc.loss_mask)
    for seed in range(5):
        out = split_sample(s, splits, 0.5, gen(seed))
        assert tok.decode(out["input_ids"]) == tok.decode(enc.input_ids)
        special = [i for i in out["input_ids"].tolist() if i in tok.special_token_ids]
        assert special == [i for i in enc.input_ids if i in tok.special_token_ids]
        # the supervised text is the response's, however it was cut
        kept = out["input_ids"][out["loss_mask"] == 1]
        assert tok.decode(kept) == tok.decode([i for i, m in zip(enc.input_ids, enc.loss_mask)
                                               if m])
    assert len(split_sample(s, splits, 1.0, gen())["input_ids"]) > len(enc.input_ids)


@pytest.mark.parametrize("bad", [-0.1, 1.5, True, "0.2"])
def test_the_config_rejects_a_share_outside_zero_to_one(bad):
    from dlmkit.train import load_config
    from dlmkit.train.config import ConfigError

    with pytest.raises(ConfigError, match=r"data.split_tokens must be a number in \[0, 1\]"):
        load_config(None, [f"data.split_tokens={bad!r}" if isinstance(bad, str)
                           else f"data.split_tokens={str(bad).lower()}"])


def test_the_config_rejects_a_split_responses_that_is_not_a_bool():
    from dlmkit.train import load_config
    from dlmkit.train.config import ConfigError

    with pytest.raises(ConfigError, match="data.split_responses must be true or false"):
        load_config(None, ["data.split_responses=1"])
    with pytest.raises(ConfigError, match="split_responses: true does nothing while data.split"):
        load_config(None, ["data.split_responses=true"])
    assert load_config(None, ["data.split_responses=true", "data.split_tokens=0.2"])["data"][
        "split_responses"] is True
