from __future__ import annotations

import pytest

from dlmkit.data import SPLITS, ByteTokenizer, SFTDataset, get_task, task_names
from dlmkit.data.tasks import LONG_TASKS


def test_task_names_and_unknown_task():
    assert {"addition", "copy", "reverse", "sort"} <= set(task_names())
    with pytest.raises(ValueError, match=r"\['addition', 'copy', 'reverse', 'sort'\].*'nope'"):
        get_task("nope")
    with pytest.raises(ValueError, match="max_digits"):
        get_task("addition", max_digits=0)
    with pytest.raises(ValueError, match="bad parameters"):
        get_task("sort", digits=3)
    with pytest.raises(ValueError, match="max_len"):
        get_task("reverse", max_len=9)
    with pytest.raises(ValueError, match="alphabet"):
        get_task("reverse", alphabet="aab")


@pytest.mark.parametrize("name", ["addition", "reverse", "sort"])
def test_splits_are_disjoint_deterministic_and_correct(name):
    task = get_task(name)
    splits = {s: task.records(s) for s in SPLITS}
    prompts = {s: {r["prompt"] for r in recs} for s, recs in splits.items()}
    for s, recs in splits.items():
        assert len(prompts[s]) == len(recs)  # no repeats within a split
        assert all(task.split_of(p) == s for p in prompts[s])
    assert not prompts["train"] & prompts["validation"]
    assert not prompts["train"] & prompts["test"]
    assert not prompts["validation"] & prompts["test"]
    assert task.records("validation") == splits["validation"]  # deterministic
    assert task.records("validation", seed=1) != splits["validation"]
    for r in splits["test"]:
        assert 1 <= len(r["response"]) <= 8
        p = r["prompt"]
        if name == "addition":
            a, b = p[:-1].split("+")
            assert int(r["response"]) == int(a) + int(b)
        elif name == "reverse":
            assert r["response"] == p.split(" ")[1][::-1]
        else:
            assert r["response"] == "".join(sorted(p.split(" ")[1]))


def test_large_space_uses_sampling_and_stays_disjoint():
    task = get_task("addition", max_digits=4)  # 10^8 problems: never enumerated
    train = {r["prompt"] for r in task.records("train", n=3000)}
    test = {r["prompt"] for r in task.records("test", n=500)}
    assert len(train) == 3000 and len(test) == 500 and not train & test
    assert max(len(r["response"]) for r in task.records("test", n=200)) <= 5


def test_split_size_limits():
    task = get_task("addition", max_digits=1)  # 100 problems
    total = sum(len(task.records(s)) for s in SPLITS)  # defaults are capped at what exists
    assert total == 100
    with pytest.raises(ValueError, match="holds"):
        task.records("test", n=1000)
    with pytest.raises(ValueError, match="split must be one of"):
        task.records("dev")
    with pytest.raises(ValueError, match="n must be a positive int"):
        task.records("train", n=0)


def test_task_examples_are_short_with_the_byte_tokenizer():
    tok = ByteTokenizer()
    for name in sorted(set(task_names()) - set(LONG_TASKS)):
        ds = SFTDataset.from_task(name, "validation", tok)
        assert int(ds.lengths.max()) <= 20
        for i in range(len(ds)):
            assert int(ds[i]["loss_mask"].sum()) <= 9  # <= 8 response bytes + <|end|>


def test_long_copy_task_spans_several_blocks():
    task = get_task("copy")
    splits = {s: task.records(s, n=300) for s in SPLITS}
    prompts = {s: {r["prompt"] for r in recs} for s, recs in splits.items()}
    assert not prompts["train"] & prompts["test"] and not prompts["validation"] & prompts["test"]
    for r in splits["test"]:
        assert r["response"] == r["prompt"].removeprefix("copy ") and len(r["response"]) == 32
        assert task.split_of(r["prompt"]) == "test"
    ds = SFTDataset.from_task("copy", "validation", ByteTokenizer(), n=50)
    assert int(ds.supervised_lengths.min()) == 33  # 32 letters + <|end|>: >= 32 generated
    ranged = get_task("copy", min_len=40, max_len=48).records("test", n=50)
    assert {len(r["response"]) for r in ranged} <= set(range(40, 49))
    with pytest.raises(ValueError, match=r"max_len must be an int in \[32, 64\]"):
        get_task("copy", max_len=65)
