"""data.split_tokens in the recipe: seeded per (seed, step, sample), bounded by the row
length, refused where it would do nothing, and a run trains with it."""

from __future__ import annotations

import json
import math

import pytest
import torch

from dlmkit.cli import main
from dlmkit.train.config import ConfigError
from dlmkit.train.distributed import World
from dlmkit.train.recipe import build_components, prepare_micro_batches
from tests.data.helpers import build_hf_tokenizer

from .helpers import cli_args, config, records

CPU = World(rank=0, world_size=1, local_rank=0, device=torch.device("cpu"))
WORDS = "hello world the quick brown fox jumps over lazy dog".split()


@pytest.fixture(scope="module")
def bpe_data(tmp_path_factory):
    """A BPE tokenizer directory and a train / validation file of word-reversal records."""
    root = tmp_path_factory.mktemp("split")
    build_hf_tokenizer(pad=True).save_pretrained(str(root / "tok"))
    rng = torch.Generator().manual_seed(0)
    for name, n in (("train", 64), ("validation", 16)):
        with open(root / f"{name}.jsonl", "w") as f:
            for _ in range(n):
                words = [WORDS[int(i)] for i in torch.randint(0, len(WORDS), (3,), generator=rng)]
                f.write(json.dumps({"prompt": " ".join(words),
                                    "response": " ".join(reversed(words))}) + "\n")
    return root


def bpe(root, *extra):
    return ("data.task=null", f"data.tokenizer={root / 'tok'}",
            f"data.train_files=[{root / 'train.jsonl'}]",
            f"data.validation_files=[{root / 'validation.jsonl'}]", *extra)


def rows(root, share, step=0, strategy="mdlm", responses=True):
    responses = responses and share > 0  # split_responses needs a share to split
    items = bpe(root, f"data.split_tokens={share}", f"data.split_responses={responses}")
    cfg = config(*items, strategy=strategy)
    c = build_components(cfg, CPU)
    (batch,) = prepare_micro_batches(step, c.step_context(cfg, CPU))
    return c, batch


def texts(c, batch) -> list[str]:
    ids = batch["target_ids"]  # the clean tokens (pad and block fill included)
    return [c.tokenizer.decode([int(i) for i in row if int(i) != c.tokenizer.pad_token_id
                                and int(i) != c.tokenizer.eos_token_id])
            for row in ids]


def content_tokens(c, batch) -> int:
    ids = batch["target_ids"]
    return int(((ids != c.tokenizer.pad_token_id) & (ids != c.tokenizer.eos_token_id)).sum())


def supervised(c, batch) -> list[list[int]]:
    """Each row's supervised tokens, block fill and padding left out."""
    fill = (c.tokenizer.pad_token_id, c.tokenizer.eos_token_id)
    return [[int(t) for t, m in zip(ids, mask) if m and int(t) not in fill]
            for ids, mask in zip(batch["target_ids"], batch["loss_mask"])]


def test_splitting_keeps_every_row_text_and_is_a_function_of_the_step(bpe_data):
    c, plain = rows(bpe_data, 0.0)
    _, split = rows(bpe_data, 0.5)
    _, again = rows(bpe_data, 0.5)
    _, later = rows(bpe_data, 0.5, step=1)
    assert texts(c, split) == texts(c, plain)
    assert torch.equal(split["target_ids"], again["target_ids"])  # so a resume sees the same
    assert not torch.equal(split["target_ids"], plain["target_ids"])
    assert content_tokens(c, split) > content_tokens(c, plain)  # the same text, cut finer
    _, plain_later = rows(bpe_data, 0.0, step=1)
    assert texts(c, later) == texts(c, plain_later)


def test_by_default_the_responses_keep_their_segmentation(bpe_data):
    c, plain = rows(bpe_data, 0.0, strategy="bd3lm")
    _, split = rows(bpe_data, 1.0, strategy="bd3lm", responses=False)
    assert texts(c, split) == texts(c, plain)
    assert supervised(c, split) == supervised(c, plain)  # prompts cut finer, answers not
    assert content_tokens(c, split) > content_tokens(c, plain)


def test_a_fixed_row_length_bounds_the_growth(bpe_data):
    c, batch = rows(bpe_data, 1.0)  # mdlm pads every row to the longest training example
    assert c.collator.pad_to == int(c.train_set.lengths.max())
    assert batch["input_ids"].shape[1] == c.collator.pad_to


def test_the_byte_tokenizer_is_refused_by_name():
    with pytest.raises(ConfigError, match="data.split_tokens=0.1 would do nothing.*byte"):
        build_components(config("data.split_tokens=0.1"), CPU)


def test_a_run_trains_and_validates_with_split_tokens(tmp_path, bpe_data):
    run_dir = tmp_path / "run"
    main(cli_args(run_dir, *bpe(bpe_data, "data.split_tokens=0.3"), "train.steps=3",
                  "train.val_every=3", strategy="bd3lm"))
    assert [r["step"] for r in records(run_dir)] == [1, 2, 3]
    assert all(math.isfinite(r["loss"]) for r in records(run_dir))
    assert math.isfinite(records(run_dir, "validation")[0]["loss"])
